"""The fused Triton GRPO loss against grpo.algo.loss.grpo_loss: the loss, every metric and d loss / d logprobs,
for the four loss types and each option, on rows spanning several kernel blocks, padded on both sides, one
row without response tokens, ratios beyond both clip bounds and exactly on them, garbage at padding.

On a GPU it runs compiled; on CPU under Triton's interpreter, in a subprocess (tests/kernels/interpreter.py).
"""
from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest
import torch

from grpo.algo.loss import LOSS_TYPES, grpo_loss
from tests.kernels.interpreter import kernel_device, run_under_interpreter

pytest.importorskip("triton", reason="triton is not installed")

GARBAGE = [-math.inf, math.inf, 1e30, -1e30, math.nan]


@pytest.fixture
def kernel(monkeypatch):
    import grpo.kernels.grpo_loss as module

    device = kernel_device()
    monkeypatch.setattr(module, "BLOCK_T", 16)  # rows of several blocks at little cost
    return module, device


def make_batch(device: str, t: int, seed: int = 0) -> SimpleNamespace:
    """Four rows: left and right padding, right padding with a hole, no response at all, left padding.
    Log-ratios of scale 0.4 put ratios beyond both clip bounds for both advantage signs."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(4, t)
    mask[0, 3:t - 7] = 1
    mask[1, :t - 2] = 1
    mask[1, t // 2] = 0
    mask[3, 5:] = 1
    lp = -torch.rand(4, t, generator=gen) * 4 - 0.01
    old = lp - torch.randn(4, t, generator=gen) * 0.4
    ref = lp + torch.randn(4, t, generator=gen) * 0.5
    padding = mask == 0
    for i, x in enumerate((lp, old, ref)):  # where, not *, must keep these out of the loss and gradient
        x[padding] = torch.tensor(GARBAGE).roll(i).repeat(t)[:int(padding.sum())]
    return SimpleNamespace(
        lp=lp.to(device), old=old.to(device), ref=ref.to(device), mask=mask.to(device),
        adv=torch.tensor([1.3, -0.7, 0.5, -1.1], device=device),
        keep=(torch.rand(4, t, generator=gen) > 0.3).to(device),
        weights=(torch.rand(4, generator=gen) + 0.5).to(device),
    )


def compare(module, batch: SimpleNamespace, old: torch.Tensor | None, **kw) -> dict[str, float]:
    """Loss, metrics and gradient of both implementations agree at fp32 precision; the reference's metrics."""
    def run(fn):
        x = batch.lp.clone().requires_grad_(True)
        out = fn(x, old, batch.adv, batch.mask, **kw)
        out.loss.backward()
        return out, x.grad

    ref_out, ref_grad = run(grpo_loss)
    out, grad = run(module.fused_grpo_loss)
    assert torch.isfinite(ref_out.loss) and torch.isfinite(ref_grad).all()
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
    torch.testing.assert_close(out.loss, ref_out.loss, rtol=1e-5, atol=1e-7)
    assert out.metrics.keys() == ref_out.metrics.keys()
    for key, value in ref_out.metrics.items():
        assert out.metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-8)
    assert (grad[batch.mask == 0] == 0).all()
    return ref_out.metrics


VARIANTS = ["old_logprobs", "no_old_logprobs", "delta", "kl", "ref_without_beta", "entropy_mask",
            "weights", "num_items", "everything"]


def arguments(batch: SimpleNamespace, variant: str, t: int) -> tuple[torch.Tensor | None, dict]:
    every = variant == "everything"
    kw: dict = dict(epsilon_low=0.2, epsilon_high=0.28, max_completion_length=t + 4)
    if variant == "delta" or every:
        kw["delta"] = 1.5
    if variant in ("kl", "ref_without_beta") or every:
        kw["ref_logprobs"] = batch.ref
        kw["beta"] = 0.0 if variant == "ref_without_beta" else 0.04
    if variant == "entropy_mask" or every:
        kw["entropy_keep_mask"] = batch.keep
    if variant == "weights" or every:
        kw["per_sequence_weights"] = batch.weights
    if variant == "num_items" or every:
        kw["num_items_in_batch"] = 37.0
    return (None if variant == "no_old_logprobs" else batch.old), kw


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_matches_reference(kernel, loss_type, variant):
    module, device = kernel
    t = 3 * module.BLOCK_T + 5  # three full blocks and a partial one
    batch = make_batch(device, t)
    old, kw = arguments(batch, variant, t)
    metrics = compare(module, batch, old, loss_type=loss_type, **kw)
    if old is not None:  # the data reaches both clips (and δ), so the zero-gradient branches are exercised
        assert metrics["clip_frac_low"] > 0 and metrics["clip_frac_high"] > 0
        assert metrics["ratio_min"] < 0.8 and metrics["ratio_max"] > 1.5


@pytest.mark.parametrize("bounds", [
    dict(old=None, epsilon_low=0.0),  # r = 1 = 1 - ε_low
    dict(old=None, epsilon_high=0.0),  # r = 1 = 1 + ε_high
    dict(old=None, delta=1.0),  # r = δ
    dict(old="lp", epsilon_low=0.0, epsilon_high=0.0, delta=1.0),  # old = lp: r = 1 on every bound
])
def test_ratio_exactly_on_a_bound(kernel, bounds):
    """clamp passes the gradient on its bounds; torch.minimum halves it between equal terms (A = 0 too)."""
    module, device = kernel
    batch = make_batch(device, 2 * module.BLOCK_T, seed=1)
    batch.adv[3] = 0.0
    kw = dict(bounds)
    old = batch.lp.clone() if kw.pop("old") == "lp" else None
    compare(module, batch, old, loss_type="grpo", beta=0.04, ref_logprobs=batch.ref, **kw)


def test_no_response_tokens(kernel):
    """A zero loss and gradient, and the reference's neutral metrics (ratio 1, fractions 0), not 0/0."""
    module, device = kernel
    batch = make_batch(device, module.BLOCK_T + 1, seed=2)
    batch.mask.zero_()
    batch.lp.fill_(-math.inf)
    compare(module, batch, batch.old, loss_type="bnpo", beta=0.04, ref_logprobs=batch.ref,
            entropy_keep_mask=batch.keep)


def test_default_block_size(kernel, monkeypatch):
    module, device = kernel
    monkeypatch.undo()  # the module's own BLOCK_T, rows longer than one block
    batch = make_batch(device, module.BLOCK_T + 7, seed=3)
    old, kw = arguments(batch, "everything", module.BLOCK_T + 7)
    compare(module, batch, old, loss_type="dapo", **kw)


def test_kernel_under_interpreter():
    run_under_interpreter(__file__, passed=len(LOSS_TYPES) * len(VARIANTS) + 4 + 2)


def test_refuses_cpu_tensors_without_interpreter():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter runs CPU tensors")
    from grpo.kernels.grpo_loss import fused_grpo_loss

    with pytest.raises(ValueError, match="CUDA tensors"):
        fused_grpo_loss(torch.zeros(1, 2), None, torch.zeros(1), torch.ones(1, 2), loss_type="dapo")
