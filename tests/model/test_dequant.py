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


def _lora_grads(model, ids) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(ids).logits.float().logsumexp(-1).mean().backward()
    return [p.grad.clone() for p in lora_parameters(model)]


def test_dense_training_gives_the_4bit_gradient_and_frees_only_the_copies_it_made(tiny_model_dir):
    """train.dense_training: the LoRA gradient through the dense copy equals the 4-bit kernels' (with
    gradient checkpointing, so the re-forward inside backward runs densely too); the step's copies are
    freed at the end, while copies generation had cached stay."""
    from grpo.model.dequant import dense_for_training, dense_weight, linear4bit_modules

    model = load_policy_model(tiny_model_dir, quantization="nf4", compute_dtype="float32", device="cpu",
                              gradient_checkpointing=True)
    inject_lora(model, targets=["q_proj", "v_proj"], r=4, alpha=8, seed=0)
    for p in lora_parameters(model):
        torch.nn.init.normal_(p, std=0.05)
    model.train()
    ids = torch.randint(3, model.config.vocab_size, (2, 9))
    quantised = _lora_grads(model, ids)
    layers = linear4bit_modules(model)
    with dense_for_training(model, True) as switched:
        dense = _lora_grads(model, ids)
        assert switched == len(layers) > 0
        assert all(getattr(m, "_dense_weight", None) is not None for m in layers)
    for a, b in zip(dense, quantised):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert all(getattr(m, "_dense_weight", None) is None for m in layers)  # freed: generation needs the room
    cached = dense_weight(layers[0])  # as generation's dense_base leaves it
    with dense_for_training(model, True):
        _lora_grads(model, ids)
    assert layers[0]._dense_weight is cached and all(getattr(m, "_dense_weight", None) is None for m in layers[1:])
    with dense_for_training(model, False) as switched:
        assert switched == 0 and all("forward" not in vars(m) for m in layers)
