"""Adaptive micro-batches: on out-of-memory, free memory, halve the micro-batch and redo the same rows.

The step iterates over ``micro_batches(...)`` and does its work inside ``with chunk:``; an
out-of-memory error raised there (a real one, or ``FaultHook``'s, grpo/fault_injection.py) is caught by
the chunk, which rolls back the gradients it added, halves the size, and the loop yields the same rows
again in smaller pieces. Nothing is dropped and nothing is counted twice: the work must be a pure
function of its rows (the loss is normalised over the whole optimiser step, not the micro-batch, so the
split does not change the gradient). After ``grow_after`` clean steps the size doubles again, up to the
configured maximum. Generation adapts inside the engine (``grpo.rollout.native.NativeEngine``, with the
same ``AdaptiveBatchSize`` and hook): it redoes only the rows that had not finished, and its per-row
keyed sampling makes the split invisible in the outputs.
"""
from __future__ import annotations

import gc
import logging
import resource
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Sequence

import torch

from grpo.fault_injection import FaultHook

log = logging.getLogger(__name__)
STEP_START_HOOKS: list[Callable[[], None]] = []  # called as each training step starts (a profiler's schedule)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class AdaptiveBatchSize:
    """One phase's micro-batch size: halves on OOM, doubles back after ``grow_after`` clean passes of
    ``micro_batches`` (one per step and phase; μ per step for training with num_iterations μ)."""

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


class MicroBatch:
    """One slice of rows; ``with chunk:`` around its work turns an out-of-memory error into a retry."""

    def __init__(self, rows: range, size: AdaptiveBatchSize, step: int,
                 params_with_grad: Sequence[torch.nn.Parameter]) -> None:
        self.rows, self.size, self.step, self.params = rows, size, step, params_with_grad
        self.failed = False
        # the gradients before this chunk's work, to roll back to if it fails half-way
        self._saved = [None if p.grad is None else p.grad.clone() for p in params_with_grad]

    @property
    def slice(self) -> slice:
        return slice(self.rows.start, self.rows.stop)

    def __enter__(self) -> MicroBatch:
        # the chunk's label in a `grpo.profile` trace (grpo/profile.py; free when no profiler runs)
        self._label = torch.profiler.record_function(f"grpo/{self.size.phase}_micro_batch")
        self._label.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> bool:
        self._label.__exit__(kind, error, tb)
        if kind is None or not issubclass(kind, torch.OutOfMemoryError):
            return False
        self.recover()
        return True

    def recover(self) -> None:
        """After an out-of-memory error: roll the gradients back, free memory, halve the size (at size 1
        this raises the final, clear error); the rows come again."""
        for p, g in zip(self.params, self._saved):
            p.grad = g  # undo what a half-finished backward added
        free_memory()
        self.size.shrink(self.step)
        self.failed = True


def micro_batches(n_rows: int, size: AdaptiveBatchSize, hook: FaultHook, *, step: int,
                  params_with_grad: Sequence[torch.nn.Parameter] = ()) -> Iterator[MicroBatch]:
    """Consecutive slices of ``range(n_rows)`` at the phase's current size; a slice whose work failed
    with out-of-memory (inside ``with chunk:``) comes again, smaller. Ends the phase's step in ``size``."""
    start, had_oom = 0, False
    while start < n_rows:
        chunk = MicroBatch(range(start, min(n_rows, start + size.current)), size, step, params_with_grad)
        try:
            hook.check(size.phase, len(chunk.rows))
        except torch.OutOfMemoryError:
            chunk.recover()
        if not chunk.failed:
            yield chunk
        if chunk.failed:
            had_oom = True
            continue
        start = chunk.rows.stop
    size.end_step(had_oom)


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
