"""The clipped GRPO policy loss with an optional k3 KL penalty, in TRL's four aggregations.

Per response token t of sequence b, with ratio r = exp(logprob - old_logprob) and advantage A_b:

    policy_bt = -min(min(r, δ)·A, clip(r, 1 - ε_low, 1 + ε_high)·A)        (δ only if given)
    kl_bt     = exp(ref - logprob) - (ref - logprob) - 1                   (k3, Schulman 2020; ≥ 0)
    loss_bt   = keep_bt·policy_bt + β·kl_bt

δ caps the ratio in the unclipped term, as TRL's ``delta`` does: when A < 0 the min would otherwise
pick r·A for any large r, so one stale token could contribute an unbounded loss (for A > 0 the clip
already binds at 1 + ε_high < δ). ``keep`` is the entropy mask (grpo.algo.entropy_mask); like TRL it
removes tokens from the policy term only, while the KL term and every normaliser still count all
response tokens. With ``old_logprobs`` None the ratio is exp(lp - lp.detach()) = 1 with the gradient of
lp: one update per rollout batch (μ = 1) needs no extra forward pass.

Aggregation over a micro-batch of B sequences (numerator / normaliser):

    grpo     Σ_b (Σ_t loss_bt / n_b) / B        mean over each sequence, then over sequences
    bnpo     Σ_bt loss_bt / Σ_b n_b             mean over all tokens
    dr_grpo  Σ_bt loss_bt / (B·L)               L = max_completion_length: no length bias
    dapo     Σ_bt loss_bt / num_items_in_batch  tokens in the whole optimiser step

Gradient accumulation. Every normaliser above is additive over micro-batches (sequences, tokens,
B·L), and ``loss_normaliser`` gives each one. This module supports two conventions:

1. Step-wide (what this project's trainer uses): pass, for every loss type, ``num_items_in_batch =
   Σ over the step's micro-batches of loss_normaliser(loss_type, mb_mask, L)``, call backward on each
   micro-batch's loss and do NOT divide by the number of micro-batches. The accumulated gradient is
   then exactly the one-big-batch gradient for all four types, however unevenly the step is split
   (adaptive micro-batching after an OOM must not change the update). Here bnpo and dapo coincide.
2. TRL's per-micro-batch semantics: leave ``num_items_in_batch`` None for grpo/bnpo/dr_grpo, so each
   micro-batch is normalised by its own count, and divide each loss by the number of micro-batches k.
   This equals one big batch for grpo and dr_grpo only when micro-batches have equal sizes, and for
   bnpo it is a mean of per-micro-batch token means. dapo always takes the step's token count
   (None means this micro-batch is the whole step).

Masked positions are excluded with ``torch.where``, not multiplication, so garbage log-probs at
padding (an overflowing ratio, -inf) cannot turn the loss into NaN.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]
LOSS_TYPES: tuple[str, ...] = get_args(LossType)  # what params' train.loss_type may name


@dataclass
class LossOutput:
    loss: Tensor  # scalar, differentiable w.r.t. logprobs
    # clip_frac_low / clip_frac_high / clip_frac_region: fraction of policy tokens where the clip binds
    # (r < 1 - ε_low with A < 0 / r > 1 + ε_high with A > 0 / either); ratio_mean/min/max over policy
    # tokens (1.0 when there are none); kl_mean over response tokens (0.0 without ref_logprobs);
    # kept_token_frac: policy tokens / response tokens.
    metrics: dict[str, float]


def loss_normaliser(loss_type: LossType, mask: Tensor, max_completion_length: int | None = None) -> float:
    """The denominator ``loss_type`` uses for a batch with response mask [B, T]; sum it over a step's
    micro-batches to get the step-wide ``num_items_in_batch`` (see the module docstring). A count,
    so it may be 0 for a batch without response tokens; ``grpo_loss`` divides by at least 1."""
    if loss_type == "grpo":
        return float(mask.shape[0])
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo needs max_completion_length")
        return float(mask.shape[0] * max_completion_length)
    if loss_type in ("bnpo", "dapo"):
        return float(mask.sum())
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


def grpo_loss(
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
) -> LossOutput:
    """The loss of one micro-batch. logprobs / old_logprobs / ref_logprobs / mask /
    entropy_keep_mask: [B, T]; advantages: [B].

    ``num_items_in_batch`` overrides the normaliser with a step-wide one in the loss type's own unit
    (``loss_normaliser``).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs")
    if logprobs.shape != mask.shape or advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"logprobs {tuple(logprobs.shape)}, mask {tuple(mask.shape)} and "
                         f"advantages {tuple(advantages.shape)} disagree")

    response = mask.bool()
    policy = response if entropy_keep_mask is None else response & entropy_keep_mask.bool()
    zero = logprobs.new_zeros(())

    old = logprobs.detach() if old_logprobs is None else old_logprobs
    ratio = torch.exp(torch.where(policy, logprobs - old, zero))
    adv = advantages.to(logprobs.dtype)[:, None]
    unclipped = ratio if delta is None else ratio.clamp(max=delta)
    clipped = ratio.clamp(1.0 - epsilon_low, 1.0 + epsilon_high)
    per_token = torch.where(policy, -torch.minimum(unclipped * adv, clipped * adv), zero)

    kl = None
    if ref_logprobs is not None:
        log_ref_ratio = torch.where(response, ref_logprobs - logprobs, zero)
        kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1.0  # 0 at masked positions
        if beta > 0:
            per_token = per_token + beta * kl

    if loss_type == "grpo":
        numerator = (per_token.sum(1) / response.sum(1).clamp(min=1)).sum()
    else:
        numerator = per_token.sum()
    if num_items_in_batch is None:
        num_items_in_batch = loss_normaliser(loss_type, mask, max_completion_length)
    loss = numerator / max(num_items_in_batch, 1.0)  # no tokens anywhere: a zero loss, not 0/0

    return LossOutput(loss, _metrics(ratio.detach(), advantages.detach(), response, policy,
                                     None if kl is None else kl.detach(), epsilon_low, epsilon_high))


def _metrics(ratio: Tensor, advantages: Tensor, response: Tensor, policy: Tensor, kl: Tensor | None,
             epsilon_low: float, epsilon_high: float) -> dict[str, float]:
    adv = advantages[:, None]
    low = (ratio < 1.0 - epsilon_low) & (adv < 0) & policy
    high = (ratio > 1.0 + epsilon_high) & (adv > 0) & policy
    n_policy = policy.sum().clamp(min=1)
    n_response = response.sum().clamp(min=1)
    has_policy = policy.any()
    one = ratio.new_ones(())
    values = torch.stack([
        low.sum() / n_policy,
        high.sum() / n_policy,
        (low | high).sum() / n_policy,
        torch.where(has_policy, torch.where(policy, ratio, 0.0).sum() / n_policy, one),
        torch.where(has_policy, ratio.masked_fill(~policy, torch.inf).min(), one),
        torch.where(has_policy, ratio.masked_fill(~policy, -torch.inf).max(), one),
        ratio.new_zeros(()) if kl is None else kl.sum() / n_response,  # kl is 0 off the response
        policy.sum() / n_response,
    ]).tolist()  # one device sync for all metrics
    names = ("clip_frac_low", "clip_frac_high", "clip_frac_region", "ratio_mean", "ratio_min", "ratio_max",
             "kl_mean", "kept_token_frac")
    return dict(zip(names, values))
