"""Group-relative advantages: each completion's reward minus its group's mean, optionally scaled.

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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

AdvantageScale = Literal["group", "batch", "none"]
ADVANTAGE_SCALES: tuple[str, ...] = get_args(AdvantageScale)  # what params' train.advantage_scale may name


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
