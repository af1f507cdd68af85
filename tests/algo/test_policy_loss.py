"""grpo_loss against a per-token Python loop (plain floats), its gradients, and accumulation."""
from __future__ import annotations

import math

import pytest
import torch

from grpo.algo.objective import grpo_loss, loss_normaliser

# Two sequences, four positions; sequence 0 has three response tokens. Log-ratios lp - old put the
# ratios on both sides of the clip range [0.8, 1.28] for both advantage signs:
#   seq 0 (A = +1.5): r = 1.350 (high clip binds), 0.670 (below range, A > 0: unclipped), 1.051
#   seq 1 (A = -0.8): r = 0.905, 1.649 (above range, A < 0: unclipped, δ = 1.5 caps it),
#                     0.741 (low clip binds), 1.221
LP = [[-1.0, -0.5, -2.0, -0.3], [-0.2, -1.5, -0.7, -3.0]]
LOG_RATIO = [[0.3, -0.4, 0.05, 0.0], [-0.1, 0.5, -0.3, 0.2]]
OLD = [[lp - d for lp, d in zip(row, dr)] for row, dr in zip(LP, LOG_RATIO)]
REF = [[-1.2, -0.4, -1.7, -0.9], [-0.5, -1.0, -0.6, -2.5]]
ADV = [1.5, -0.8]
MASK = [[1, 1, 1, 0], [1, 1, 1, 1]]
EPS_LOW, EPS_HIGH, DELTA, BETA, MAX_LEN = 0.2, 0.28, 1.5, 0.04, 6


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def reference(lp, old, adv, mask, *, loss_type, keep=None, ref=None, beta=0.0, delta=None,
              max_len=MAX_LEN, num_items=None):
    """(loss, d loss / d lp) by the obvious loop over tokens, from the formulas in grpo.algo.objective."""
    old = old if old is not None else lp
    losses = [[0.0] * len(row) for row in lp]
    grads = [[0.0] * len(row) for row in lp]
    for b, row in enumerate(lp):
        a = adv[b]
        for i, x in enumerate(row):
            if not mask[b][i]:
                continue
            if keep is None or keep[b][i]:
                r = math.exp(x - old[b][i])
                u = r if delta is None else min(r, delta)
                c = min(max(r, 1 - EPS_LOW), 1 + EPS_HIGH)
                du = r if delta is None or r < delta else 0.0
                dc = r if 1 - EPS_LOW < r < 1 + EPS_HIGH else 0.0
                if u * a <= c * a:
                    losses[b][i], grads[b][i] = -u * a, -a * du
                else:
                    losses[b][i], grads[b][i] = -c * a, -a * dc
            if beta > 0:
                d = ref[b][i] - x
                losses[b][i] += beta * (math.exp(d) - d - 1)
                grads[b][i] += beta * (1 - math.exp(d))
    n = [sum(row) for row in mask]
    if loss_type == "grpo":  # each sequence's mean, then the mean over sequences
        seq = [1.0 / max(n[b], 1) for b in range(len(lp))]
        denom = len(lp) if num_items is None else num_items
    else:
        seq = [1.0] * len(lp)
        denom = num_items or {"bnpo": sum(n), "dapo": sum(n), "dr_grpo": len(lp) * max_len}[loss_type]
    loss = sum(seq[b] * sum(losses[b]) for b in range(len(lp))) / denom
    grad = [[seq[b] * g / denom for g in grads[b]] for b in range(len(lp))]
    return loss, grad


def run(lp, old, adv, mask, **kw):
    lp_t = t(lp).requires_grad_(True)
    ref = kw.pop("ref", None)
    keep = kw.pop("keep", None)
    out = grpo_loss(
        lp_t, None if old is None else t(old), t(adv), t(mask), epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
        max_completion_length=MAX_LEN, ref_logprobs=None if ref is None else t(ref),
        entropy_keep_mask=None if keep is None else torch.tensor(keep, dtype=torch.bool),
        **kw,
    )
    out.loss.backward()
    return out, lp_t.grad


def test_hand_computed_single_sequence():
    # r = 1.5 with A = 1: clipped to 1.28 -> -1.28; r = 0.5 with A = 1: unclipped -> -0.5
    lp = [[math.log(1.5), math.log(0.5)]]
    out, _ = run(lp, [[0.0, 0.0]], [1.0], [[1, 1]], loss_type="grpo")
    assert out.loss.item() == pytest.approx((-1.28 - 0.5) / 2)
    assert out.metrics["clip_frac_high"] == pytest.approx(0.5)
    assert out.metrics["ratio_min"] == pytest.approx(0.5)
    assert out.metrics["ratio_max"] == pytest.approx(1.5)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("extras", [{}, {"delta": DELTA}, {"beta": BETA, "ref": REF},
                                    {"delta": DELTA, "beta": BETA, "ref": REF}])
def test_matches_loop_with_clipping(loss_type, extras):
    out, grad = run(LP, OLD, ADV, MASK, loss_type=loss_type, **dict(extras))
    want, want_grad = reference(LP, OLD, ADV, MASK, loss_type=loss_type, **extras)
    assert out.loss.item() == pytest.approx(want, rel=1e-12)
    torch.testing.assert_close(grad, t(want_grad), rtol=1e-10, atol=1e-12)


def test_delta_caps_the_unclipped_term():
    plain, _ = run(LP, OLD, ADV, MASK, loss_type="dapo")
    capped, _ = run(LP, OLD, ADV, MASK, loss_type="dapo", delta=DELTA)
    # only seq 1 token 1 (r = 1.649 > δ, A < 0) changes: -(r·A) becomes -(δ·A)
    r = math.exp(0.5)
    assert plain.loss.item() - capped.loss.item() == pytest.approx(0.8 * (r - DELTA) / 7)


def test_clip_metrics():
    out, _ = run(LP, OLD, ADV, MASK, loss_type="dapo", beta=BETA, ref=REF)
    m = out.metrics
    assert m["clip_frac_low"] == pytest.approx(1 / 7)
    assert m["clip_frac_high"] == pytest.approx(1 / 7)
    assert m["clip_frac_region"] == pytest.approx(2 / 7)
    assert m["ratio_min"] == pytest.approx(math.exp(-0.4))
    assert m["ratio_max"] == pytest.approx(math.exp(0.5))
    ratios = [math.exp(d) for row, mrow in zip(LOG_RATIO, MASK) for d, on in zip(row, mrow) if on]
    assert m["ratio_mean"] == pytest.approx(sum(ratios) / 7)
    kls = [math.exp(r - x) - (r - x) - 1 for lrow, rrow, mrow in zip(LP, REF, MASK)
           for x, r, on in zip(lrow, rrow, mrow) if on]
    assert m["kl_mean"] == pytest.approx(sum(kls) / 7)
    assert m["kept_token_frac"] == 1.0


def test_old_logprobs_none_is_ratio_one_with_gradient():
    out, grad = run(LP, None, ADV, MASK, loss_type="grpo")
    want, want_grad = reference(LP, None, ADV, MASK, loss_type="grpo")
    assert out.loss.item() == pytest.approx(want)
    assert out.loss.item() == pytest.approx(-(1.5 - 0.8) / 2)  # -mean over sequences of A
    torch.testing.assert_close(grad, t(want_grad))
    assert grad[0, 0].item() == pytest.approx(-1.5 / 3 / 2)  # -A / n_b / B
    assert out.metrics["ratio_min"] == out.metrics["ratio_max"] == 1.0


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_entropy_keep_mask_drops_policy_term_only(loss_type):
    keep = [[True, False, True, True], [False, True, True, False]]
    out, grad = run(LP, OLD, ADV, MASK, loss_type=loss_type, keep=keep, beta=BETA, ref=REF)
    want, want_grad = reference(LP, OLD, ADV, MASK, loss_type=loss_type, keep=keep, beta=BETA, ref=REF)
    assert out.loss.item() == pytest.approx(want, rel=1e-12)
    torch.testing.assert_close(grad, t(want_grad), rtol=1e-10, atol=1e-12)
    assert out.metrics["kept_token_frac"] == pytest.approx(4 / 7)  # seq 0 token 3 is padding


def test_finite_differences():
    lp = t(LP).requires_grad_(True)

    def f(x):
        return grpo_loss(x, t(OLD), t(ADV), t(MASK), loss_type="grpo", epsilon_low=EPS_LOW,
                         epsilon_high=EPS_HIGH, delta=DELTA, beta=BETA, ref_logprobs=t(REF)).loss

    assert torch.autograd.gradcheck(f, (lp,))  # no ratio sits on a kink, so finite differences hold


def test_garbage_at_padding_cannot_poison_the_loss():
    lp, old = [row[:] for row in LP], [row[:] for row in OLD]
    lp[0][3], old[0][3] = 0.0, -500.0  # exp(500) overflows
    ref = [row[:] for row in REF]
    ref[0][3] = float("inf")
    out, grad = run(lp, old, ADV, MASK, loss_type="dapo", beta=BETA, ref=ref)
    want, _ = reference(LP, OLD, ADV, MASK, loss_type="dapo", beta=BETA, ref=REF)
    assert out.loss.item() == pytest.approx(want)
    assert torch.isfinite(grad).all() and grad[0, 3] == 0


def test_errors():
    with pytest.raises(ValueError, match="loss_type"):
        run(LP, OLD, ADV, MASK, loss_type="ppo")
    with pytest.raises(ValueError, match="ref_logprobs"):
        run(LP, OLD, ADV, MASK, loss_type="dapo", beta=0.1)
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_loss(t(LP), None, t(ADV), t(MASK), loss_type="dr_grpo")


# --- gradient accumulation -------------------------------------------------------------------

def batch(seed: int = 0, n: int = 6, width: int = 5):
    g = torch.Generator().manual_seed(seed)
    lengths = [1, 5, 3, 4, 2, 5][:n]
    mask = torch.tensor([[1.0] * k + [0.0] * (width - k) for k in lengths], dtype=torch.float64)
    lp = -torch.rand(n, width, generator=g, dtype=torch.float64) * 2
    old = lp + (torch.rand(n, width, generator=g, dtype=torch.float64) - 0.5) * 0.8
    ref = lp + (torch.rand(n, width, generator=g, dtype=torch.float64) - 0.5)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    return lp, old, ref, adv, mask


def accumulate(loss_type: str, splits: list[slice], *, step_wide: bool, divide_by: int = 1, **kw):
    """Sum of micro-batch losses (each backpropagated) and the accumulated gradient."""
    lp, old, ref, adv, mask = batch()
    lp.requires_grad_(True)
    num_items = sum(loss_normaliser(loss_type, mask[s], MAX_LEN) for s in splits) if step_wide else None
    total = 0.0
    for s in splits:
        out = grpo_loss(lp[s], old[s], adv[s], mask[s], loss_type=loss_type, epsilon_low=EPS_LOW,
                        epsilon_high=EPS_HIGH, beta=BETA, ref_logprobs=ref[s], max_completion_length=MAX_LEN,
                        num_items_in_batch=num_items, **kw)
        (out.loss / divide_by).backward()
        total += out.loss.item() / divide_by
    return total, lp.grad


WHOLE = [slice(0, 6)]
UNEVEN = [slice(0, 1), slice(1, 4), slice(4, 6)]
EVEN = [slice(0, 3), slice(3, 6)]


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_step_wide_normaliser_equals_one_batch_for_any_split(loss_type):
    loss, grad = accumulate(loss_type, WHOLE, step_wide=False)
    split_loss, split_grad = accumulate(loss_type, UNEVEN, step_wide=True)
    assert split_loss == pytest.approx(loss, rel=1e-12)
    torch.testing.assert_close(split_grad, grad)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_trl_division_by_micro_batches_equals_one_batch_when_even(loss_type):
    loss, grad = accumulate(loss_type, WHOLE, step_wide=False)
    split_loss, split_grad = accumulate(loss_type, EVEN, step_wide=False, divide_by=len(EVEN))
    assert split_loss == pytest.approx(loss, rel=1e-12)
    torch.testing.assert_close(split_grad, grad)


def test_trl_bnpo_is_a_mean_of_micro_batch_token_means():
    lp, old, ref, adv, mask = batch()
    split_loss, _ = accumulate("bnpo", EVEN, step_wide=False, divide_by=2)
    parts = [grpo_loss(lp[s], old[s], adv[s], mask[s], loss_type="bnpo", epsilon_low=EPS_LOW,
                       epsilon_high=EPS_HIGH, beta=BETA, ref_logprobs=ref[s]).loss.item() for s in EVEN]
    assert split_loss == pytest.approx(sum(parts) / 2)
    whole, _ = accumulate("bnpo", WHOLE, step_wide=False)
    assert split_loss != pytest.approx(whole)  # 9 and 11 tokens: not the token mean of the batch


def test_a_batch_without_response_tokens_gives_zero_loss():
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        out, grad = run(LP, OLD, ADV, [[0] * 4, [0] * 4], loss_type=loss_type)
        assert out.loss.item() == 0.0 and not grad.any()
        assert out.metrics["ratio_mean"] == 1.0 and out.metrics["kept_token_frac"] == 0.0
