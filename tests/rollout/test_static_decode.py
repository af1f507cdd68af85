"""The static-cache decoder (grpo.rollout.static_decode) against HF ``generate`` on the tiny model.

Runs on CPU: the same decode step that a GPU captures as a CUDA graph runs eagerly here (graph capture
needs CUDA; the bench checks the captured path against ``generate`` on the H200, bench/gpu_bench.py).
The module runs twice: with the PyTorch attention a CPU uses, and under Triton's interpreter with the
Triton decode-attention kernel a GPU uses (``test_every_test_again_with_the_triton_attention``).
"""
from __future__ import annotations

import copy
import importlib.util
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo.model.loading import load_policy_model
from grpo.model.lora import inject_lora, lora_disabled, lora_modules
from grpo.prompts import PromptStyle, build_prompt
from grpo.rollout.base import SamplingParams
from grpo.rollout.native import NativeEngine
from grpo.rollout.static_decode import StaticDecoder
from tests.kernels.interpreter import run_under_interpreter

QUESTIONS = ["What is 15 + 27?", "Natalia sold clips to 48 of her friends in April. How many?", "2 + 2?"]
MAX_NEW = 10


def test_every_test_again_with_the_triton_attention():
    run_under_interpreter(__file__, passed=17)


def test_the_attention_is_triton_exactly_where_triton_runs(model):
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    decoder = StaticDecoder(model)
    assert decoder.fused == (interpreting and importlib.util.find_spec("triton") is not None)
    assert decoder.triton_kernels == decoder.fused  # the dense gate/up + SwiGLU, split-K and sampler kernels too


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the sampler's Triton kernel runs on a GPU or under the interpreter (this module's rerun)")
def test_the_sampler_kernel_draws_the_pytorch_samplers_tokens(tiny_model_dir, tokenizer, prompts):
    """At a plain temperature the decoder's steps draw with grpo/kernels/keyed_sample.py; the same seeded
    samples as the PyTorch sampler (``triton_kernels=False``), two temperatures, several samples a prompt."""
    device = "cuda" if torch.cuda.is_available() else "cpu"  # on a GPU: compiled and captured, as in training
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval().to(device)
    for temperature in (1.0, 0.7):
        params = SamplingParams(n=2, temperature=temperature, max_new_tokens=MAX_NEW, seed=11)
        runs = [_ids(NativeEngine(model, tokenizer, batch_size=3, backend="static",
                                  decoder=StaticDecoder(model, triton_kernels=kernel)), prompts, params)
                for kernel in (True, False)]
        assert runs[0] == runs[1]
        assert len({tuple(ids) for group in runs[0] for ids in group}) == 2 * len(prompts)  # sampled, not greedy


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[str]:
    texts = [build_prompt(tokenizer, q, PromptStyle("r1")) for q in QUESTIONS]
    assert len({len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts}) == 3  # left pads
    return texts


def _with_lora(model: torch.nn.Module, seed: int = 0,
               targets: tuple[str, ...] = ("q_proj", "v_proj", "o_proj", "down_proj")) -> torch.nn.Module:
    inject_lora(model, targets=list(targets), r=4, alpha=8, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    for m in lora_modules(model).values():
        with torch.no_grad():  # B large enough that the adapter changes greedy choices
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=gen) * 0.5)
    return model.eval()


def _ids(engine: NativeEngine, prompts: list[str], params: SamplingParams) -> list[list[list[int]]]:
    return [[c.token_ids for c in g] for g in engine.generate(prompts, params)]


@pytest.mark.parametrize("merge", [True, False])
def test_greedy_matches_generate_with_lora_and_left_padding(tiny_model_dir, tokenizer, prompts, merge):
    model = _with_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32))
    params = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    hf = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    fast = NativeEngine(model, tokenizer, batch_size=3, backend="static", merge_lora=merge)
    assert _ids(fast, prompts, params) == hf
    # the adapter changes: the next call must see it (merged layers are refolded)
    for m in lora_modules(model).values():
        torch.nn.init.zeros_(m.lora_B)
    bare = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    assert bare != hf
    assert _ids(fast, prompts, params) == bare


def test_greedy_matches_generate_past_one_block_of_cache(tiny_model_dir, tokenizer, prompts):
    """Long enough that the cache spans more than one of the Triton kernel's blocks: where the kernel runs
    (this module's rerun under the interpreter, a GPU) each slot's cache is read in shares by separate
    programs and their outputs combined (grpo.kernels.decode_attention.cache_splits)."""
    from grpo.kernels.decode_attention import BLOCK_L

    model = _with_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32))
    params = SamplingParams(temperature=0, max_new_tokens=100)
    hf = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    width = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    assert width + max(len(ids) for group in hf for ids in group) > BLOCK_L + 1  # a cursor in the second block
    assert _ids(NativeEngine(model, tokenizer, batch_size=3, backend="static"), prompts, params) == hf


@pytest.mark.parametrize("merge", [True, False])
def test_mlp_only_lora_is_decoded(tiny_model_dir, tokenizer, prompts, merge):
    """LoRA on the MLP alone must change the static decoder's tokens exactly as it changes generate's
    (the decoder once folded in q/k/v/o adapters only and decoded the bare MLP)."""
    model = _with_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                       targets=("gate_proj", "up_proj", "down_proj"))
    params = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    hf = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    with lora_disabled(model):
        bare = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    assert hf != bare
    assert _ids(NativeEngine(model, tokenizer, batch_size=3, backend="static", merge_lora=merge), prompts, params) == hf


def test_more_rows_than_the_split_kernel_takes_decode_what_generate_does(tiny_model_dir, tokenizer, prompts):
    """18 rows in flight, above ``decode_linear.MAX_ROWS``: where Triton runs (this module's rerun under the
    interpreter) the MLP's down projection leaves its K parts' sums for the next layer's residual add
    (``decode_linear.down_projection``, ``static_layers.residual``); greedy, the same tokens as ``generate``."""
    from grpo.kernels.decode_linear import MAX_ROWS
    from grpo.rollout.static_layers import DenseMlp

    model = _with_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                       targets=("gate_proj", "up_proj", "down_proj"))
    params = SamplingParams(n=6, temperature=0, max_new_tokens=MAX_NEW)
    assert params.n * len(prompts) > MAX_ROWS
    hf = _ids(NativeEngine(model, tokenizer, batch_size=18, backend="hf"), prompts, params)
    fast = NativeEngine(model, tokenizer, batch_size=18, backend="static", release_dense=False)
    assert _ids(fast, prompts, params) == hf
    mlps = [w2[-1] for _, w2 in fast._decoder.weights]
    assert mlps and all(isinstance(m, DenseMlp) for m in mlps) == (os.environ.get("TRITON_INTERPRET") == "1")


def test_stop_tokens_padding_and_finish_reasons(tiny_model_dir, tokenizer, prompts):
    """Swap two lm_head rows so prompt 0 emits <|im_end|> early: the row stops, keeps the stop id, and
    later steps write pads that make_completion drops; other rows run to the length limit."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    params = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    first = NativeEngine(model, tokenizer, batch_size=3, backend="hf").generate(prompts, params)[0][0].token_ids
    k = next(i for i in range(2, MAX_NEW) if first[i] not in first[:i])
    swapped = copy.deepcopy(model)
    with torch.no_grad():
        w = swapped.lm_head.weight
        w[[end_id, first[k]]] = w[[first[k], end_id]]
    hf = NativeEngine(swapped, tokenizer, batch_size=3, backend="hf").generate(prompts, params)
    fast = NativeEngine(swapped, tokenizer, batch_size=3, backend="static").generate(prompts, params)
    assert [(c.token_ids, c.finish_reason, c.text) for g in fast for c in g] == \
           [(c.token_ids, c.finish_reason, c.text) for g in hf for c in g]
    assert fast[0][0].finish_reason == "stop" and fast[0][0].token_ids[-1] == end_id


def test_nf4_base_uses_the_dense_copy_and_frees_it(tiny_model_dir, tokenizer, prompts):
    model = load_policy_model(tiny_model_dir, quantization="nf4", compute_dtype="float32", device="cpu",
                              gradient_checkpointing=False)
    model = _with_lora(model)
    params = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    hf = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    fast = NativeEngine(model, tokenizer, batch_size=3, backend="static")
    assert _ids(fast, prompts, params) == hf
    # released after the call (training does not carry the copy), rebuilt by the next call
    assert not any(hasattr(m, "_dense_weight") for m in model.modules()) and fast._decoder.weights == []
    assert _ids(fast, prompts, params) == hf
    kept = NativeEngine(model, tokenizer, batch_size=3, backend="static", release_dense=False)
    assert _ids(kept, prompts, params) == hf and kept._decoder.weights


def test_kept_dense_copies_are_read_and_outlive_the_call(tiny_model_dir, tokenizer, prompts):
    """``keep_dense`` (train.dense_training): the decoder reads the copies of the 4-bit layers no adapter wraps
    from the model (gate and up as one joined copy) and leaves them there after the call, for training; its
    tokens are generate's, also after the adapter changes (the refresh merges the new LoRA over the same kept
    copies, none made again)."""
    from grpo.model.dequant import adapter_free, linear4bit_modules

    device = "cuda" if torch.cuda.is_available() else "cpu"  # on a GPU: compiled and captured, as in training
    model = _with_lora(load_policy_model(tiny_model_dir, quantization="nf4", compute_dtype="float32", device=device,
                                         gradient_checkpointing=False), targets=("q_proj", "v_proj", "o_proj"))
    params = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    fast = NativeEngine(model, tokenizer, batch_size=3, backend="static", keep_dense=True)
    before = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    assert _ids(fast, prompts, params) == before
    free = adapter_free(model)
    assert free and all(hasattr(m, "_dense_weight") == (m in free) for m in linear4bit_modules(model))
    assert fast._decoder.weights == []  # the decoder's own copies (q/k/v, the merged o) are released
    mlp = model.model.layers[0].mlp
    assert mlp.gate_proj._dense_weight._base is mlp.up_proj._dense_weight._base is not None
    kept = [m._dense_weight for m in free]
    for m in lora_modules(model).values():
        with torch.no_grad():
            m.lora_B.mul_(-1)
    hf = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    assert hf != before and _ids(fast, prompts, params) == hf
    assert all(m._dense_weight is k for m, k in zip(free, kept))


def test_a_4bit_mlp_read_in_4_bits_decodes_what_generate_does(tiny_model_dir, tokenizer, prompts, caplog):
    """``read_4bit_mlp``: where Triton runs (here: its interpreter) the MLP of a 4-bit base without LoRA is
    read by the 4-bit kernels, not copied, and the tokens are still generate's; an MLP with LoRA is
    copied and merged as before; where Triton cannot run, or a dense copy is kept (``keep_dense``), the
    decoder says so and reads a dense copy."""
    from grpo.rollout.static_layers import DenseMlp, Mlp4bit

    def nf4_with_lora(targets: tuple[str, ...]) -> torch.nn.Module:
        return _with_lora(load_policy_model(tiny_model_dir, quantization="nf4", compute_dtype="float32",
                                            device="cpu", gradient_checkpointing=False), targets=targets)

    model = nf4_with_lora(("q_proj", "v_proj", "o_proj"))
    params = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    hf = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    fast = NativeEngine(model, tokenizer, batch_size=3, backend="static", read_4bit_mlp=True, release_dense=False)
    assert _ids(fast, prompts, params) == hf
    four_bit = [isinstance(w2[-1], Mlp4bit) for _, w2 in fast._decoder.weights]
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert fast._decoder.read_4bit_mlp and all(four_bit)
        sampled = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW, seed=3)
        copied = NativeEngine(model, tokenizer, batch_size=3, backend="static")
        assert _ids(fast, prompts, sampled) == _ids(copied, prompts, sampled)
        # LoRA on the MLP: merged into a dense copy, as without the flag
        merged = nf4_with_lora(("o_proj", "down_proj"))
        with_mlp_lora = NativeEngine(merged, tokenizer, batch_size=3, backend="static", read_4bit_mlp=True,
                                     release_dense=False)
        assert _ids(with_mlp_lora, prompts, params) == _ids(NativeEngine(merged, tokenizer, batch_size=3,
                                                                        backend="hf"), prompts, params)
        assert not any(isinstance(w2[-1], Mlp4bit) for _, w2 in with_mlp_lora._decoder.weights)
        # ... and a decode step's gate, up and SwiGLU over that copy are the fused dense kernel
        assert all(isinstance(w2[-1], DenseMlp) for _, w2 in with_mlp_lora._decoder.weights)
        # with kept dense copies (train.dense_training) the MLP is read from them, not in 4 bits, and said so
        both = NativeEngine(model, tokenizer, batch_size=3, backend="static", read_4bit_mlp=True, keep_dense=True,
                            release_dense=False)
        assert _ids(both, prompts, params) == hf
        assert not both._decoder.read_4bit_mlp and "decoding from a dense copy instead" in caplog.text
        assert all(isinstance(w2[-1], DenseMlp) for _, w2 in both._decoder.weights)
        mlp = model.model.layers[0].mlp
        assert mlp.gate_proj._dense_weight._base is mlp.up_proj._dense_weight._base is not None
    else:
        assert not fast._decoder.read_4bit_mlp and not any(four_bit)
        assert "decoding from a dense copy instead" in caplog.text


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                    reason="inductor's CPU code once, not again under the interpreter")
def test_compiled_step_decodes_the_eager_steps_tokens(tiny_model_dir, tokenizer, prompts):
    """The parts a GPU compiles (layer parts, embedding and RoPE, final norm + LM head + sampler, the
    in-place bookkeeping), compiled by inductor for this CPU with the decoder's options (``compile_options``:
    programmatic dependent launch, which inductor emits only on Hopper and newer): the same tokens and stops as
    the eager step, greedy and sampled (the GPU tests above check only greedy decoding through them)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    greedy = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    first = NativeEngine(model, tokenizer, batch_size=3, backend="hf").generate(prompts, greedy)[0][0].token_ids
    with torch.no_grad():  # prompt 0 ends early (test_stop_tokens_padding_and_finish_reasons' swap)
        w = model.lm_head.weight
        w[[end_id, first[2]]] = w[[first[2], end_id]]
    runs = {}
    for compiled in (False, True):
        decoder = StaticDecoder(model, compile=compiled, bucket=16, sync_every=4)
        engine = NativeEngine(model, tokenizer, batch_size=2, backend="static", decoder=decoder)
        runs[compiled] = [_ids(engine, prompts, greedy),
                          _ids(engine, prompts, SamplingParams(n=3, temperature=1.0, top_p=0.9, top_k=50,
                                                               max_new_tokens=MAX_NEW, seed=5))]
    assert runs[True] == runs[False]
    lengths = [len(ids) for run in runs[True] for group in run for ids in group]
    assert min(lengths) < MAX_NEW == max(lengths)  # some rows stopped early, some ran to the limit


def test_empty_prompt_is_a_clear_error(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with pytest.raises(ValueError, match="prompt 1 .* encodes to no tokens"):
        NativeEngine(model, tokenizer, batch_size=2).generate(["2 + 2?", ""], SamplingParams(max_new_tokens=2))


def test_sampling_is_seeded_and_respects_top_k(tiny_model_dir, tokenizer, prompts):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    engine = NativeEngine(model, tokenizer, batch_size=4, backend="static")
    params = SamplingParams(n=3, temperature=1.0, top_p=0.9, top_k=5, max_new_tokens=8, seed=3)
    first = _ids(engine, prompts, params)
    torch.manual_seed(999)
    assert _ids(engine, prompts, params) == first
    assert len({tuple(t) for t in first[0]}) > 1
    # every sampled token is among the 5 most likely at its step (teacher-forced check)
    for text, group in zip(prompts, first):
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for ids in group:
            with torch.no_grad():
                logits = model(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1:-1]
            top5 = logits.topk(5, -1).indices
            assert all(t in row for t, row in zip(ids, top5.tolist()))


def test_qwen3_query_and_key_norms(tmp_path, tokenizer, prompts):
    """Qwen3's per-head q/k RMSNorm (before RoPE) and its head_dim apart from hidden / heads."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                      tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).eval()
    for layer in model.model.layers:  # norms away from 1, so that a missing norm changes the tokens
        for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
            torch.nn.init.uniform_(norm.weight, 0.2, 3.0)
    model = _with_lora(model)
    params = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    hf = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    assert _ids(NativeEngine(model, tokenizer, batch_size=3, backend="static"), prompts, params) == hf


def test_decoder_buckets_cover_the_cache(tiny_model_dir, tokenizer, prompts):
    """Tiny buckets: every bucket boundary is crossed, and the result is still generate's."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    params = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    engine = NativeEngine(model, tokenizer, batch_size=3, backend="static",
                          decoder=StaticDecoder(model, bucket=3, sync_every=4))
    hf = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    assert _ids(engine, prompts, params) == hf


def test_unknown_backend_is_refused(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with pytest.raises(ValueError, match="backend"):
        NativeEngine(model, tokenizer, batch_size=1, backend="sglang")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU (the eager step is tested above)")
def test_cuda_graph_decode_matches_generate(tiny_model_dir, tokenizer, prompts):
    model = _with_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda())
    params = SamplingParams(temperature=0, max_new_tokens=40)
    hf = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    decoder = StaticDecoder(model, bucket=16, sync_every=8)
    engine = NativeEngine(model, tokenizer, batch_size=3, backend="static", decoder=decoder)
    assert decoder.cuda_graphs
    captured, capture = [], decoder._graph

    def counted(length: int):
        if decoder.graph_key(length) not in decoder._graphs:
            captured.append(length)
        return capture(length)

    decoder._graph = counted
    assert _ids(engine, prompts, params) == hf
    # 40 new tokens cross several 16-token buckets: the Triton attention needs one graph for all of them
    assert len(captured) == 1 if decoder.fused else len(captured) > 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
def test_a_later_call_captures_without_a_warm_up_and_decodes_the_new_adapter(tiny_model_dir, tokenizer, prompts):
    """A GRPO step's rollouts after the first: the adapter has changed, the weights are refreshed, and the step is
    captured at shapes this decoder has run, without a warm-up run; its tokens are ``generate``'s for the new
    adapter."""
    model = _with_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda())
    params = SamplingParams(temperature=0, max_new_tokens=40)
    decoder = StaticDecoder(model, bucket=16, sync_every=8)
    engine = NativeEngine(model, tokenizer, batch_size=3, backend="static", decoder=decoder)
    warm_ups, warm_up = [], decoder._warm_up

    def counted(length: int) -> None:
        warm_ups.append(length)
        warm_up(length)

    decoder._warm_up = counted
    first = _ids(engine, prompts, params)
    assert first == _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    first_call = len(warm_ups)  # one a graph: one for every cache length with the Triton attention
    assert first_call == len(decoder._warmed) >= 1
    for m in lora_modules(model).values():
        torch.nn.init.zeros_(m.lora_B)
    bare = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    assert bare != first
    assert _ids(engine, prompts, params) == bare
    assert len(warm_ups) == first_call


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
def test_recaptured_graphs_leave_no_memory_behind(tiny_model_dir, tokenizer, prompts):
    """Every generate call captures its graphs again; what the calls leave allocated must not grow with
    them. A new warm-up stream per capture left one cuBLAS workspace (32 MiB on Hopper) per stream, up to
    PyTorch's pool of 32 streams (pytorch/pytorch#99196; 0.9 GiB in an 8 GiB run, bench/RESULTS.md)."""
    model = _with_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda())
    engine = NativeEngine(model, tokenizer, batch_size=3, backend="static",
                          decoder=StaticDecoder(model, bucket=16, sync_every=8))
    params = SamplingParams(temperature=0, max_new_tokens=40)  # several cache lengths: several captures a call
    first = _ids(engine, prompts, params)
    held = torch.cuda.memory_allocated()
    for _ in range(3):
        assert _ids(engine, prompts, params) == first
    assert torch.cuda.memory_allocated() == held


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
def test_cuda_graph_decode_with_the_mlp_read_in_4_bits_matches_generate(tiny_model_dir, tokenizer, prompts):
    """The 4-bit MLP kernels inside captured decode steps (on the H100 the train stage's first capture with
    them failed, "operation failed due to a previous error during capture", where the eager tests passed)."""
    from grpo.rollout.static_layers import Mlp4bit

    model = _with_lora(load_policy_model(tiny_model_dir, quantization="nf4", compute_dtype="float32",
                                         device="cuda", gradient_checkpointing=False),
                       targets=("q_proj", "v_proj", "o_proj"))
    params = SamplingParams(temperature=0, max_new_tokens=40)
    hf = _ids(NativeEngine(model, tokenizer, batch_size=3, backend="hf"), prompts, params)
    decoder = StaticDecoder(model, bucket=16, sync_every=8, read_4bit_mlp=True)
    engine = NativeEngine(model, tokenizer, batch_size=3, backend="static", decoder=decoder, release_dense=False)
    assert decoder.cuda_graphs and decoder.read_4bit_mlp
    assert _ids(engine, prompts, params) == hf
    assert all(isinstance(w2[-1], Mlp4bit) for _, w2 in decoder.weights)
