"""Loading the policy: nf4 4-bit on the CPU trains only LoRA, survives the bitsandbytes AVX512-BF16
repacking trap, and really checkpoints gradients."""
from __future__ import annotations

import bitsandbytes as bnb
import pytest
import torch
from transformers import AutoTokenizer

from grpo.hardware import cpu_compute_dtype
from grpo.model import (
    inject_lora, load_policy_model, load_tokenizer, lora_parameters, resolve_compute_dtype, resolve_device,
)

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def nf4_model(model_dir, compute_dtype="float32", gradient_checkpointing=True):
    return load_policy_model(
        model_dir, quantization="nf4", compute_dtype=compute_dtype, device="cpu",
        gradient_checkpointing=gradient_checkpointing,
    )


def token_batch(vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab_size, (2, 10), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0  # left padding, as generation batches have
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def mean_logprob_loss(model, batch) -> torch.Tensor:
    logits = model(**batch).logits.float()
    logprobs = logits[:, :-1].log_softmax(-1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    mask = batch["attention_mask"][:, 1:].float()
    return -(logprobs * mask).sum() / mask.sum()


def test_resolve_device_and_dtype():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="tpu"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device("cuda")
        with pytest.raises(ValueError, match="no ROCm GPU"):
            resolve_device("rocm")
    assert resolve_compute_dtype("auto", torch.device("cpu")) == cpu_compute_dtype()
    assert resolve_compute_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="float8"):
        resolve_compute_dtype("float8", torch.device("cpu"))


def test_load_tokenizer_pads_left_and_names_folder_on_errors(tiny_model_dir, tmp_path):
    tokenizer = load_tokenizer(tiny_model_dir)
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token == "<|endoftext|>"

    no_pad = AutoTokenizer.from_pretrained(tiny_model_dir)
    no_pad.pad_token = None
    no_pad.save_pretrained(tmp_path / "no_pad")
    assert load_tokenizer(tmp_path / "no_pad").pad_token == "<|im_end|>"

    no_template = AutoTokenizer.from_pretrained(tiny_model_dir)
    no_template.chat_template = None
    no_template.save_pretrained(tmp_path / "no_template")
    with pytest.raises(ValueError, match="no_template.*chat template"):
        load_tokenizer(tmp_path / "no_template")

    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty.*tokenizer"):
        load_tokenizer(tmp_path / "empty")


def test_nf4_load_is_frozen_4bit_without_cpu_repacking(tiny_model_dir):
    model = nf4_model(tiny_model_dir)
    linears = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(linears) == 2 * len(ALL_TARGETS)
    assert all(m.weight.dtype == torch.uint8 and m.weight.quant_state.quant_type == "nf4" for m in linears)
    assert all(m.support_avx512bf16_for_cpu is False for m in linears)
    assert not any(p.requires_grad for p in model.parameters())
    assert model.config.use_cache is False


def test_unquantised_load_uses_compute_dtype(tiny_model_dir):
    model = load_policy_model(tiny_model_dir, quantization="none", compute_dtype="bfloat16", device="cpu")
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="int8"):
        load_policy_model(tiny_model_dir, quantization="int8", device="cpu")


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_training_step_changes_only_lora_and_keeps_fp32_state(tiny_model_dir, compute_dtype):
    model = nf4_model(tiny_model_dir, compute_dtype)
    inject_lora(model, targets=ALL_TARGETS, r=4, alpha=8, seed=0)
    params = lora_parameters(model)
    lora_keys = {name for name, p in model.named_parameters() if p.requires_grad}
    assert lora_keys == {n for n, _ in model.named_parameters() if n.endswith((".lora_A", ".lora_B"))}
    assert len(params) == len(lora_keys) == 2 * 2 * len(ALL_TARGETS)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}

    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)
    batch = token_batch(model.config.vocab_size)
    model.train()
    for _ in range(2):  # B starts at zero, so A gets a gradient from the second step on
        optimizer.zero_grad()
        mean_logprob_loss(model, batch).backward()
        optimizer.step()

    after = model.state_dict()
    assert before.keys() == after.keys()
    changed = {k for k in before if before[k].dtype != after[k].dtype or not torch.equal(before[k], after[k])}
    assert changed == lora_keys
    assert all(p.dtype == torch.float32 for p in params)
    for p in params:
        state = optimizer.state[p]
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32


def test_lora_gets_gradients_after_eval_mode_generate(tiny_model_dir):
    """Regression for the AVX512-BF16 trap (docs/ARCHITECTURE.md, "Facts measured"): a no-grad eval-mode
    forward must not repack the 4-bit weights, or the next training backward leaves LoRA parameters
    without gradients."""
    model = nf4_model(tiny_model_dir)
    inject_lora(model, targets=ALL_TARGETS, r=4, alpha=8, seed=0)
    with torch.no_grad():
        for p in lora_parameters(model):
            p.normal_(0, 0.02)  # B non-zero so every A gets a gradient in this first backward
    batch = token_batch(model.config.vocab_size)

    model.eval()
    with torch.no_grad():
        model.generate(**batch, max_new_tokens=4, do_sample=False)
    with torch.inference_mode():
        model.generate(**batch, max_new_tokens=4, do_sample=False)
    linears = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert all(m.support_avx512bf16_for_cpu is False for m in linears)
    assert not any(getattr(m.weight.quant_state, "packing_format_for_cpu", False) for m in linears)

    # without the repack, eval and train forwards run the same kernel: the old-policy log-probs
    # (eval, no grad) equal the training forward's, so the GRPO ratio starts at exactly 1
    with torch.no_grad():
        eval_logits = model(**batch).logits
        model.train()
        torch.testing.assert_close(model(**batch).logits, eval_logits, rtol=0, atol=0)

    mean_logprob_loss(model, batch).backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, name
            assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("checkpointing", [True, False])
def test_gradient_checkpointing_recomputes_layers_in_backward(tiny_model_dir, checkpointing):
    model = nf4_model(tiny_model_dir, gradient_checkpointing=checkpointing)
    inject_lora(model, targets=["q_proj"], r=4, alpha=8)
    assert model.is_gradient_checkpointing is checkpointing
    calls = []
    # a pre-hook: the recompute stops early once it has what backward needs, so a post-hook never fires
    model.model.layers[0].register_forward_pre_hook(lambda *_: calls.append(1))
    batch = token_batch(model.config.vocab_size)

    model.train()
    loss = mean_logprob_loss(model, batch)
    assert len(calls) == 1
    loss.backward()
    assert len(calls) == (2 if checkpointing else 1)  # the recompute runs the layer again
    assert all(p.grad is not None for p in lora_parameters(model))


def test_cuda_attention_leaves_out_cudnn_and_cpu_changes_nothing(tiny_model_dir):
    """On CUDA, SDPA is kept off cuDNN (a plan built and compiled per new sequence length; the speed is
    measured in bench/RESULTS.md, not here); loading on the CPU leaves the switch alone. The switch is a
    process-wide flag, which this test sets and reads without a GPU, then restores."""
    from grpo.model.loading import prefer_prebuilt_attention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        nf4_model(tiny_model_dir)
        assert torch.backends.cuda.cudnn_sdp_enabled()
        prefer_prebuilt_attention(torch.device("cuda"))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        # the prebuilt backends stay on
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
