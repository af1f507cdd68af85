"""The entropy keep-mask: exact top-ρ fraction, per-sequence minimum, ties, padding."""
from __future__ import annotations

import math

import pytest
import torch

from grpo.algo.objective import entropy_threshold, keep_mask_from_threshold


def entropy_keep_mask(entropy: torch.Tensor, mask: torch.Tensor, keep_fraction: float, min_per_sequence: int) -> torch.Tensor:
    """The keep-mask with the threshold over this batch's response tokens (the step does the same over
    the whole step's tokens, grpo/train/step.py)."""
    threshold = entropy_threshold(entropy[mask.bool()], keep_fraction)
    return keep_mask_from_threshold(entropy, mask, threshold, min_per_sequence)


def random_batch(seed: int = 0, rows: int = 6, width: int = 40):
    g = torch.Generator().manual_seed(seed)
    entropy = torch.rand(rows, width, generator=g) * 3  # continuous: no ties
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    return entropy, mask


@pytest.mark.parametrize("rho", [0.05, 0.2, 0.5, 0.7, 0.99])
def test_exact_fraction_and_order(rho):
    entropy, mask = random_batch()
    keep = entropy_keep_mask(entropy, mask, rho, min_per_sequence=0)
    n = int(mask.sum())
    assert keep.sum() == math.ceil(rho * n)
    response = mask.bool()
    assert not (keep & ~response).any()
    assert entropy[keep].min() > entropy[response & ~keep].max()


def test_fraction_rounding_is_not_fooled_by_float_error():
    assert 0.07 * 100 > 7  # 7.000000000000001
    entropies = torch.arange(100.0)
    assert entropy_threshold(entropies, 0.07) == 93.0  # keeps 93..99: seven tokens, not eight


def test_min_per_sequence():
    entropy = torch.tensor([[5.0, 6.0, 7.0, 8.0],
                            [0.1, 0.3, 0.2, 9.0],   # 9.0 sits on padding: never kept
                            [0.4, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]])
    keep = entropy_keep_mask(entropy, mask, 0.25, min_per_sequence=2)  # 8 tokens -> top 2
    assert keep.tolist() == [[False, False, True, True],
                             [False, True, True, False],   # its two highest response tokens
                             [True, False, False, False]]  # shorter than the minimum: all it has


def test_ties_at_the_threshold_are_kept():
    entropy = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.5]])
    mask = torch.ones_like(entropy)
    keep = entropy_keep_mask(entropy, mask, 0.4, min_per_sequence=0)  # k = 2, threshold 2.0
    assert keep.tolist() == [[False, True, True, True, False]]


def test_rho_one_keeps_every_response_token():
    entropy, mask = random_batch(1)
    assert entropy_threshold(entropy[mask.bool()], 1.0) == -math.inf
    assert torch.equal(entropy_keep_mask(entropy, mask, 1.0, 0), mask.bool())


def test_step_wide_threshold_matches_the_whole_batch():
    entropy, mask = random_batch(2)
    whole = entropy_keep_mask(entropy, mask, 0.3, min_per_sequence=1)
    threshold = entropy_threshold(torch.cat([entropy[:2][mask[:2].bool()], entropy[2:][mask[2:].bool()]]), 0.3)
    parts = [keep_mask_from_threshold(entropy[s], mask[s], threshold, 1) for s in (slice(0, 2), slice(2, 6))]
    assert torch.equal(torch.cat(parts), whole)


def test_edge_cases():
    assert entropy_threshold(torch.zeros(0), 0.2) == math.inf
    with pytest.raises(ValueError, match="keep_fraction"):
        entropy_threshold(torch.ones(3), 0.0)
    with pytest.raises(ValueError, match="1-D"):
        entropy_threshold(torch.ones(2, 2), 0.5)
