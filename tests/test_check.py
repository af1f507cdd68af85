"""The system check's memory plan against a hand calculation, the architecture formulas against real
models (parameter counts, nf4 storage of a bitsandbytes-quantised model), and the CLI's fit/fail exits."""
from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest
import yaml

from bench.gpu_stages import run_peak_gib
from grpo.config import EvaluateParams, LoraParams, PrepareParams, ProtocolParams, TrainParams, load_params
from grpo.memory_plan import (CUDA_RUNTIME_BYTES, GENERATION_MARGIN, GIB, KNOWN_ARCHS, Arch, Phase, lora_params,
                              max_slots, plan_generation, plan_memory, resolve_arch, weight_bytes)
from grpo.stage_plans import SECTIONS, largest_fitting, plan_evaluate, plan_stages, with_param
from tests.conftest import ROOT

ARCH = Arch(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
PARAMS = TrainParams(quantization="nf4", dense_generation=True, lora=LoraParams(r=4, targets=["q_proj", "v_proj"]),
                     generation_batch_size=8, max_response_length=20, val_max_new_tokens=30, train_batch_size=2,
                     gradient_checkpointing=True, logprob_chunk_size=1024)


def train_plan(params: TrainParams = PARAMS, *, cuda: bool = False, prompt_tokens: int = 10) -> dict[str, Phase]:
    return {p.name: p for p in plan_memory(ARCH, params, compute_dtype="bfloat16", prompt_tokens=prompt_tokens, cuda=cuda)}


def test_train_plan_matches_a_hand_calculation():
    plan = train_plan()
    gen, train = plan["generation"], plan["training"]
    # linear weights per layer: q 64*64 + k 64*32 + v 64*32 + o 64*64 + gate/up/down 3 * 64*128 = 36864; 2 layers
    # nf4: 73728 * (0.5 + 1/64 + 4/16384) = 36864 + 1152 + 18 bytes; embeddings + LM head 2 * 1000*64 * 2 bytes
    assert gen.row("base_weights") == train.row("base_weights") == 38034 + 256000
    assert gen.row("dense_copy") == 73728 * 2
    # LoRA r4: q 4*(64+64) + v 4*(64+32) = 896 a layer, 2 layers, 16 bytes each (fp32 param, grad, Adam m and v)
    assert gen.row("lora_and_optimizer") == 1792 * 16
    # KV: 8 sequences * (10 prompt + max(20, 30) tokens) * (2 (k,v) * 2 layers * 2 kv heads * 16 dims * 2 bytes)
    assert gen.row("kv_cache") == 8 * 40 * 256
    # sampling at temperature 1, no top-k/top-p: bf16 logits, fp32 copy, tempered, probabilities, noise, quotient
    assert gen.row("decode_step") == 8 * 1000 * (2 + 4 + 4 * 4)
    # prefill: 8 sequences * 10 prompt tokens * 3 MLP intermediates of 128 * 2 bytes (HF generate: SDPA attention)
    assert gen.row("prefill") == 80 * 3 * 128 * 2
    # 2 sequences * 30 tokens = 60: layer inputs 2 layers * 60 * 64 * 2 bytes, plus twice one layer's live set
    # (backward: the recomputed layer and its gradients), 60 * ((2*64 + 2*64 + 2*32 + 3*128) * 2 + (64 + 64) * 4)
    assert train.row("activations") == 15360 + 2 * 60 * (1408 + 512)
    assert train.row("logprob_logits") == 3 * 60 * 1000 * 4  # 60 tokens < chunk 1024; three fp32 buffers off CUDA
    assert gen.row("decoder_copy") == gen.row("runtime") == 0
    assert "activations" not in dict(gen.rows) and "kv_cache" not in dict(train.rows)
    assert gen.peak == 294034 + 147456 + 28672 + 81920 + 176000 + 61440
    assert train.peak == 294034 + 147456 + 28672 + 245760 + 720000
    assert (gen.knob, train.knob) == ("train.generation_batch_size", "train.train_batch_size")


def test_cuda_plan_has_the_static_decoder_and_the_fused_logprob_kernel():
    plan = train_plan(cuda=True)
    gen = plan["generation"]
    # the static decoder de-quantises every linear weight once (73728 * 2 bytes), q/k/v and gate/up straight
    # into their concatenations, LoRA merged into those copies
    assert gen.row("decoder_copy") == 73728 * 2
    assert gen.row("dense_copy") == 0  # generate's cached copy is not used, and the decoder frees its own
    assert gen.row("kv_cache") == 8 * 128 * 256  # 40 tokens, the static cache rounded up to its 128-token bucket
    # the Triton kernel keeps a decode step's attention scores in registers (head_dim 16 is a power of two);
    # at most, each of the cache's 128 / 32 blocks of its leanest launch is a share: fp32 outputs + (max, sum)
    assert gen.row("decode_step") == 8 * 1000 * 22 + 8 * 4 * (128 // 32) * (16 + 2) * 4
    assert gen.row("prefill") == 80 * (3 * 128 * 2 + 10 * 4 * (8 + 2))  # and scores over the 10-token prompt
    assert plan["training"].row("logprob_logits") == 60 * 1000 * 2  # one bf16 buffer in the Triton kernel
    with_o = train_plan(dataclasses.replace(PARAMS, lora=LoraParams(r=4, targets=["q_proj", "o_proj"])), cuda=True)
    assert with_o["generation"].row("decoder_copy") == gen.row("decoder_copy")  # o merged into its copy
    hf = train_plan(dataclasses.replace(PARAMS, generation_backend="hf", logprob_backend="torch"), cuda=True)
    assert hf["generation"].row("decoder_copy") == 0 and hf["generation"].row("dense_copy") == 73728 * 2
    assert hf["training"].row("logprob_logits") == 3 * 60 * 1000 * 4


def test_dense_training_keeps_a_copy_of_the_layers_without_an_adapter():
    """train.dense_training: a copy of the 4-bit layers no adapter wraps (k, o, gate, up, down: 30720 weights a
    layer, 2 layers, 2 bytes), kept for the run, so resident in both phases; the static decoder reads it and
    copies only q/k/v (concatenated: 8192 a layer, k's a second time) and the adapter layers; on a CPU with
    dense_generation the cached copy of every layer is reused and counted once."""
    dense = dataclasses.replace(PARAMS, dense_training=True)
    cpu, gpu = train_plan(dense), train_plan(dense, cuda=True)
    assert cpu["training"].row("dense_copy") == cpu["generation"].row("dense_copy") == 73728 * 2
    assert cpu["training"].peak == train_plan()["training"].peak
    kept = 61440 * 2
    assert gpu["training"].row("dense_copy") == gpu["generation"].row("dense_copy") == kept
    assert gpu["generation"].row("decoder_copy") == 2 * 8192 * 2
    assert gpu["training"].peak == train_plan(cuda=True)["training"].peak + kept
    assert gpu["generation"].peak == train_plan(cuda=True)["generation"].peak + 2 * 2048 * 2  # k's copy twice
    four_bit_mlp = train_plan(dataclasses.replace(dense, generation_mlp_4bit=True), cuda=True)
    assert four_bit_mlp["generation"].rows == gpu["generation"].rows  # the decoder reads the kept copy instead
    merged_o = train_plan(dataclasses.replace(dense, lora=LoraParams(r=4, targets=["q_proj", "o_proj"])), cuda=True)
    # o's adapter: o is de-quantised and merged for the decoder, and v joins the kept layers
    assert merged_o["generation"].row("decoder_copy") == 2 * (8192 + 4096) * 2
    assert merged_o["training"].row("dense_copy") == 2 * (36864 - 4096 - 4096) * 2
    no_cache = train_plan(dataclasses.replace(dense, dense_generation=False))
    assert no_cache["training"].row("dense_copy") == no_cache["generation"].row("dense_copy") == kept


def r1_preset_plan(micro_batch: int, prompt_tokens: int, **train) -> list[Phase]:
    """The plan's (generation, training) phases at the 8 GB preset's shape on CUDA: R1-Distill-1.5B, nf4, LoRA
    r16, 64 x 768-token rollouts at temperature 0.7, micro-batches of ``micro_batch``."""
    params = TrainParams(quantization="nf4", lora=LoraParams(r=16, alpha=32), generation_batch_size=64,
                         max_response_length=768, train_batch_size=micro_batch, temperature=0.7, **train)
    return plan_memory(resolve_arch("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"), params, compute_dtype="bfloat16",
                       prompt_tokens=prompt_tokens, cuda=True)


@pytest.mark.parametrize("measured", ["gpu_step_triton_lora-torch.json", "gpu_step_triton_mb8.json",
                                      "gpu_step_triton_mb16_lora-torch.json",
                                      "decode_h100/gpu_step_triton_preset_train_mb16_gen_seqs64.json"])
def test_plan_bounds_the_peaks_measured_on_the_h200(measured):
    """bench/gpu_bench.py step recorded allocator peaks of a real GRPO step at the 8 GB preset's shape
    (R1-Distill-1.5B, nf4, LoRA r16, 64 x 768-token rollouts, micro-batches of 4/8/16; on the H200, and on
    an H100 with the Triton decode attention): the plan must not promise less, and may over-estimate by at
    most its runtime allowance (CUDA context, workspaces) + 0.6 GiB."""
    record = json.loads((ROOT / "bench" / "results" / measured).read_text())["triton_step1"]
    generation, training = r1_preset_plan(int(record["micro_batch"]["train"]), record["prompt_tokens"])
    for phase, plan in (("generate", generation), ("train", training)):
        measured_bytes = record[f"{phase}_peak_GiB"] * GIB
        assert measured_bytes <= plan.peak <= measured_bytes + plan.row("runtime") + 0.6 * GIB, (phase, plan.peak / GIB)


def _tune_trials(budget: str, checkpointing: bool) -> dict[int, dict]:
    """grpo.tune's trials on an H100 (bench/results/gpu_tune/, 2026-12-05/06), by micro-batch."""
    cache = ROOT / f"bench/results/gpu_tune/gpu-stages-model-nvidia-h100-80gb-hbm3--cuda-13.0-{budget}gib.json"
    trials = ((json.loads(key)[2], rec) for key, rec in json.loads(cache.read_text()).items())
    return {s["train.train_batch_size"]: rec for s, rec in trials if s["train.gradient_checkpointing"] == checkpointing}


def test_without_checkpointing_the_plan_bounds_what_the_h100_measured():
    """grpo.tune on an H100 ran the preset without gradient checkpointing at the largest micro-batch the plan
    then passed: under 7.5 GiB, 2 sequences ran with a training peak of 6.85 GiB (the old plan's own rows
    said 6.29); under 23.5 GiB, 9 sequences (planned 22.59 GiB) ran out of memory, and the engine went on at 4.
    The plan must cover the first and refuse the second (119-token prompts, the trials')."""
    def training(micro_batch: int) -> Phase:
        return r1_preset_plan(micro_batch, 119, gradient_checkpointing=False)[1]

    ran = _tune_trials("7.5", checkpointing=False)[2]
    assert ran["status"] == "ok"
    measured = ran["figures"]["peak_gib"]["train"] * GIB
    plan = training(2)
    assert measured <= plan.peak - plan.row("runtime") <= measured + 0.6 * GIB
    assert _tune_trials("23.5", checkpointing=False)[9]["status"] == "oom"
    assert training(9).peak > 23.5 * GIB >= training(4).peak


def test_compiled_layers_plan_bounds_what_the_h100_measured():
    """train.compile_layers under gradient checkpointing: grpo.tune's trial of the shipped preset on an H100
    (micro-batches of 16, 119-token prompts, under 7.5 GiB) peaked at 4.27 GiB in training, where the eager layers'
    rule (twice a layer's live set in backward) planned 5.45: the compiled plan must cover the measured peak and
    stay within 0.6 GiB of it; eager layers keep their plan."""
    cache = ROOT / "bench/results/gpu_tune/gpu-stages-model-nvidia-h100-80gb-hbm3--cuda-13.0-7.5gib.json"
    trials = [(json.loads(key)[2], rec) for key, rec in json.loads(cache.read_text()).items()]
    compiled = [rec for s, rec in trials if s["train.compile_layers"] and s["train.train_batch_size"] == 16
                and s["train.gradient_checkpointing"] and not s["train.dense_training"]]
    assert compiled and all(rec["status"] == "ok" for rec in compiled)
    plan = r1_preset_plan(16, 119, compile_layers=True)[1]
    for rec in compiled:
        measured = rec["figures"]["peak_gib"]["train"] * GIB
        assert measured <= plan.peak - plan.row("runtime") <= measured + 0.6 * GIB
    eager = r1_preset_plan(16, 119)[1]
    assert eager.row("activations") > plan.row("activations")
    assert [r for r in eager.rows if r[0] != "activations"] == [r for r in plan.rows if r[0] != "activations"]


def test_options_change_only_their_component():
    base = train_plan()
    no_ckpt = train_plan(dataclasses.replace(PARAMS, gradient_checkpointing=False))
    # every layer's saved set, per token: MLP 3 * 128 * 2, LoRA inputs (64 + 64) * 4 and rank-4 outputs 2 * 4 * 4,
    # norms' fp32 inputs 2 * 64 * 4, SDPA's q/k/v/out 4 * 64 * 2 and lse 4 * 4, a mask row of 30 tokens * 2;
    # then one layer's gradients (the live set above)
    saved = 768 + 512 + 32 + 512 + 512 + 16 + 60
    assert no_ckpt["training"].row("activations") == 2 * 60 * saved + 60 * (1408 + 512)
    assert no_ckpt["training"].row("base_weights") == base["training"].row("base_weights")
    plain = train_plan(dataclasses.replace(PARAMS, quantization="none"), cuda=True)["generation"]
    assert plain.row("base_weights") == (73728 + 128000) * 2 and plain.row("dense_copy") == 0 and plain.row("runtime") > 0
    # unquantised: the decoder copies only the concatenated q/k/v (and merged LoRA layers), not the MLP
    assert plain.row("decoder_copy") == 2 * 8192 * 2


def test_decoder_rows_follow_what_the_decoder_copies_and_computes():
    """Unquantised: gate and up are copied together once either carries LoRA (one concatenated matmul);
    a head layout the Triton decode-attention kernel cannot take (head_dim 48) brings back the decode
    step's explicit attention scores (4 heads x 128 cached positions x 10 bytes)."""
    shape = dict(dtype="bfloat16", quantised=False, sequences=2, prompt_tokens=10, new_tokens=100, static_decoder=True)
    assert plan_generation(ARCH, **shape)["decoder_copy"] == 2 * 8192 * 2  # q/k/v only
    gate = plan_generation(ARCH, lora_targets=("gate_proj",), **shape)
    assert gate["decoder_copy"] == 2 * (8192 + 2 * 64 * 128) * 2
    fused = plan_generation(ARCH, **shape)["decode_step"]
    assert fused == 2 * 1000 * 22 + 2 * 4 * (128 // 32) * (16 + 2) * 4  # logits; the shares' partial outputs
    explicit = plan_generation(dataclasses.replace(ARCH, head_dim=48), **shape)["decode_step"]
    assert explicit == 2 * 1000 * 22 + 2 * 128 * 4 * 10


def test_a_4bit_mlp_read_in_4_bits_is_not_copied():
    """``read_4bit_mlp`` at the R1-Distill-1.5B shape, by hand: the decoder copies q/k/v and o only (28 x
    5,505,024 bf16 values) and keeps an fp32 absmax a block of 64 MLP values (28 x 41,287,680 / 64 x 4
    bytes); a prompt's pass de-quantises one layer's MLP (41,287,680 bf16 values); a decode step adds the fused
    gate/up kernel's fp32 partial sums (64 rows split into 3 K ranges by matmul_4bit.LAUNCHES: 3 x 2 x 64 x
    8,960 x 4 bytes; down's 11 x 64 x 1,536 x 4 are fewer). With LoRA on the MLP it is copied and merged as
    before."""
    r1 = KNOWN_ARCHS["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"]
    shape = dict(dtype="bfloat16", quantised=True, sequences=64, prompt_tokens=119, new_tokens=768,
                 static_decoder=True, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    copied, read = plan_generation(r1, **shape), plan_generation(r1, read_4bit_mlp=True, **shape)
    assert copied["decoder_copy"] == 28 * 46_792_704 * 2
    assert read["decoder_copy"] == 28 * 5_505_024 * 2 + 28 * 41_287_680 // 64 * 4 == 380_534_784
    assert read["prefill"] == copied["prefill"] + 41_287_680 * 2
    assert read["kv_cache"] == copied["kv_cache"]
    assert read["decode_step"] == copied["decode_step"] + 3 * 2 * 64 * 8960 * 4
    mlp_lora = dict(shape, lora_targets=("q_proj", "down_proj"))
    assert plan_generation(r1, read_4bit_mlp=True, **mlp_lora) == plan_generation(r1, **mlp_lora)
    # an unquantised base has no 4-bit MLP to read: the train stage's plan ignores the flag, as the decoder does
    bf16 = dataclasses.replace(PARAMS, quantization="none")
    assert train_plan(dataclasses.replace(bf16, generation_mlp_4bit=True), cuda=True) == train_plan(bf16, cuda=True)


def test_arch_counts_match_a_real_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from grpo.model.lora import inject_lora, lora_parameters

    arch = Arch.from_config(json.loads((tiny_model_dir / "config.json").read_text()))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    weights = sum(p.numel() for n, p in model.named_parameters() if n.endswith("proj.weight"))
    embeddings = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" in n or "lm_head" in n)
    assert arch.linear_params == weights and arch.embedding_params == embeddings
    inject_lora(model, targets=["q_proj", "v_proj", "down_proj"], r=8, alpha=16)
    assert lora_params(arch, 8, ["q_proj", "v_proj", "down_proj"]) == sum(p.numel() for p in lora_parameters(model))


def test_nf4_bytes_match_bitsandbytes_storage(tiny_model_dir):
    """Real bitsandbytes nf4 on CPU: packed weights + absmax (8-bit, double-quantised) + second-level absmax."""
    import bitsandbytes as bnb

    from grpo.model.loading import load_policy_model

    arch = Arch.from_config(json.loads((tiny_model_dir / "config.json").read_text()))
    model = load_policy_model(tiny_model_dir, quantization="nf4", compute_dtype="float32", device="cpu",
                              gradient_checkpointing=False)
    stored = 0
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            qs = m.weight.quant_state
            stored += m.weight.numel() * m.weight.element_size() + qs.absmax.numel() * qs.absmax.element_size()
            stored += qs.state2.absmax.numel() * qs.state2.absmax.element_size()
    embeddings = arch.embedding_params * 4
    assert weight_bytes(arch, "float32", quantised=True) - embeddings == pytest.approx(stored, rel=0.01)


def test_resolve_arch_reads_a_local_folder_and_refuses_an_unknown_hub_id(tiny_model_dir, tmp_path):
    assert resolve_arch(str(tiny_model_dir), base_dir=tmp_path).hidden_size == 128
    assert resolve_arch("meta-llama/Llama-3.1-8B-Instruct", base_dir=tmp_path).num_hidden_layers == 32
    with pytest.raises(ValueError, match="architecture unknown"):
        resolve_arch("someone/unknown-model", base_dir=tmp_path)


def test_evaluate_plan_matches_a_hand_calculation():
    """evaluate final on a sampled benchmark (n 2, top-p 0.95), bf16, CUDA: the unquantised base, the
    loaded adapter, the static decoder's q/k/v (+ merged o_proj) copy, 6 slots' cache and buffers."""
    ev = EvaluateParams(dtype="bfloat16", batch_size=6, benchmarks={
        "aime24": ProtocolParams(n=2, temperature=0.6, top_p=0.95, max_new_tokens=100)})
    adapter = LoraParams(r=4, targets=["q_proj", "o_proj"])
    plan = plan_evaluate(ARCH, ev, "aime24", "final", adapter=adapter, prep=PrepareParams(), cuda=True, prompt_tokens=10)
    assert plan.row("base_weights") == (73728 + 128000) * 2
    assert plan.row("adapter") == 2 * 4 * (64 + 64 + 64 + 64) * 4  # 2 layers, r4 on q and o, fp32
    assert plan.row("runtime") == CUDA_RUNTIME_BYTES
    assert plan.row("decoder_copy") == 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64) * 2  # q/k/v concatenated, o merged
    assert plan.row("kv_cache") == 6 * 128 * 256  # 10 + 100 tokens, bucketed to 128; 256 bytes a token
    # top-p sampling: bf16 + fp32 logits, 4 fp32 sampling buffers, sorted fp32 + int64 order + 2 fp32 + 2 masks
    # + a masked copy = 48 bytes per vocabulary entry (the Triton kernel keeps attention scores in registers,
    # and a share's partial output a block of 32 cached positions at most: fp32, 16 dims + max + sum)
    assert plan.row("decode_step") == 6 * 1000 * 48 + 6 * 4 * (128 // 32) * (16 + 2) * 4
    # prefill's explicit attention: scores over the 10-token prompt, 4 heads, 10 bytes a score
    assert plan.row("prefill") == 6 * 10 * (3 * 128 * 2 + 10 * 4 * 10)
    assert plan.peak == (403456 + 8192 + CUDA_RUNTIME_BYTES + 49152 + 196608 + 288000 + 6912 + 70080)
    assert (plan.stage, plan.knob, plan.tokens_knob) == ("evaluate final/aime24", "evaluate.batch_size",
                                                        "evaluate.benchmarks.aime24.max_new_tokens")
    base = plan_evaluate(ARCH, ev, "aime24", "base", adapter=adapter, prep=PrepareParams(), cuda=True, prompt_tokens=10)
    assert base.row("adapter") == 0 and base.row("decoder_copy") == 2 * (64 * 64 + 2 * 64 * 32) * 2
    capped = plan_evaluate(ARCH, ev, "aime24", "base", adapter=adapter, prep=PrepareParams(max_eval={"aime24": 2}),
                           cuda=True, prompt_tokens=10)
    assert capped.sequences == 4 and capped.row("kv_cache") == 4 * 128 * 256  # 2 questions x n 2 < 6 slots


def test_max_slots_is_the_largest_count_that_fits():
    shape = dict(dtype="bfloat16", quantised=False, prompt_tokens=10, new_tokens=100, static_decoder=True,
                 top_p=0.95)

    def cost(n: int) -> int:
        rows = plan_generation(ARCH, sequences=n, **shape)
        return rows["kv_cache"] + rows["decode_step"] + rows["prefill"]

    # hand: cache, step (logits, the attention's shares), prefill
    per_slot = 128 * 256 + 1000 * 48 + 4 * (128 // 32) * (16 + 2) * 4 + 10 * (3 * 128 * 2 + 10 * 4 * 10)
    assert cost(1) == per_slot and cost(7) == 7 * per_slot
    assert max_slots(ARCH, 7 * per_slot, **shape) == 7 and max_slots(ARCH, 7 * per_slot - 1, **shape) == 6
    assert max_slots(ARCH, per_slot - 1, **shape) == 0
    # prefilling 2 prompts at a time makes the prefill a fixed cost, not one per slot
    fixed = max_slots(ARCH, 50 * per_slot, prefill_rows=2, **shape)
    assert fixed > 50 and plan_generation(ARCH, sequences=fixed, prefill_rows=2, **shape)["prefill"] == 2 * 10 * 1168


def load_preset(name: str = "rtx3060ti-8gb") -> dict:
    return load_params(ROOT / "presets" / f"{name}.yaml", list(SECTIONS))


def test_largest_fitting_agrees_with_trying_every_value():
    """The training micro-batch at a 5 GiB budget (the preset's 16 does not fit it): the binary search equals
    trying every value. A generation knob's largest fitting value is its own (the engine caps the rows it
    decodes)."""
    params, arch = load_preset(), resolve_arch("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B")
    budget = 5 * GIB
    kwargs = {"cuda": True, "prompt_tokens": 256, "budget": budget}

    def phase_at(knob: str, value: int, stage: str, name: str) -> Phase:
        return next(p for p in plan_stages(with_param(params, knob, value), arch, **kwargs)
                    if (p.stage, p.name) == (stage, name))

    training = phase_at("train.train_batch_size", 16, "train", "training")
    fits = [v for v in range(1, 17) if phase_at("train.train_batch_size", v, "train", "training").peak <= budget]
    assert 1 <= max(fits) < 16
    assert largest_fitting(params, training, arch, **kwargs) == max(fits)
    sent = phase_at("sent.batch_size", 16, "sent", "generation")
    assert sent.requested == 128 and largest_fitting(params, sent, arch, **kwargs) == 16


def test_every_stage_the_params_enable_is_planned():
    params = load_preset()
    phases = plan_stages(params, resolve_arch("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"), cuda=True, prompt_tokens=256)
    stages = [(p.stage, p.name) for p in phases]
    assert stages[:3] == [("sent", "generation"), ("train", "generation"), ("train", "training")]
    assert stages[-1] == ("infer", "generation")
    for benchmark in params["prepare"].benchmarks:
        assert (f"evaluate base/{benchmark}", "generation") in stages
        assert (f"evaluate final,best/{benchmark}", "generation") in stages
    sent = phases[0]
    assert sent.sequences == 16 * 8 and sent.tokens == 768 and sent.row("adapter") == 0  # batch_size x M, no LoRA
    no_sent = plan_stages(with_param(params, "sent.enabled", False), resolve_arch(params["model"].source), cuda=True,
                          prompt_tokens=256)
    assert all(p.stage != "sent" for p in no_sent)


def check(capsys, *args: str) -> tuple[int, str, str]:
    """``python -m grpo.check`` in-process (the README test runs the real command): (exit, out, err)."""
    from grpo.check import main

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        code = main(list(args))
    finally:
        os.chdir(cwd)
    out, err = capsys.readouterr()
    return code, out, err


def table_peaks(out: str) -> dict[tuple[str, str], float]:
    """(stage, phase) -> the peak column of check's table."""
    rows = re.findall(r"^  (\S+(?: \S+)?)\s+(generation|training)\s+[\d/]+\s+\d+\s.*?([\d.]+)(?:  OVER)?$", out, re.M)
    return {(stage, phase): float(peak) for stage, phase, peak in rows}


def test_check_on_the_shipped_8gb_preset_fits_with_the_rows_the_engines_put_in_flight(capsys):
    """The preset asks for 128 SENT sequences and 64 evaluation sequences a call; on an 8 GiB card the
    native engine decodes only the rows that fit (grpo/rollout/budget.py), and check plans those rows."""
    code, out, err = check(capsys, "--params", "presets/rtx3060ti-8gb.yaml", "--budget-gib", "8")
    assert code == 0, err
    assert "fits: peak" in out and "OVER" not in out
    params = load_preset()
    expected = plan_stages(params, resolve_arch(params["model"].source), cuda=True, prompt_tokens=256, budget=8 * GIB)
    assert table_peaks(out) == {(p.stage, p.name): round(p.peak / GIB, 2) for p in expected}
    assert len(expected) == 1 + 2 + 2 * 5 + 1  # sent, train's two phases, 5 benchmarks x (base, final), infer
    seqs = dict(re.findall(r"^  (sent|evaluate base/aime24|evaluate base/gsm8k)\s+generation\s+(\S+)", out, re.M))
    sent_rows, aime_rows, gsm_rows = (int(seqs[k].split("/")[0]) for k in ("sent", "evaluate base/aime24",
                                                                            "evaluate base/gsm8k"))
    assert seqs["sent"].endswith("/128") and seqs["evaluate base/aime24"].endswith("/64")
    assert 1 <= aime_rows < gsm_rows < 64 and sent_rows < 128  # longer sequences, fewer rows


def test_capped_rows_are_the_most_that_fit_the_budget():
    """Each capped phase's rows fit the budget less the engine's margin, and one more row would not."""
    params = load_preset()
    arch = resolve_arch(params["model"].source)
    budget = 8 * GIB
    for phase in plan_stages(params, arch, cuda=True, prompt_tokens=256, budget=budget):
        if not phase.requested:
            continue
        assert phase.peak <= budget - GENERATION_MARGIN, phase.stage
        cost = {k: v for k, v in phase.rows if k in ("kv_cache", "decode_step", "prefill")}
        per_row = sum(cost.values()) / phase.sequences  # every term is proportional to the rows
        assert phase.peak + per_row > budget - GENERATION_MARGIN, phase.stage


def test_check_names_evaluate_and_its_knob_when_not_even_one_row_fits(capsys, tmp_path):
    """200,000 new tokens: one aime24 sequence's cache alone (5.3 GiB) breaks the 8 GiB budget; no
    batch size helps, so check names the length knob."""
    raw = (ROOT / "presets" / "rtx3060ti-8gb.yaml").read_text()
    assert raw.count("max_new_tokens: 8192") == 1
    params = tmp_path / "params.yaml"
    params.write_text(raw.replace("max_new_tokens: 8192", "max_new_tokens: 200000"))
    code, out, err = check(capsys, "--params", str(params), "--budget-gib", "8")
    assert code == 1
    lines = err.splitlines()
    assert [line.split(" (")[0] for line in lines] == ["error: evaluate base/aime24", "error: evaluate final,best/aime24"]
    line = lines[0]
    assert line.startswith("error: evaluate base/aime24 (generation phase) needs ")
    assert "not even evaluate.batch_size 1 fits: lower evaluate.benchmarks.aime24.max_new_tokens" in line
    assert "kv_cache" in line
    assert re.search(r"evaluate final,best/aime24 +generation +1/64 .*OVER$", out, re.M)


def test_check_fails_clearly_when_the_plan_does_not_fit(capsys):
    code, out, err = check(capsys, "--params", "presets/rocm-bf16-llama8b.yaml", "--budget-gib", "8")
    assert code == 1
    # the bf16 8B base alone is 15 GiB: no batch size helps, train's phases say so
    assert "error: train (generation phase) needs" in err and "--budget-gib 8 has 8.00 GiB" in err
    assert "base_weights" in err and "not even train.generation_batch_size 1 fits" in err


def test_check_plans_the_rollout_rows_that_fit(capsys, tmp_path):
    """64 rollout sequences a call of 768 tokens do not all fit an 8 GiB card beside the static decoder's
    copy: the trainer's engine decodes fewer at once, and check shows how many."""
    params = tmp_path / "params.yaml"
    raw = (ROOT / "presets" / "rtx3060ti-8gb.yaml").read_text()
    params.write_text(raw.replace("generation_batch_size: 32", "generation_batch_size: 64"))
    code, out, err = check(capsys, "--params", str(params), "--budget-gib", "8")
    assert code == 0, err
    rows = re.search(r"^  train\s+generation\s+(\d+)/64 ", out, re.M)
    assert rows and 32 <= int(rows.group(1)) < 64


def test_check_bad_params_and_missing_gpu_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {lr: -1}\n")
    code, out, err = check(capsys, "--params", str(bad))
    assert code == 2 and "train.lr: got -1" in err
    bad.write_text("evaluate: {batch_size: 0}\n")
    code, out, err = check(capsys, "--params", str(bad))
    assert code == 2 and "evaluate.batch_size: got 0" in err
    import torch

    if not torch.cuda.is_available():  # a preset pinned to cuda, on a machine without a GPU
        code, out, err = check(capsys, "--params", "presets/h200.yaml")
        assert code == 2 and "plan with --budget-gib" in err


def test_stage_plans_bound_the_peaks_measured_under_the_8gib_cap():
    """bench/gpu_stages.py ran every stage of the 8 GB preset on an H200 capped at 7.5 GiB (random weights at
    the R1-Distill-1.5B shape): each stage's plan (with its 0.75 GiB runtime allowance) plus the engine's
    generation margin is never below the measured allocator peak over the run (train's: its generation
    phase's, 6.14 GiB, above the 5.66 its process recorded at exit), and at most 1 GiB above it. The long
    evaluations come closest: captured CUDA graphs hold sampling buffers per length bucket
    (bench/results/decode_memory.json), which the plan leaves to its allowance and margin. gsm8k ran in a
    second call on the same machine (gpu_stages_gsm8k.json: the first reached its deadline)."""
    records = [json.loads((ROOT / "bench" / "results" / name).read_text())
               for name in ("gpu_stages.json", "gpu_stages_gsm8k.json")]
    checked = []
    for stage in (stage for record in records for stage in record["stages"]):
        measured, plan = run_peak_gib(stage), stage.get("plan", {}).get("peak_GiB")
        if stage["rc"] != 0 or not measured or plan is None:
            continue
        assert measured <= plan + GENERATION_MARGIN / GIB, stage["stage"]
        assert plan <= measured + 1.0, stage["stage"]
        checked.append(stage["stage"])
    assert {"sent", "train"} | {f"evaluate {model}/{benchmark}" for model in ("base", "final")
                                for benchmark in ("aime24", "math500", "gsm8k")} <= set(checked)


def test_check_plans_each_process_and_the_gradient_all_reduce(capsys, tmp_path):
    """With train.num_processes 4 on 2 hosts every row is still one process's plan: the rollouts and
    micro-batches per rank are one process's, and training adds the all-reduce's fp32 buffer and copy."""
    params = load_preset()
    arch = resolve_arch(params["model"].source)
    alone = plan_stages(params, arch, cuda=True, prompt_tokens=256)
    spread = plan_stages(with_param(with_param(params, "train.num_processes", 4), "train.nnodes", 2), arch,
                         cuda=True, prompt_tokens=256)
    lora = params["train"].lora
    for one, many in zip(alone, spread):
        extra = 8 * lora_params(arch, lora.r, tuple(lora.targets)) if (many.stage, many.name) == ("train", "training") else 0
        assert many.peak == one.peak + extra, (many.stage, many.name)
    preset = yaml.safe_load((ROOT / "presets/rtx3060ti-8gb.yaml").read_text())
    preset["train"].update(num_processes=4, nnodes=2)
    preset["sent"]["num_processes"] = 2
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(preset))
    code, out, err = check(capsys, "--params", str(tmp_path / "params.yaml"), "--budget-gib", "8")
    assert code == 0, err
    assert "processes: sent 2, train 8 (4 per host x 2 hosts), evaluate 1;" in out
