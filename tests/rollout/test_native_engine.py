"""NativeEngine against first principles: a hand-written greedy loop, one-prompt-at-a-time generation,
the position ids the trainer assumes, seeds, EOS handling, and the 4-bit + LoRA training policy."""
from __future__ import annotations

import copy
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from grpo.model.adapter import LoraSettings, save_adapter
from grpo.model.loading import load_policy_model
from grpo.model.lora import inject_lora, lora_modules, lora_parameters
from grpo.prompts import PromptStyle, build_prompt
from grpo.rollout.base import SamplingParams, decode_texts, make_completions, stop_token_ids
from grpo.rollout.engines import make_engine
from grpo.rollout.native import NativeEngine

QUESTIONS = [
    "What is 15 + 27?",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "2 + 2?",
]
MAX_NEW = 12


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[str]:
    texts = [build_prompt(tokenizer, q, PromptStyle(style)) for q, style in zip(QUESTIONS, ["tagged", "r1", "r1"])]
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    assert len(set(lengths)) == len(lengths), "prompts must differ in length to exercise left padding"
    return texts


@pytest.fixture(scope="module")
def end_id(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids("<|im_end|>")


def greedy_reference(model, prompt_ids: list[int], stop_ids: set[int], max_new: int) -> list[int]:
    """Argmax of a full forward over the whole sequence, one token at a time: no cache, no padding."""
    ids, out = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(max_new):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
            if token in stop_ids:
                break
    return out


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def stop_model(model, tokenizer, prompts, end_id):
    """The tiny model with two lm_head rows swapped so that greedy decoding of prompt 0 emits
    ``<|im_end|>`` exactly where it used to emit a token ``t`` for the first time (step k >= 2).
    Returns (model, k): greedy on prompt 0 then yields the original first k tokens plus ``<|im_end|>``."""
    original = greedy_reference(model, encode(tokenizer, prompts[0]), set(), MAX_NEW)
    k = next(i for i in range(2, MAX_NEW) if original[i] not in original[:i] and original[i] != end_id)
    swapped = copy.deepcopy(model)
    with torch.no_grad():
        w = swapped.lm_head.weight
        w[[end_id, original[k]]] = w[[original[k], end_id]]
    return swapped, original[:k] + [end_id]


def test_greedy_equals_handwritten_loop_batched_and_left_padded(model, tokenizer, prompts):
    engine = NativeEngine(model, tokenizer, batch_size=len(prompts))  # one left-padded batch
    groups = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=MAX_NEW))
    stops = set(engine.stop_ids)
    for text, group in zip(prompts, groups):
        (c,) = group
        assert c.prompt_ids == encode(tokenizer, text)
        assert c.token_ids == greedy_reference(model, c.prompt_ids, stops, MAX_NEW)
        assert c.finish_reason == "length" and len(c.token_ids) == MAX_NEW
        assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)


def test_stops_at_chat_end_token_and_keeps_it(stop_model, tokenizer, prompts, end_id):
    swapped, expected = stop_model
    engine = NativeEngine(swapped, tokenizer, batch_size=len(prompts))
    assert end_id in engine.stop_ids
    groups = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=MAX_NEW))
    first = groups[0][0]
    assert first.token_ids == expected
    assert first.finish_reason == "stop"
    assert "<|im_end|>" not in first.text
    # Rows that stopped early are padded inside the batch; none of that padding may leak out.
    for text, group in zip(prompts, groups):
        c = group[0]
        assert c.token_ids == greedy_reference(swapped, c.prompt_ids, set(engine.stop_ids), MAX_NEW)
        assert (c.finish_reason == "stop") == (c.token_ids[-1] == end_id)
        assert end_id not in c.token_ids[:-1]


def test_batched_equals_one_prompt_at_a_time(stop_model, tokenizer, prompts):
    swapped, _ = stop_model
    params = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    batched = NativeEngine(swapped, tokenizer, batch_size=8).generate(prompts, params)
    single = NativeEngine(swapped, tokenizer, batch_size=1).generate(prompts, params)
    assert [[c.token_ids for c in g] for g in batched] == [[c.token_ids for c in g] for g in single]


def test_generate_uses_attention_mask_position_ids(model, tokenizer, prompts):
    """RoPE is shift-invariant, so equal outputs alone would not catch wrong positions on left-padded
    rows. Record what generate passes to forward: prompt positions must be ``cumsum(mask) - 1`` (pads
    0), as grpo.train.step builds them, and each decode step one more than the last."""
    seen: list[torch.Tensor] = []

    def record(_module, _args, kwargs):
        seen.append(kwargs["position_ids"].clone())

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        NativeEngine(model, tokenizer, batch_size=8).generate(prompts, SamplingParams(temperature=0, max_new_tokens=3))
    finally:
        handle.remove()
    lengths = torch.tensor([len(encode(tokenizer, p)) for p in prompts])
    width = int(lengths.max())
    mask = (torch.arange(width)[None, :] >= (width - lengths)[:, None]).long()
    assert torch.equal(seen[0], ((mask.cumsum(-1) - 1) * mask))
    for step, positions in enumerate(seen[1:], start=1):
        assert torch.equal(positions[:, -1], lengths - 1 + step)


def test_seeds_groups_and_temperature(model, tokenizer, prompts):
    engine = NativeEngine(model, tokenizer, batch_size=4)  # 3 prompts × n=3: batches cut across groups
    params = SamplingParams(n=3, temperature=1.0, top_p=0.95, top_k=50, max_new_tokens=8, seed=7)

    def ids(groups):
        return [[c.token_ids for c in g] for g in groups]

    first = engine.generate(prompts, params)
    assert [len(g) for g in first] == [3, 3, 3]
    assert all(c.prompt_ids == encode(tokenizer, p) for p, g in zip(prompts, first) for c in g)
    assert len({tuple(t) for t in ids(first)[1]}) > 1, "n samples of one prompt should differ"
    torch.manual_seed(12345)  # the global RNG state before the call must not matter
    assert ids(engine.generate(prompts, params)) == ids(first)
    other = engine.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=8, seed=8))
    assert ids(other) != ids(first)
    greedy = engine.generate(prompts, SamplingParams(n=2, temperature=0, max_new_tokens=8, seed=99))
    for group in greedy:
        assert group[0].token_ids == group[1].token_ids


def test_restores_training_mode(model, tokenizer, prompts):
    engine = NativeEngine(model, tokenizer, batch_size=4)
    model.train()
    try:
        engine.generate(prompts[:1], SamplingParams(max_new_tokens=2), progress=True)
        assert model.training
    finally:
        model.eval()
    engine.generate(prompts[:1], SamplingParams(max_new_tokens=2))
    assert not model.training


def test_stop_ids_include_generation_config_eos(tokenizer, end_id):
    config = GenerationConfig(eos_token_id=[end_id, 7])
    assert stop_token_ids(tokenizer, config) == [end_id, 7]
    assert stop_token_ids(tokenizer, None) == [end_id]


def test_completions_cut_at_the_first_stop_and_decode_as_decode_does(tokenizer, end_id):
    """make_completions against a hand cut and ``tokenizer.decode``, through both of decode_texts' ways:
    the Rust backend's batch (this tokenizer: no clean-up, no own decoding) and the per-sequence loop
    (the same tokenizer asked to clean up spaces)."""
    gen = torch.Generator().manual_seed(0)
    others = [i for i in tokenizer.all_special_ids if i != end_id]
    words = [[i for i in torch.randint(len(tokenizer), (n,), generator=gen).tolist() if i != end_id] + others
             for n in (5, 40)]
    samples = [[words[0], words[1] + [end_id, 7, end_id]], [[3, end_id, 4, end_id], []], [[end_id], others + [9]]]
    expected_cut = [[words[0], words[1] + [end_id]], [[3, end_id], []], [[end_id], others + [9]]]
    cleaning = copy.deepcopy(tokenizer)
    cleaning.clean_up_tokenization_spaces = True
    for tok in (tokenizer, cleaning):
        out = make_completions(tok, [[1], [2, 2], [3]], samples, [end_id])
        assert [[c.token_ids for c in g] for g in out] == expected_cut
        assert [[c.finish_reason for c in g] for g in out] == [["length", "stop"], ["stop", "length"],
                                                               ["stop", "length"]]
        assert [[c.text for c in g] for g in out] == [[tokenizer.decode(ids, skip_special_tokens=True)
                                                       for ids in g] for g in expected_cut]
        assert [c.prompt_ids for g in out for c in g] == [[1], [1], [2, 2], [2, 2], [3], [3]]
    flat = [ids for g in samples for ids in g]
    assert decode_texts(tokenizer, flat) == decode_texts(cleaning, flat) != [""] * len(flat)


def test_in_memory_engine_refuses_adapters(model, tokenizer, prompts, tmp_path):
    with pytest.raises(ValueError, match="cannot switch adapters"):
        NativeEngine(model, tokenizer, batch_size=1).generate(prompts[:1], SamplingParams(), adapter_dir=str(tmp_path))


def test_4bit_lora_policy_still_trains_after_generating(tiny_model_dir, tokenizer, prompts):
    """Training rollouts run the policy in eval mode without grad, where bitsandbytes would repack 4-bit
    weights on an AVX512-BF16 CPU and LoRA gradients would vanish (docs/ARCHITECTURE.md, "Facts
    measured"). After generating, a
    training forward/backward must still reach every LoRA parameter."""
    policy = load_policy_model(tiny_model_dir, quantization="nf4", compute_dtype="float32", device="cpu",
                               gradient_checkpointing=False)
    for module in policy.modules():  # as a fresh bitsandbytes layer has it on such a CPU
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = True
    inject_lora(policy, targets=["q_proj", "v_proj"], r=4, alpha=8)
    for m in lora_modules(policy).values():
        torch.nn.init.normal_(m.lora_B, std=0.02)
    policy.train()
    groups = NativeEngine(policy, tokenizer, batch_size=2).generate(prompts[:2], SamplingParams(n=2, max_new_tokens=4))
    assert policy.training and all(len(g) == 2 for g in groups)
    ids = torch.tensor([groups[0][0].prompt_ids + groups[0][0].token_ids])
    policy(ids).logits.float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_parameters(policy))


def test_from_pretrained_switches_adapters(tiny_model_dir, tokenizer, prompts, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    settings = LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj", "o_proj"))
    inject_lora(model, targets=list(settings.targets), r=settings.r, alpha=settings.alpha)
    torch.manual_seed(0)
    for m in lora_modules(model).values():
        torch.nn.init.normal_(m.lora_B, std=1.0)  # large enough to change greedy choices
    adapter = save_adapter(model, tmp_path / "adapter", base_model_name_or_path="tiny", lora_config=settings)
    params = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    with_lora = [g[0].token_ids for g in NativeEngine(model.eval(), tokenizer, batch_size=4).generate(prompts, params)]

    engine = make_engine("native", model_dir=tiny_model_dir, dtype="float32", batch_size=4)
    base = [g[0].token_ids for g in engine.generate(prompts, params)]
    assert [g[0].token_ids for g in engine.generate(prompts, params, adapter_dir=str(adapter))] == with_lora
    assert with_lora != base
    assert [g[0].token_ids for g in engine.generate(prompts, params)] == base
    engine.close()


def test_make_engine_rejects_unknown_kind(tiny_model_dir):
    with pytest.raises(ValueError, match="auto, vllm or native"):
        make_engine("sglang", model_dir=tiny_model_dir)


def test_auto_falls_back_to_native_without_vllm(tiny_model_dir, monkeypatch):
    monkeypatch.setattr("grpo.rollout.engines.vllm_importable", lambda: False)
    engine = make_engine("auto", model_dir=tiny_model_dir, dtype="float32", batch_size=2)
    assert isinstance(engine, NativeEngine) and engine.batch_size == 2


def test_engine_built_for_an_adapter_loads_the_base_once(tiny_model_dir, tokenizer, prompts, tmp_path, caplog):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    settings = LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj"))
    inject_lora(model, targets=list(settings.targets), r=settings.r, alpha=settings.alpha)
    torch.manual_seed(1)
    for m in lora_modules(model).values():
        torch.nn.init.normal_(m.lora_B, std=1.0)
    adapter = str(save_adapter(model, tmp_path / "adapter", base_model_name_or_path="tiny", lora_config=settings))
    params = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    expected = [g[0].token_ids for g in NativeEngine(model.eval(), tokenizer, batch_size=4).generate(prompts, params)]

    with caplog.at_level(logging.INFO, logger="grpo.model.loading"):  # the loader logs each load
        engine = make_engine("native", model_dir=tiny_model_dir, dtype="float32", batch_size=4, adapter_dir=adapter)
        assert [g[0].token_ids for g in engine.generate(prompts, params, adapter_dir=adapter)] == expected
    loads = [r for r in caplog.records if r.name == "grpo.model.loading" and r.getMessage().startswith("loaded ")]
    assert len(loads) == 1
    engine.close()
