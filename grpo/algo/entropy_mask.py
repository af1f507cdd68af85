"""Selective backprop on high-entropy tokens ("forking tokens", Wang et al. 2025, "Beyond the 80/20
rule"; TRL's ``top_entropy_quantile``): the policy-gradient term is kept only for the top-ρ fraction
of response tokens by the current policy's entropy.

The threshold is an exact order statistic, not TRL's interpolated ``torch.quantile(H, 1 - ρ)``: with
n response tokens, k = ⌈ρ·n⌉ of them are kept, all of them when there are no ties. Ties at the
threshold are kept, so ties can only add tokens. Compute the threshold once over the whole optimiser
step (every micro-batch's response entropies concatenated) so the selection does not depend on how
the step is split into micro-batches; then build each micro-batch's mask from it.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


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
