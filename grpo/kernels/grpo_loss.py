"""The GRPO policy loss (all four aggregations, clipping, δ, k3 KL, entropy mask) as fused Triton kernels.

The PyTorch reference is grpo.algo.loss (``grpo_loss``): same arguments, same result, same metrics; read
its docstring for the maths. Eager PyTorch runs dozens of small kernels over [B, T] for the loss, its
metrics and their backward, each a launch and a round trip through memory. Here one forward kernel (a
program per sequence, looping over its tokens in blocks of ``BLOCK_T``) reads each input once and writes
nine fp32 partial sums per row (loss numerator, response and policy counts, clip-low/high counts, ratio
sum/min/max, KL sum); a few torch ops over [B, 9] give the loss and the metrics, with one host sync for
the metrics, as in the reference. One backward kernel writes dL/dlogprob from the saved inputs. Whether
this beats eager PyTorch or torch.compile is for a GPU benchmark to say.

Everything is computed in fp32 whatever the input dtypes (the reference computes bf16 inputs partly in
bf16): the loss is fp32, the gradient has logprobs' dtype. The gradient follows torch autograd of the
reference exactly, ties included: torch.minimum splits the gradient in half where both terms are equal,
and clamp passes it where r lies on a bound.
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

from grpo.algo.loss import METRIC_NAMES, LossOutput, LossType, check_loss_inputs, loss_normaliser

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without triton: the PyTorch reference is used
    triton = None

BLOCK_T = 1024  # tokens a program handles at a time; tests set it small to cover rows of several blocks
# the columns of the per-row statistics the forward kernel writes
LOSS, RESPONSE, POLICY, CLIP_LOW, CLIP_HIGH, RATIO_SUM, RATIO_MIN, RATIO_MAX, KL_SUM = range(9)
N_STATS = 9


def fused_supported(logprobs: Tensor) -> bool:
    """Whether the Triton path can run these inputs (else use grpo.algo.loss)."""
    on_device = logprobs.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"  # the interpreter runs on CPU
    return triton is not None and on_device


if triton is not None:

    @triton.jit
    def _tokens(lp_ptr, old_ptr, ref_ptr, mask_ptr, keep_ptr, offs, valid, adv, lo, hi, delta,
                HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_KEEP: tl.constexpr, HAS_DELTA: tl.constexpr):
        """One block of a row: response and policy masks, the ratio, ref - lp (0 off the response), and the
        two terms of the policy loss's min: min(r, δ)·A and clip(r)·A."""
        response = tl.load(mask_ptr + offs, mask=valid, other=0) != 0
        policy = response
        if HAS_KEEP:
            policy = policy & (tl.load(keep_ptr + offs, mask=valid, other=0) != 0)
        lp = tl.load(lp_ptr + offs, mask=valid, other=0.0).to(tl.float32)
        log_ratio = tl.zeros_like(lp)  # without old log-probs the ratio is exactly 1 (d r / d lp = r = 1)
        if HAS_OLD:
            old = tl.load(old_ptr + offs, mask=valid, other=0.0).to(tl.float32)
            log_ratio = tl.where(policy, lp - old, 0.0)  # where, not *: garbage at padding stays out
        log_ref_ratio = tl.zeros_like(lp)
        if HAS_REF:
            ref = tl.load(ref_ptr + offs, mask=valid, other=0.0).to(tl.float32)
            log_ref_ratio = tl.where(response, ref - lp, 0.0)
        ratio = tl.exp(log_ratio)
        unclipped = ratio
        if HAS_DELTA:
            unclipped = tl.minimum(ratio, delta)
        clipped = tl.minimum(tl.maximum(ratio, lo), hi)
        return response, policy, ratio, log_ref_ratio, unclipped * adv, clipped * adv

    @triton.jit
    def _row_scale(adv_ptr, weight_ptr, row, HAS_WEIGHT: tl.constexpr):
        """The row's advantage, and its per-sequence weight (1 without weights)."""
        scale = 1.0
        if HAS_WEIGHT:
            scale = tl.load(weight_ptr + row).to(tl.float32)
        return tl.load(adv_ptr + row).to(tl.float32), scale

    @triton.jit
    def _forward_kernel(lp_ptr, old_ptr, ref_ptr, mask_ptr, keep_ptr, adv_ptr, weight_ptr, stats_ptr, T,
                        lo, hi, delta, beta, HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr,
                        HAS_KEEP: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_DELTA: tl.constexpr,
                        ADD_KL: tl.constexpr, PER_ROW_MEAN: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = row.to(tl.int64) * T
        adv, scale = _row_scale(adv_ptr, weight_ptr, row, HAS_WEIGHT)
        a_neg = tl.where(adv < 0, 1.0, 0.0)  # where the low / high clip can bind
        a_pos = tl.where(adv > 0, 1.0, 0.0)
        loss = tl.zeros([BLOCK], tl.float32)
        n_response = tl.zeros([BLOCK], tl.float32)
        n_policy = tl.zeros([BLOCK], tl.float32)
        n_low = tl.zeros([BLOCK], tl.float32)
        n_high = tl.zeros([BLOCK], tl.float32)
        ratio_sum = tl.zeros([BLOCK], tl.float32)
        kl_sum = tl.zeros([BLOCK], tl.float32)
        ratio_min = tl.full([BLOCK], float("inf"), tl.float32)
        ratio_max = tl.full([BLOCK], float("-inf"), tl.float32)
        for start in range(0, T, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            valid = cols < T
            response, policy, ratio, log_ref_ratio, u, c = _tokens(
                lp_ptr, old_ptr, ref_ptr, mask_ptr, keep_ptr, base + cols, valid, adv, lo, hi, delta,
                HAS_OLD, HAS_REF, HAS_KEEP, HAS_DELTA)
            token = tl.where(policy, -tl.minimum(u, c), 0.0)
            kl = tl.exp(log_ref_ratio) - log_ref_ratio - 1.0  # 0 off the response
            if ADD_KL:
                token += beta * kl
            loss += token
            kl_sum += kl
            n_response += response.to(tl.float32)
            n_policy += policy.to(tl.float32)
            n_low += tl.where(policy & (ratio < lo), a_neg, 0.0)
            n_high += tl.where(policy & (ratio > hi), a_pos, 0.0)
            ratio_sum += tl.where(policy, ratio, 0.0)
            ratio_min = tl.minimum(ratio_min, tl.where(policy, ratio, float("inf")))
            ratio_max = tl.maximum(ratio_max, tl.where(policy, ratio, float("-inf")))
        n_row = tl.sum(n_response, 0)
        row_loss = tl.sum(loss, 0) * scale
        if PER_ROW_MEAN:
            row_loss = row_loss / tl.maximum(n_row, 1.0)
        out = stats_ptr + row * 9  # the columns LOSS ... KL_SUM, in order
        tl.store(out + 0, row_loss)
        tl.store(out + 1, n_row)
        tl.store(out + 2, tl.sum(n_policy, 0))
        tl.store(out + 3, tl.sum(n_low, 0))
        tl.store(out + 4, tl.sum(n_high, 0))
        tl.store(out + 5, tl.sum(ratio_sum, 0))
        tl.store(out + 6, tl.min(ratio_min, 0))
        tl.store(out + 7, tl.max(ratio_max, 0))
        tl.store(out + 8, tl.sum(kl_sum, 0))

    @triton.jit
    def _backward_kernel(lp_ptr, old_ptr, ref_ptr, mask_ptr, keep_ptr, adv_ptr, weight_ptr, stats_ptr,
                         grad_out_ptr, grad_ptr, T, lo, hi, delta, beta, norm, HAS_OLD: tl.constexpr,
                         HAS_REF: tl.constexpr, HAS_KEEP: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                         HAS_DELTA: tl.constexpr, ADD_KL: tl.constexpr, PER_ROW_MEAN: tl.constexpr,
                         BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = row.to(tl.int64) * T
        adv, scale = _row_scale(adv_ptr, weight_ptr, row, HAS_WEIGHT)
        if PER_ROW_MEAN:
            scale = scale / tl.maximum(tl.load(stats_ptr + row * 9 + 1), 1.0)  # column RESPONSE
        scale = scale * tl.load(grad_out_ptr) / norm
        for start in range(0, T, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            valid = cols < T
            response, policy, ratio, log_ref_ratio, u, c = _tokens(
                lp_ptr, old_ptr, ref_ptr, mask_ptr, keep_ptr, base + cols, valid, adv, lo, hi, delta,
                HAS_OLD, HAS_REF, HAS_KEEP, HAS_DELTA)
            d_unclipped = tl.full([BLOCK], 1.0, tl.float32)
            if HAS_DELTA:
                d_unclipped = tl.where(ratio <= delta, 1.0, 0.0)  # clamp passes the gradient on the bound
            d_clipped = tl.where((ratio >= lo) & (ratio <= hi), 1.0, 0.0)
            share = tl.where(u < c, 1.0, tl.where(u == c, 0.5, 0.0))  # torch.minimum halves it on a tie
            d_ratio = -adv * (share * d_unclipped + (1.0 - share) * d_clipped)
            grad = tl.where(policy, d_ratio * ratio, 0.0)  # d r / d lp = r
            if ADD_KL:
                grad += beta * tl.where(response, 1.0 - tl.exp(log_ref_ratio), 0.0)
            tl.store(grad_ptr + base + cols, (grad * scale).to(grad_ptr.dtype.element_ty), mask=valid)


class _FusedGRPOLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logprobs: Tensor, old: Tensor | None, ref: Tensor | None, mask: Tensor, keep: Tensor | None,
                adv: Tensor, weights: Tensor | None, flags: dict, scalars: tuple[float, ...]):
        b, t = logprobs.shape
        stats = torch.empty(b, N_STATS, dtype=torch.float32, device=logprobs.device)
        inputs = [x if x is not None else logprobs for x in (logprobs, old, ref, mask, keep, adv, weights)]
        _forward_kernel[(b,)](*inputs, stats, t, *scalars[:4], **flags, BLOCK=BLOCK_T)
        ctx.set_materialize_grads(False)
        ctx.flags, ctx.scalars, ctx.block = flags, scalars, BLOCK_T
        ctx.save_for_backward(*inputs, stats)
        ctx.mark_non_differentiable(stats)
        return stats[:, LOSS].sum() / scalars[4], stats

    @staticmethod
    def backward(ctx, grad_loss: Tensor | None, _grad_stats: None):
        if grad_loss is None or not ctx.needs_input_grad[0]:
            return (None,) * 9
        *inputs, stats = ctx.saved_tensors
        b, t = inputs[0].shape
        grad = torch.empty_like(inputs[0])
        _backward_kernel[(b,)](*inputs, stats, grad_loss.float().reshape(1), grad, t, *ctx.scalars, **ctx.flags,
                               BLOCK=ctx.block)
        return (grad,) + (None,) * 8


def fused_grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_type: LossType,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    delta: float | None = None,
    beta: float = 0.0,
    ref_logprobs: Tensor | None = None,
    max_completion_length: int | None = None,
    num_items_in_batch: float | None = None,
    entropy_keep_mask: Tensor | None = None,
    per_sequence_weights: Tensor | None = None,
) -> LossOutput:
    """Same contract as grpo.algo.loss.grpo_loss (differentiable in ``logprobs`` only)."""
    check_loss_inputs(logprobs, advantages, mask, loss_type, beta, ref_logprobs)
    if not fused_supported(logprobs):
        raise ValueError("fused GRPO loss needs triton and CUDA tensors (or TRITON_INTERPRET=1); "
                         "use grpo.algo.loss.grpo_loss otherwise")
    if num_items_in_batch is None:
        num_items_in_batch = loss_normaliser(loss_type, mask, max_completion_length)
    flags = dict(HAS_OLD=old_logprobs is not None, HAS_REF=ref_logprobs is not None,
                 HAS_KEEP=entropy_keep_mask is not None, HAS_WEIGHT=per_sequence_weights is not None,
                 HAS_DELTA=delta is not None, ADD_KL=beta > 0, PER_ROW_MEAN=loss_type == "grpo")
    # bounds as the reference's clamp sees them: 1 ± ε in double, then rounded once to fp32
    scalars = (1.0 - epsilon_low, 1.0 + epsilon_high, 0.0 if delta is None else float(delta), float(beta),
               max(float(num_items_in_batch), 1.0))  # no tokens anywhere: a zero loss, not 0/0
    old, ref, keep, weights = (None if x is None else x.contiguous()
                               for x in (old_logprobs, ref_logprobs, entropy_keep_mask, per_sequence_weights))
    loss, stats = _FusedGRPOLoss.apply(logprobs.contiguous(), old, ref, mask.contiguous(), keep,
                                       advantages.contiguous(), weights, flags, scalars)
    return LossOutput(loss, _metrics(stats))


def _metrics(stats: Tensor) -> dict[str, float]:
    total = stats.sum(0)
    n_policy = total[POLICY].clamp(min=1)
    n_response = total[RESPONSE].clamp(min=1)
    has_policy = total[POLICY] > 0
    one = stats.new_ones(())
    values = torch.stack([
        total[CLIP_LOW] / n_policy,
        total[CLIP_HIGH] / n_policy,
        (total[CLIP_LOW] + total[CLIP_HIGH]) / n_policy,  # disjoint: low needs A < 0, high A > 0
        torch.where(has_policy, total[RATIO_SUM] / n_policy, one),
        torch.where(has_policy, stats[:, RATIO_MIN].min(), one),
        torch.where(has_policy, stats[:, RATIO_MAX].max(), one),
        total[KL_SUM] / n_response,  # 0 without ref_logprobs
        total[POLICY] / n_response,
    ]).tolist()  # one device sync for all metrics
    return dict(zip(METRIC_NAMES, values))
