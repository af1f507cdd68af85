"""Test-only fault injection: SIGKILL this process at a named point (``GRPO_FAULT_KILL``).

The fault suite (tests/faults/) kills stages at exact places (mid-step, inside a checkpoint write,
between an atomic folder's renames) instead of racing a timer, so every kill test is deterministic.
SIGKILL is what a power cut or the kernel's OOM killer does: no ``finally``, no ``atexit``, no flush.

Grammar, comma separated: ``point`` kills the first time the process reaches ``point``; ``point@N``
kills the N-th time (1-based, counted per process). Unset, as in every normal run, a point costs one
environment lookup. Under torchrun, ``GRPO_FAULT_KILL_RANK=r`` limits the kills to rank r (one process
of a data-parallel run dies, as one host or GPU would). The out-of-memory hook is ``GRPO_FAULT_OOM`` (grpo/train/memory.py).

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
"""
from __future__ import annotations

import os
import signal
import sys

KILL_ENV = "GRPO_FAULT_KILL"
RANK_ENV = "GRPO_FAULT_KILL_RANK"
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
