"""Adaptive micro-batches: on out-of-memory, free memory, halve the micro-batch and redo the same work.

Nothing is dropped and nothing is counted twice: the caller's work function must be a pure function
of its rows (the loss is normalised over the whole optimiser step, not the micro-batch, so the split
does not change the gradient), and gradients accumulated by a micro-batch that failed half-way are
rolled back to their values before it. After ``grow_after`` clean steps the size doubles again, up to
the configured maximum.

The fault hook (``GRPO_FAULT_OOM``) raises an out-of-memory error at chosen micro-batches, so all of
this runs on CPU in tests. Grammar, comma separated: ``phase:N`` fails call N (0-based) of a phase,
``phase:size>K`` fails every call of that phase with more than K rows, ``phase:all`` fails every call.
Phases: ``generate``, ``score``, ``train``. Generation adapts inside the engine
(``grpo.rollout.native.NativeEngine``, with the same ``AdaptiveBatchSize`` and hook): it redoes only
the rows that had not finished, and its per-row keyed sampling makes the split invisible in the
outputs; ``run_in_micro_batches`` serves the scoring and training passes.
"""
from __future__ import annotations

import gc
import logging
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

import torch

log = logging.getLogger(__name__)
T = TypeVar("T")
FAULT_ENV = "GRPO_FAULT_OOM"
STEP_START_HOOKS: list[Callable[[], None]] = []  # called as each training step starts (a profiler's schedule)


class InjectedOOM(torch.OutOfMemoryError):
    """Raised by the fault hook; handled exactly like a real CUDA out-of-memory error."""


class FaultHook:
    def __init__(self, spec: str | None = None) -> None:
        spec = os.environ.get(FAULT_ENV, "") if spec is None else spec
        self.rules: list[tuple[str, str]] = []
        for part in filter(None, (p.strip() for p in spec.split(","))):
            phase, _, rule = part.partition(":")
            if not rule or not (rule == "all" or rule.isdigit() or rule.startswith("size>")):
                raise ValueError(f"{FAULT_ENV}: bad rule {part!r}; use phase:N, phase:size>K or phase:all")
            self.rules.append((phase, rule))
        self.calls: dict[str, int] = {}

    def check(self, phase: str, size: int) -> None:
        index = self.calls.get(phase, 0)
        self.calls[phase] = index + 1
        for rule_phase, rule in self.rules:
            if rule_phase != phase:
                continue
            hit = (rule == "all" or (rule.isdigit() and int(rule) == index)
                   or (rule.startswith("size>") and size > int(rule[5:])))
            if hit:
                raise InjectedOOM(f"injected out-of-memory in {phase} call {index} (size {size})")


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class AdaptiveBatchSize:
    """One phase's micro-batch size: halves on OOM, doubles back after ``grow_after`` clean calls of
    ``run_in_micro_batches`` (one per step and phase; μ per step for training with num_iterations μ)."""

    phase: str
    maximum: int
    grow_after: int = 4
    # what to change when even one row does not fit (the error's last words)
    advice: str = "lower max_response_length or group_size, or use a smaller model. The last checkpoint is intact."
    current: int = 0
    clean_steps: int = 0
    oom_events: int = 0
    history: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.current = self.current or self.maximum

    def shrink(self, step: int | None = None) -> None:
        """Halve the size after an out-of-memory error at ``step`` (None: outside a training step)."""
        at = "" if step is None else f" at step {step}"
        if self.current == 1:
            raise torch.OutOfMemoryError(f"out of memory in {self.phase} at micro-batch size 1{at}; {self.advice}")
        self.current = max(1, self.current // 2)
        self.clean_steps = 0
        self.oom_events += 1
        self.history.append({"step": step, "phase": self.phase, "new_size": self.current})
        log.warning("OOM in %s%s: micro-batch size -> %d", self.phase, at, self.current)

    def end_step(self, had_oom: bool) -> None:
        if had_oom:
            return
        self.clean_steps += 1
        if self.clean_steps >= self.grow_after and self.current < self.maximum:
            self.current = min(self.maximum, self.current * 2)
            self.clean_steps = 0

    def state(self) -> dict:
        return {"current": self.current, "clean_steps": self.clean_steps, "oom_events": self.oom_events}

    def load_state(self, state: dict) -> None:
        self.current = min(self.maximum, state["current"])
        self.clean_steps, self.oom_events = state["clean_steps"], state["oom_events"]


def run_in_micro_batches(
    items: Sequence[T],
    work: Callable[[Sequence[T]], object],
    size: AdaptiveBatchSize,
    hook: FaultHook,
    *,
    step: int,
    params_with_grad: Sequence[torch.nn.Parameter] = (),
) -> list[object]:
    """Run ``work`` over consecutive slices of ``items``; returns the results in order."""
    results: list[object] = []
    start, had_oom = 0, False
    while start < len(items):
        chunk = items[start : start + size.current]
        saved = [None if p.grad is None else p.grad.clone() for p in params_with_grad]
        try:
            hook.check(size.phase, len(chunk))
            with torch.profiler.record_function(f"grpo/{size.phase}_micro_batch"):
                results.append(work(chunk))
        except torch.OutOfMemoryError:
            for p, g in zip(params_with_grad, saved):
                p.grad = g  # undo what a half-finished backward added
            free_memory()
            size.shrink(step)
            had_oom = True
            continue
        start += len(chunk)
    size.end_step(had_oom)
    return results


@contextmanager
def phase_peak_memory(metrics: dict[str, float], phase: str, device: torch.device) -> Iterator[None]:
    """Record the peak memory of the block: ``peak_memory_gib/<phase>``, the CUDA allocator's peak
    during the block; on CPU, where no peak can be reset, the process's peak resident set so far. The
    block is also labelled ``grpo/<phase>`` for the profiler (grpo/profile.py; free when none runs)."""
    if phase == "generate":  # a step begins: grpo/profile.py steps its profiler's schedule here
        for hook in STEP_START_HOOKS:
            hook()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with torch.profiler.record_function(f"grpo/{phase}"):  # the phase's label in a `grpo.profile` trace
        yield
    if device.type == "cuda":
        metrics[f"peak_memory_gib/{phase}"] = torch.cuda.max_memory_allocated(device) / 2**30
    else:  # ru_maxrss is in KiB on Linux
        metrics[f"peak_memory_gib/{phase}"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
