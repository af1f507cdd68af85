"""Adaptive micro-batches: OOM → halve and retry the same rows; gradients identical; size 1 fails clearly."""
from __future__ import annotations

import pytest
import torch

from grpo.fault_injection import FaultHook, InjectedOOM
from grpo.microbatch import AdaptiveBatchSize, micro_batches, phase_peak_memory


def test_fault_hook_grammar():
    hook = FaultHook("train:1,score:size>2")
    hook.check("train", 8)
    with pytest.raises(InjectedOOM):
        hook.check("train", 8)  # call 1
    hook.check("train", 8)
    hook.check("score", 2)
    with pytest.raises(InjectedOOM):
        hook.check("score", 3)
    with pytest.raises(ValueError, match="bad rule"):
        FaultHook("train:sometimes")


def accumulate(weights: torch.nn.Parameter, data: torch.Tensor, spec: str, size: int) -> tuple[torch.Tensor, AdaptiveBatchSize]:
    weights.grad = None
    sizer = AdaptiveBatchSize("train", size)

    for chunk in micro_batches(len(data), sizer, FaultHook(spec), step=0, params_with_grad=[weights]):
        with chunk:
            x = data[chunk.slice]
            loss = (x @ weights).pow(2).sum() / len(data)  # normalised over all rows, not the micro-batch
            loss.backward()
    return weights.grad.clone(), sizer


def test_oom_storm_gives_the_same_gradient():
    torch.manual_seed(0)
    weights = torch.nn.Parameter(torch.randn(5))
    data = torch.randn(8, 5)
    clean, _ = accumulate(weights, data, "", 8)
    stormy, sizer = accumulate(weights, data, "train:size>1", 8)
    torch.testing.assert_close(stormy, clean)
    assert sizer.current == 1 and sizer.oom_events == 3  # 8 → 4 → 2 → 1


def test_oom_half_way_through_backward_is_rolled_back():
    """A failure after some gradient was added must not count that micro-batch twice."""
    torch.manual_seed(0)
    weights = torch.nn.Parameter(torch.randn(3))
    data = torch.randn(4, 3)
    expected, _ = accumulate(weights, data, "", 2)
    weights.grad = None
    sizer, calls = AdaptiveBatchSize("train", 2), {"n": 0}

    for chunk in micro_batches(4, sizer, FaultHook(""), step=0, params_with_grad=[weights]):
        with chunk:
            loss = (data[chunk.slice] @ weights).pow(2).sum() / len(data)
            loss.backward()
            calls["n"] += 1
            if calls["n"] == 2:
                raise torch.OutOfMemoryError("after backward")
    torch.testing.assert_close(weights.grad, expected)


def test_oom_at_size_one_is_a_clear_error():
    sizer = AdaptiveBatchSize("train", 2)
    with pytest.raises(torch.OutOfMemoryError, match="micro-batch size 1"):
        for chunk in micro_batches(4, sizer, FaultHook("train:all"), step=3):
            with chunk:
                pass


def test_size_grows_back_after_clean_steps():
    sizer = AdaptiveBatchSize("generate", 8, grow_after=2)
    sizer.shrink(step=0)
    sizer.shrink(step=0)
    assert sizer.current == 2
    for _ in range(2):
        sizer.end_step(had_oom=False)
    assert sizer.current == 4


def test_phase_peak_memory_on_cpu_is_the_process_high_water_mark():
    """On CPU the recorded peak is ru_maxrss: it covers a 256 MiB block allocated inside the phase."""
    metrics: dict[str, float] = {}
    with phase_peak_memory(metrics, "generate", torch.device("cpu")):
        block = torch.ones(64, 2**20)  # 256 MiB, touched
        del block
    with open("/proc/self/status") as f:
        rss_now = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 2**20
    assert set(metrics) == {"peak_memory_gib/generate"}
    assert metrics["peak_memory_gib/generate"] >= rss_now + 0.24  # the block was freed, the peak remains
