"""Group-relative advantages under each scaling, against hand numbers."""
from __future__ import annotations

import math
import statistics

import pytest
import torch

from grpo.algo.objective import compute_advantages, skip_zero_variance

# three prompts, G = 4: a split group, a constant group, a spread group
REWARDS = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 0.0, 1.0, 2.0, 3.0]
MEANS = [0.5, 2.0, 1.5]
STDS = [math.sqrt(1 / 3), 0.0, math.sqrt(5 / 3)]  # unbiased: Σ(r - mean)² / (G - 1)
EPS = 1e-4


def centred() -> list[float]:
    return [r - MEANS[i // 4] for i, r in enumerate(REWARDS)]


def test_group_scaling():
    out = compute_advantages(torch.tensor(REWARDS), 4, "group")
    want = [c / (STDS[i // 4] + EPS) for i, c in enumerate(centred())]
    torch.testing.assert_close(out.advantages, torch.tensor(want))
    torch.testing.assert_close(out.group_std, torch.tensor(STDS))
    assert out.advantages[0].item() == pytest.approx(0.5 / (0.57735027 + EPS))
    assert out.advantages[4:8].eq(0).all()


def test_batch_scaling_centres_per_group_and_scales_by_the_batch_std():
    out = compute_advantages(torch.tensor(REWARDS), 4, "batch")
    batch_std = statistics.stdev(REWARDS)
    torch.testing.assert_close(out.advantages, torch.tensor([c / (batch_std + EPS) for c in centred()]))


def test_no_scaling_is_dr_grpo():
    out = compute_advantages(torch.tensor(REWARDS), 4, "none")
    torch.testing.assert_close(out.advantages, torch.tensor(centred()))
    assert out.advantages[8:].tolist() == [-1.5, -0.5, 0.5, 1.5]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_zero_std_groups(scale):
    out = compute_advantages(torch.tensor(REWARDS), 4, scale)
    assert out.zero_std_mask.tolist() == [False, True, False]
    assert out.frac_reward_zero_std == pytest.approx(1 / 3)


def test_float_noise_counts_as_zero_std():
    noisy = torch.tensor([0.1 + 0.2, 0.3, 0.3, 0.30000000000000004], dtype=torch.float64)
    assert compute_advantages(noisy, 4).zero_std_mask.tolist() == [True]


def test_skip_zero_variance_keeps_groups_with_signal():
    keep = skip_zero_variance(torch.tensor(REWARDS), 4)
    assert keep.tolist() == [True, False, True]
    assert keep.repeat_interleave(4).sum() == 8


def test_bad_inputs():
    with pytest.raises(ValueError, match="multiple of 4"):
        compute_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="at least 2"):
        compute_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="scale"):
        compute_advantages(torch.zeros(4), 2, "rank")  # type: ignore[arg-type]


# the float32 cases: an inexact group mean left +2.98e-4 (eight rewards of 0.3) and -1.19e-3
# (sixteen of 1.3) under group scaling, and a single prompt's std of 3.2e-8 failed the zero-std test
UNIFORM = [(0.3, 8), (1.3, 16)]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("value,group_size", UNIFORM)
def test_uniform_groups_get_exactly_zero_advantage(scale, value, group_size):
    single = torch.full((group_size,), value, dtype=torch.float32)
    out = compute_advantages(single, group_size, scale)
    assert out.advantages.eq(0).all(), out.advantages
    assert out.zero_std_mask.tolist() == [True]
    assert out.frac_reward_zero_std == 1.0


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("value,group_size", UNIFORM)
def test_zero_std_does_not_depend_on_the_batch_shape(scale, value, group_size):
    # the uniform group alone, first of two, and last of three beside groups with spread
    spread = [float(i % 2) for i in range(group_size)]
    uniform = [value] * group_size
    for layout, index in (([uniform], 0), ([uniform, spread], 0), ([spread, spread, uniform], 2)):
        rewards = torch.tensor([r for g in layout for r in g], dtype=torch.float32)
        out = compute_advantages(rewards, group_size, scale)
        assert out.zero_std_mask.tolist() == [g is uniform for g in layout]
        assert out.advantages.view(-1, group_size)[index].eq(0).all()
        assert skip_zero_variance(rewards, group_size).tolist() == [g is not uniform for g in layout]
