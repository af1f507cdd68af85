"""Fault injection, for the fault suite (tests/faults/) and the OOM tests: both hooks are inert unless
their environment variable is set, as in every normal run (then a hook costs one lookup).

Kills, ``GRPO_FAULT_KILL``: SIGKILL this process at a named point, so every kill test is deterministic
(exact places: mid-step, inside a checkpoint write, between an atomic folder's renames) instead of
racing a timer. SIGKILL is what a power cut or the kernel's OOM killer does: no ``finally``, no
``atexit``, no flush. Grammar, comma separated: ``point`` kills the first time the process reaches
``point``; ``point@N`` kills the N-th time (1-based, counted per process). Under torchrun,
``GRPO_FAULT_KILL_RANK=r`` limits the kills to rank r (one process of a data-parallel run dies, as one
host or GPU would).

Points:
- ``train.step``: a step's optimiser update is done, its checkpoint not yet written (the step is lost).
- ``checkpoint.write``: inside a checkpoint's temp folder: adapter written, optimiser state not yet.
- ``checkpoint.prune``: a new checkpoint is in place; older ones are not pruned yet, logs not rewritten.
- ``train.finish``: every step is checkpointed; the final adapter is not written yet.
- ``train.summary``: the final adapter is written; the summary figures are not in metrics/train/metrics.json.
- ``replace:<name>``: ``grpo.io.atomic_dir`` has filled its temp folder for ``<name>`` (``final``,
  ``sent``, ``prepared``, ``step-000003``, ...), and the old folder, if any, is moved aside; the new
  one is not renamed into place yet.
- ``sent.batch``: a SENT question batch is scored (and, every ``save_every`` questions, saved).
- ``evaluate.samples``: the per-sample outputs are written; the metrics file is not.

Out-of-memory, ``GRPO_FAULT_OOM`` (``FaultHook``): raise an out-of-memory error at chosen micro-batches,
so the adaptation of grpo/microbatch.py runs on CPU. Grammar, comma separated: ``phase:N`` fails call N
(0-based) of a phase, ``phase:size>K`` fails every call of that phase with more than K rows,
``phase:all`` fails every call. Phases: ``generate``, ``score``, ``train``.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Any

KILL_ENV = "GRPO_FAULT_KILL"
RANK_ENV = "GRPO_FAULT_KILL_RANK"
FAULT_ENV = "GRPO_FAULT_OOM"
_hits: dict[str, int] = {}


def _rules(spec: str) -> list[tuple[str, int]]:
    rules = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        point, _, nth = part.partition("@")
        if not point or (nth and not nth.isdigit()) or nth == "0":
            raise ValueError(f"{KILL_ENV}: bad rule {part!r}; use point or point@N (N >= 1)")
        rules.append((point, int(nth) if nth else 1))
    return rules


def kill_point(name: str) -> None:
    """SIGKILL this process if ``GRPO_FAULT_KILL`` names ``name`` for this hit."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    if os.environ.get(RANK_ENV, os.environ.get("RANK", "0")) != os.environ.get("RANK", "0"):
        return
    hit = _hits[name] = _hits.get(name, 0) + 1
    if (name, hit) in _rules(spec):
        print(f"{KILL_ENV}: SIGKILL at {name} (hit {hit})", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def __getattr__(name: str) -> Any:
    """``InjectedOOM``, made when first asked for: it subclasses torch's out-of-memory error, and a
    module-level ``import torch`` here would load torch (seconds) into every module that only has kill
    points (grpo/io.py, and through it the stages that never touch a model)."""
    if name != "InjectedOOM":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in globals():
        return globals()[name]
    import torch

    class InjectedOOM(torch.OutOfMemoryError):
        """Raised by the fault hook; handled exactly like a real CUDA out-of-memory error."""

    InjectedOOM.__module__, InjectedOOM.__qualname__ = __name__, name
    globals()[name] = InjectedOOM
    return InjectedOOM


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
                raise __getattr__("InjectedOOM")(f"injected out-of-memory in {phase} call {index} (size {size})")
