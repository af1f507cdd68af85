"""The system check's memory plan against a hand calculation, the architecture formulas against real
models (parameter counts, nf4 storage of a bitsandbytes-quantised model), and the CLI's fit/fail exits."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from grpo.config import LoraParams, TrainParams
from grpo.memory_plan import GIB, Arch, lora_params, plan_memory, resolve_arch
from tests.conftest import ROOT

ARCH = Arch(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
PARAMS = TrainParams(quantization="nf4", dense_generation=True, lora=LoraParams(r=4, targets=["q_proj", "v_proj"]),
                     generation_batch_size=8, max_response_length=20, val_max_new_tokens=30, train_batch_size=2,
                     gradient_checkpointing=True, logprob_chunk_size=1024)


def test_plan_matches_a_hand_calculation():
    plan = plan_memory(ARCH, PARAMS, compute_dtype="bfloat16", prompt_tokens=10, cuda=False)
    # linear weights per layer: q 64*64 + k 64*32 + v 64*32 + o 64*64 + gate/up/down 3 * 64*128 = 36864; 2 layers
    # nf4: 73728 * (0.5 + 1/64 + 4/16384) = 36864 + 1152 + 18 bytes; embeddings + LM head 2 * 1000*64 * 2 bytes
    assert plan.base_weights == 38034 + 256000
    assert plan.dense_copy == 73728 * 2
    # LoRA r4: q 4*(64+64) + v 4*(64+32) = 896 a layer, 2 layers, 16 bytes each (fp32 param, grad, Adam m and v)
    assert plan.lora_and_optimizer == 1792 * 16
    # KV: 8 sequences * (10 prompt + max(20, 30) tokens) * (2 (k,v) * 2 layers * 2 kv heads * 16 dims * 2 bytes)
    assert plan.kv_cache == 8 * 40 * 256
    assert plan.sampling_logits == 8 * 1000 * (2 + 4)
    # prefill: 8 sequences * 10 prompt tokens * (3 * 128 MLP intermediates + 4 heads * 40 cache positions) * 2 bytes
    assert plan.prefill == 80 * 544 * 2
    # 2 sequences * 30 tokens = 60: layer inputs 2 layers * 60 * 64 * 2 bytes, plus twice one layer's live set
    # (backward: the recomputed layer and its gradients), 60 * ((2*64 + 2*64 + 2*32 + 3*128) * 2 + (64 + 64) * 4)
    assert plan.activations == 15360 + 2 * 60 * (1408 + 512)
    assert plan.logprob_logits == 3 * 60 * 1000 * 4  # 60 tokens < chunk 1024; three fp32 buffers off CUDA
    assert plan.decoder_copy == 0 and plan.runtime == 0
    assert plan.generation_peak == 294034 + 147456 + 28672 + 81920 + 48000 + 87040
    assert plan.peak == plan.training_peak == 294034 + 147456 + 28672 + 245760 + 720000


def test_cuda_plan_has_the_static_decoder_and_the_fused_logprob_kernel():
    plan = plan_memory(ARCH, PARAMS, compute_dtype="bfloat16", prompt_tokens=10, cuda=True)
    # the static decoder de-quantises every linear weight (73728 * 2 bytes) and concatenates q/k/v
    # (64*64 + 2 * 64*32 = 8192 a layer, 2 layers); o_proj is no LoRA target here, so nothing is merged there
    assert plan.decoder_copy == 73728 * 2 + 2 * 8192 * 2
    assert plan.dense_copy == 0  # generate's cached copy is not used, and the decoder frees its own
    assert plan.kv_cache == 8 * 128 * 256  # 40 tokens, the static cache rounded up to its 128-token bucket
    assert plan.logprob_logits == 60 * 1000 * 2  # one bf16 buffer in the Triton kernel
    with_o = plan_memory(ARCH, dataclasses.replace(PARAMS, lora=LoraParams(r=4, targets=["q_proj", "o_proj"])),
                         compute_dtype="bfloat16", prompt_tokens=10, cuda=True)
    assert with_o.decoder_copy == plan.decoder_copy + 2 * 64 * 64 * 2  # o_proj with LoRA merged, a layer each
    hf = plan_memory(ARCH, dataclasses.replace(PARAMS, generation_backend="hf", logprob_backend="torch"),
                     compute_dtype="bfloat16", prompt_tokens=10, cuda=True)
    assert hf.decoder_copy == 0 and hf.dense_copy == 73728 * 2 and hf.logprob_logits == 3 * 60 * 1000 * 4


@pytest.mark.parametrize("measured", ["gpu_step_triton_lora-torch.json", "gpu_step_triton_mb8.json",
                                      "gpu_step_triton_mb16_lora-torch.json"])
def test_plan_bounds_the_peaks_measured_on_the_h200(measured):
    """bench/gpu_bench.py step recorded allocator peaks of a real GRPO step at the 8 GB preset's shape
    (R1-Distill-1.5B, nf4, LoRA r16, 64 x 768-token rollouts, micro-batches of 4/8/16): the plan must not
    promise less, and may over-estimate by at most its runtime allowance (CUDA context, workspaces) + 0.6 GiB."""
    record = json.loads((ROOT / "bench" / "results" / measured).read_text())["triton_step1"]
    params = TrainParams(quantization="nf4", lora=LoraParams(r=16, alpha=32), generation_batch_size=64,
                         max_response_length=768, train_batch_size=int(record["micro_batch"]["train"]))
    arch = resolve_arch("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B")
    plan = plan_memory(arch, params, compute_dtype="bfloat16", prompt_tokens=record["prompt_tokens"], cuda=True)
    for phase, peak in (("generate", plan.generation_peak), ("train", plan.training_peak)):
        measured_bytes = record[f"{phase}_peak_GiB"] * GIB
        assert measured_bytes <= peak <= measured_bytes + plan.runtime + 0.6 * GIB, (phase, peak / GIB)


def test_options_change_only_their_component():
    base = plan_memory(ARCH, PARAMS, compute_dtype="bfloat16", prompt_tokens=10, cuda=False)
    no_ckpt = plan_memory(ARCH, dataclasses.replace(PARAMS, gradient_checkpointing=False), compute_dtype="bfloat16",
                          prompt_tokens=10, cuda=False)
    assert no_ckpt.activations == 2 * 60 * (1408 + 512) and no_ckpt.base_weights == base.base_weights
    plain = plan_memory(ARCH, dataclasses.replace(PARAMS, quantization="none"), compute_dtype="bfloat16",
                        prompt_tokens=10, cuda=True)
    assert plain.base_weights == (73728 + 128000) * 2 and plain.dense_copy == 0 and plain.runtime > 0


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
    plan = plan_memory(arch, TrainParams(quantization="nf4"), compute_dtype="float32", prompt_tokens=1, cuda=False)
    assert plan.base_weights - embeddings == pytest.approx(stored, rel=0.01)


def test_resolve_arch_reads_a_local_folder_and_refuses_an_unknown_hub_id(tiny_model_dir, tmp_path):
    assert resolve_arch(str(tiny_model_dir), base_dir=tmp_path).hidden_size == 128
    assert resolve_arch("meta-llama/Llama-3.1-8B-Instruct", base_dir=tmp_path).num_hidden_layers == 32
    with pytest.raises(ValueError, match="architecture unknown"):
        resolve_arch("someone/unknown-model", base_dir=tmp_path)


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


def test_check_prints_device_versions_and_plan_and_fits(capsys):
    code, out, err = check(capsys, "--params", "presets/rtx3060ti-8gb.yaml", "--budget-gib", "8")
    assert code == 0, err
    assert out.startswith("device: ") and "torch 2.13.0" in out and "transformers 5.17.0" in out
    for row in ("base_weights", "dense_copy", "lora_and_optimizer", "kv_cache", "activations", "peak: training"):
        assert row in out
    assert "fits: peak" in out


def test_check_fails_clearly_when_the_plan_does_not_fit(capsys):
    code, out, err = check(capsys, "--params", "presets/rocm-bf16-llama8b.yaml", "--budget-gib", "8")
    assert code == 1
    # the bf16 8B base alone is 15 GiB; generation (with the decoder's q/k/v copy and the KV cache) is the peak
    assert "error: the generation phase needs" in err and "--budget-gib 8 has 8.00 GiB" in err
    assert "base_weights" in err and "train.generation_batch_size" in err  # the phase's largest items, its knob


def test_check_names_the_generation_phase_when_rollouts_do_not_fit(capsys, tmp_path):
    """64 sequences a call of 768 tokens with 1,024-token prompts: the static decoder's copy and the KV
    cache, not training, break an 8 GiB card; the message must point at the generation batch."""
    raw = (ROOT / "presets" / "rtx3060ti-8gb.yaml").read_text()
    params = tmp_path / "params.yaml"
    params.write_text(raw.replace("generation_batch_size: 32", "generation_batch_size: 64"))
    code, out, err = check(capsys, "--params", str(params), "--budget-gib", "8", "--prompt-tokens", "1024")
    assert code == 1
    assert "error: the generation phase needs" in err and "train.generation_batch_size" in err
    assert "decoder_copy" in err and "kv_cache" in err and "activations" not in err


def test_check_bad_params_and_missing_gpu_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {lr: -1}\n")
    code, out, err = check(capsys, "--params", str(bad))
    assert code == 2 and "train.lr: got -1" in err
    import torch

    if not torch.cuda.is_available():  # a preset pinned to cuda, on a machine without a GPU
        code, out, err = check(capsys, "--params", "presets/h200.yaml")
        assert code == 2 and "plan with --budget-gib" in err
