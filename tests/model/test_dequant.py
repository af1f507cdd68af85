"""dense_base: the dense copy of the 4-bit base computes the same function, and leaves training intact."""
from __future__ import annotations

import bitsandbytes as bnb
import torch

from grpo.model.dequant import dense_base
from grpo.model.loading import load_policy_model
from grpo.model.lora import inject_lora, lora_parameters


def test_dense_copy_matches_4bit_and_restores(tiny_model_dir):
    model = load_policy_model(tiny_model_dir, quantization="nf4", compute_dtype="float32", device="cpu")
    inject_lora(model, targets=["q_proj", "v_proj"], r=4, alpha=8, seed=0)
    for p in lora_parameters(model):
        torch.nn.init.normal_(p, std=0.05)  # non-zero B, so the LoRA branch matters
    ids = torch.randint(3, model.config.vocab_size, (2, 9))
    model.eval()
    with torch.no_grad():
        quantised = model(ids).logits
        with dense_base(model) as switched:
            dense = model(ids).logits
    assert switched == sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules()) > 0
    torch.testing.assert_close(dense, quantised, atol=1e-4, rtol=1e-4)
    assert all("forward" not in vars(m) for m in model.modules() if isinstance(m, bnb.nn.Linear4bit))
    model.train()
    loss = model(ids).logits.float().logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in lora_parameters(model))


def test_disabled_switches_nothing(tiny_model_dir):
    model = load_policy_model(tiny_model_dir, quantization="nf4", compute_dtype="float32", device="cpu")
    with dense_base(model, enabled=False) as switched:
        assert switched == 0
