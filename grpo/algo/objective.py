"""The GRPO objective as pure tensor functions, in the order the step uses them: group-relative
advantages, the entropy keep-mask, the clipped policy loss. No model, tokenizer or device knowledge.

Advantages. Group-relative advantages: each completion's reward minus its group's mean, optionally scaled.

Rewards arrive flat, G consecutive completions per prompt: [p0 c0, p0 c1, ..., p1 c0, ...].
Scaling follows TRL's ``scale_rewards``:
    group  A = (r - mean_g) / (std_g + eps)    GRPO (Shao et al. 2024)
    batch  A = (r - mean_g) / (std_all + eps)  centred per group, one scale for the batch (Liu et al. 2025)
    none   A = r - mean_g                      Dr. GRPO: no std division, no difficulty bias
Standard deviations are unbiased (Bessel), like ``torch.std`` and TRL. A group whose rewards are all
equal has exactly zero advantage whatever the scaling: it carries no policy-gradient signal. Group
statistics are computed in float64 and such groups are zeroed explicitly, because in float32 an
inexact group mean leaves a residue (+2.98e-4 for eight rewards of 0.3 under group scaling) and a
std of ~3e-8 that the zero-std test would judge differently depending on the batch's shape.

Entropy keep-mask. Selective backprop on high-entropy tokens ("forking tokens", Wang et al. 2025, "Beyond the 80/20
rule"; TRL's ``top_entropy_quantile``): the policy-gradient term is kept only for the top-ρ fraction
of response tokens by the current policy's entropy.

The threshold is an exact order statistic, not TRL's interpolated ``torch.quantile(H, 1 - ρ)``: with
n response tokens, k = ⌈ρ·n⌉ of them are kept, all of them when there are no ties. Ties at the
threshold are kept, so ties can only add tokens. Compute the threshold once over the whole optimiser
step (every micro-batch's response entropies concatenated) so the selection does not depend on how
the step is split into micro-batches; then build each micro-batch's mask from it.

Policy loss. The clipped GRPO policy loss with an optional k3 KL penalty, in TRL's four aggregations.

Per response token t of sequence b, with ratio r = exp(logprob - old_logprob) and advantage A_b:

    policy_bt = -min(min(r, δ)·A, clip(r, 1 - ε_low, 1 + ε_high)·A)        (δ only if given)
    kl_bt     = exp(ref - logprob) - (ref - logprob) - 1                   (k3, Schulman 2020; ≥ 0)
    loss_bt   = keep_bt·policy_bt + β·kl_bt

δ caps the ratio in the unclipped term, as TRL's ``delta`` does: when A < 0 the min would otherwise
pick r·A for any large r, so one stale token could contribute an unbounded loss (for A > 0 the clip
already binds at 1 + ε_high < δ). ``keep`` is the entropy mask (above); like TRL it
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

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from grpo.algo.choices import LOSS_TYPES, AdvantageScale, LossType


# --- advantages ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvantageResult:
    advantages: Tensor  # [num_prompts * G], fp32
    group_std: Tensor  # [num_prompts], the unbiased reward std of each group
    zero_std_mask: Tensor  # [num_prompts] bool, groups whose rewards are all (numerically) equal
    frac_reward_zero_std: float  # fraction of groups with zero std, whatever the scaling


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2, got {group_size}")
    if rewards.dim() != 1 or rewards.numel() == 0 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of {group_size} entries, got {tuple(rewards.shape)}")
    return rewards.double().view(-1, group_size)


def _zero_std(group_std: Tensor) -> Tensor:
    # TRL's test (atol 1e-8), on a float64 std: float noise in the rewards (0.1 + 0.2 vs 0.3) counts
    # as zero, and no float32 rounding of the mean can push an equal group over the tolerance
    return torch.isclose(group_std, torch.zeros_like(group_std))


def compute_advantages(
    rewards: Tensor, group_size: int, scale: AdvantageScale = "group", eps: float = 1e-4
) -> AdvantageResult:
    """Advantages for rewards [num_prompts * group_size]; ``eps`` keeps zero-std divisions finite."""
    groups = _grouped(rewards, group_size)
    group_std = groups.std(dim=1)
    zero = _zero_std(group_std)
    centred = (groups - groups.mean(dim=1, keepdim=True)).masked_fill(zero[:, None], 0.0)
    if scale == "group":
        advantages = centred / (group_std[:, None] + eps)
    elif scale == "batch":
        advantages = centred / (groups.std() + eps)
    elif scale == "none":
        advantages = centred
    else:
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    return AdvantageResult(advantages.reshape(-1).float(), group_std.float(), zero,
                           float(zero.double().mean()))


def skip_zero_variance(rewards: Tensor, group_size: int) -> Tensor:
    """Bool [num_prompts]: the groups to keep when zero-variance groups are skipped (DAPO's dynamic
    sampling, without the resampling). Their advantages are zero, so dropping them changes no
    policy gradient directly; it stops them diluting the token/sequence normalisers and the KL term.
    Expand to completions with ``keep.repeat_interleave(group_size)``."""
    return ~_zero_std(_grouped(rewards, group_size).std(dim=1))


# --- entropy keep-mask ----------------------------------------------------------------------------
def entropy_threshold(entropies: Tensor, keep_fraction: float) -> float:
    """The k-th largest of ``entropies`` (1-D, response tokens only), k = ⌈keep_fraction·n⌉.

    Returns -inf for keep_fraction 1 (keep everything) and +inf when there are no tokens.
    """
    if not 0.0 < keep_fraction <= 1.0:
        raise ValueError(f"keep_fraction must be in (0, 1], got {keep_fraction}")
    if entropies.dim() != 1:
        raise ValueError(f"entropies must be 1-D (response tokens only), got shape {tuple(entropies.shape)}")
    n = entropies.numel()
    if keep_fraction == 1.0:
        return -math.inf
    if n == 0:
        return math.inf
    # round first so that e.g. 0.07 * 100 = 7.000000000000001 keeps 7, not 8
    k = min(n, max(1, math.ceil(round(keep_fraction * n, 6))))
    return float(torch.kthvalue(entropies.float(), n - k + 1).values)


def keep_mask_from_threshold(entropy: Tensor, mask: Tensor, threshold: float, min_per_sequence: int) -> Tensor:
    """Bool [B, T]: response tokens with entropy ≥ threshold, plus each sequence's
    ``min_per_sequence`` highest-entropy response tokens (so no sequence loses its whole policy
    gradient). Positions outside ``mask`` are never kept."""
    if min_per_sequence < 0:
        raise ValueError(f"min_per_sequence must be non-negative, got {min_per_sequence}")
    response = mask.bool()
    keep = (entropy >= threshold) & response
    k = min(min_per_sequence, entropy.shape[1])
    if k > 0:
        ranked = entropy.float().masked_fill(~response, -math.inf)
        top = ranked.topk(k, dim=1).indices
        # rows with fewer than k response tokens pick masked positions too; `& response` drops them
        keep |= torch.zeros_like(keep).scatter_(1, top, True) & response
    return keep


# --- policy loss ----------------------------------------------------------------------------------


METRIC_NAMES = ("clip_frac_low", "clip_frac_high", "clip_frac_region", "ratio_mean", "ratio_min", "ratio_max",
                "kl_mean", "kept_token_frac")


@dataclass
class LossOutput:
    loss: Tensor  # scalar, differentiable w.r.t. logprobs
    # METRIC_NAMES' values, detached, on the loss's device: reading them waits for the GPU, so a step reads
    # its micro-batches' values once, after its backward passes (grpo.train.step.policy_updates).
    # clip_frac_low / clip_frac_high / clip_frac_region: fraction of policy tokens where the clip binds
    # (r < 1 - ε_low with A < 0 / r > 1 + ε_high with A > 0 / either); ratio_mean/min/max over policy
    # tokens (1.0 when there are none); kl_mean over response tokens (0.0 without ref_logprobs);
    # kept_token_frac: policy tokens / response tokens.
    metric_values: Tensor

    @property
    def metrics(self) -> dict[str, float]:
        return dict(zip(METRIC_NAMES, self.metric_values.tolist()))


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
             epsilon_low: float, epsilon_high: float) -> Tensor:
    adv = advantages[:, None]
    low = (ratio < 1.0 - epsilon_low) & (adv < 0) & policy
    high = (ratio > 1.0 + epsilon_high) & (adv > 0) & policy
    n_policy = policy.sum().clamp(min=1)
    n_response = response.sum().clamp(min=1)
    has_policy = policy.any()
    one = ratio.new_ones(())
    return torch.stack([  # in METRIC_NAMES' order
        low.sum() / n_policy,
        high.sum() / n_policy,
        (low | high).sum() / n_policy,
        torch.where(has_policy, torch.where(policy, ratio, 0.0).sum() / n_policy, one),
        torch.where(has_policy, ratio.masked_fill(~policy, torch.inf).min(), one),
        torch.where(has_policy, ratio.masked_fill(~policy, -torch.inf).max(), one),
        ratio.new_zeros(()) if kl is None else kl.sum() / n_response,  # kl is 0 off the response
        policy.sum() / n_response,
    ]).float()
