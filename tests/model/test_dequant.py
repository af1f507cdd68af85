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


def test_dense_training_gives_the_4bit_gradient_from_kept_copies_of_the_layers_without_an_adapter(tiny_model_dir):
    """train.dense_training: the LoRA gradient through the dense copies equals the 4-bit kernels' (with
    gradient checkpointing, so the re-forward inside backward runs densely too); the layers no adapter wraps
    run from copies made on entry and kept after (the static decoder reads them too), the adapter layers keep
    the 4-bit path unless generation cached their copy."""
    from grpo.model.dequant import adapter_free, dense_for_training, dense_weight, linear4bit_modules

    model = load_policy_model(tiny_model_dir, quantization="nf4", compute_dtype="float32", device="cpu",
                              gradient_checkpointing=True)
    inject_lora(model, targets=["q_proj", "v_proj"], r=4, alpha=8, seed=0)
    for p in lora_parameters(model):
        torch.nn.init.normal_(p, std=0.05)
    model.train()
    ids = torch.randint(3, model.config.vocab_size, (2, 9))
    quantised = _lora_grads(model, ids)
    layers, free = linear4bit_modules(model), adapter_free(model)
    adapted = [m for m in layers if m not in free]
    assert len(adapted) == 2 * model.config.num_hidden_layers and len(free) == 5 * model.config.num_hidden_layers
    with dense_for_training(model, True) as switched:
        dense = _lora_grads(model, ids)
        assert switched == len(free)
        assert all("forward" in vars(m) for m in free) and not any("forward" in vars(m) for m in adapted)
    for a, b in zip(dense, quantised):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    kept = [m._dense_weight for m in free]  # kept for the run, not made again
    assert not any(hasattr(m, "_dense_weight") for m in adapted)
    cached = dense_weight(adapted[0])  # as generation's dense_base leaves it
    with dense_for_training(model, True) as switched:
        assert switched == len(free) + 1 and all(m._dense_weight is k for m, k in zip(free, kept))
        assert adapted[0]._dense_weight is cached
    with dense_for_training(model, False) as switched:
        assert switched == 0 and all("forward" not in vars(m) for m in layers)


def test_joined_dense_is_one_copy_whose_rows_are_each_layers_copy(tiny_model_dir):
    """The static decoder's gate/up copy: one tensor, each layer's cached copy its rows (so training reads the
    same memory); asked again it is the same tensor; separate copies made before are joined once."""
    from grpo.model.dequant import dense_weight, dequantized, joined_dense

    model = load_policy_model(tiny_model_dir, quantization="nf4", compute_dtype="float32", device="cpu")
    first, second = model.model.layers[0].mlp, model.model.layers[1].mlp
    joined = joined_dense([first.gate_proj, first.up_proj])
    assert torch.equal(joined, torch.cat([dequantized(first.gate_proj), dequantized(first.up_proj)]))
    assert dense_weight(first.gate_proj)._base is joined and dense_weight(first.up_proj)._base is joined
    assert torch.equal(dense_weight(first.up_proj), joined[first.gate_proj.out_features:])
    assert joined_dense([first.gate_proj, first.up_proj]) is joined
    assert joined_dense([first.up_proj, first.gate_proj]) is not joined  # another order is another tensor
    separate = dense_weight(second.up_proj)
    again = joined_dense([second.gate_proj, second.up_proj])
    assert torch.equal(again[second.gate_proj.out_features:], separate) and second.up_proj._dense_weight._base is again
