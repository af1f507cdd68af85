"""Choose the best training checkpoint from the in-training validation log, and from nothing else.

The benchmark suite is a test set: choosing the checkpoint by a benchmark score would leak it into the
model and inflate the very numbers the report compares. So this module reads only the validation log,
the ``eval/`` metrics of the train stage's DVCLive folder (``metrics/train/plots/metrics/eval/<metric>.tsv``,
one row per validated step; grpo/trainlog.py), and never looks at ``eval/`` or ``metrics/eval*``.

Candidates are the log's rows whose ``checkpoints/<checkpoint>/adapter/`` folder exists and loads;
a pruned, missing or corrupt one is skipped with a warning and listed as unavailable, so a partly
cleaned checkpoint folder still yields the best of what is left. The chosen adapter is copied into
``models/best/`` together with ``SELECTION.json`` (the choice, the rule and the whole candidate table).
"""
from __future__ import annotations

import json
import logging
import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grpo.io import atomic_dir, atomic_write_json
from grpo.train.checkpoint import checkpoint_name
from grpo.trainlog import read_table

log = logging.getLogger(__name__)
SELECTION_FILE = "SELECTION.json"


@dataclass(frozen=True)
class Candidate:
    step: int
    checkpoint: str
    value: float | None  # None when the logged value is not a finite number
    available: bool
    problem: str = ""  # why it is unavailable


@dataclass(frozen=True)
class Selection:
    chosen: Candidate
    metric: str
    mode: str
    tie: str
    candidates: list[Candidate]

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.chosen.step, "checkpoint": self.chosen.checkpoint, "metric": self.metric,
            "value": self.chosen.value, "mode": self.mode, "tie": self.tie,
            "candidates": [asdict(c) for c in self.candidates],
            "unavailable": [c.checkpoint for c in self.candidates if not c.available],
        }


def read_validation_log(folder: Path, metric: str) -> list[dict]:
    """The log's rows (``step`` and each validation metric); raises with a clear message when it is
    missing, empty or lacks ``metric``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"validation log {folder} not found: the train stage writes it (DVCLive) when "
                                "train.val_every <= train.max_steps")
    rows = read_table(folder)
    if not rows:
        raise ValueError(f"validation log {folder} has no rows: nothing to select from")
    metrics = sorted({key for row in rows for key in row} - {"step"})
    if metric not in metrics:
        raise ValueError(f"select.metric: {metric!r} is not in the validation log {folder} (no {metric}.tsv); "
                         f"available metrics: {', '.join(metrics)}")
    return rows


def adapter_problem(folder: Path) -> str:
    """Why ``folder`` is not a loadable PEFT adapter, or "" when it is one."""
    config, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not folder.is_dir():
        return f"{folder} does not exist (pruned or never written)"
    try:
        json.loads(config.read_text(encoding="utf-8"))
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as fh:  # reading every tensor catches truncation
            for key in fh.keys():
                fh.get_tensor(key)
    except Exception as exc:  # any unreadable file makes the adapter unusable, whatever the error
        return f"{folder} is unreadable: {exc}"
    return ""


def _parse_value(logged: float | str | None) -> float | None:
    """A finite number, or None: not logged at that step, or logged as "nan"/"inf" or a string."""
    return logged if isinstance(logged, float) and math.isfinite(logged) else None


def load_candidates(log_dir: Path, checkpoints_dir: Path, metric: str) -> list[Candidate]:
    """One candidate per log row, in step order, each marked available or not (with the reason)."""
    candidates = []
    for row in read_validation_log(log_dir, metric):
        step = int(row["step"])
        name = checkpoint_name(step)
        value = _parse_value(row.get(metric))
        problem = adapter_problem(Path(checkpoints_dir) / name / "adapter")
        if not problem and value is None:
            problem = f"{metric} is not a number ({row.get(metric, 'not logged')!r})"
        if problem:
            log.warning("select: skipping %s: %s", name, problem)
        candidates.append(Candidate(step, name, value, not problem, problem))
    return sorted(candidates, key=lambda c: c.step)


def choose(candidates: list[Candidate], mode: str, tie: str) -> Candidate:
    """The available candidate with the max (or min) value; among equal values the earliest or latest step."""
    usable = [c for c in candidates if c.available]
    if not usable:
        problems = "; ".join(f"{c.checkpoint}: {c.problem}" for c in candidates)
        raise ValueError(f"no checkpoint of the validation log is available: {problems}")
    best = (max if mode == "max" else min)(c.value for c in usable)
    # values come back from a text file, so compare with a tolerance rather than bit for bit
    tied = [c for c in usable if math.isclose(c.value, best, rel_tol=1e-9, abs_tol=1e-12)]
    return min(tied, key=lambda c: c.step) if tie == "earliest" else max(tied, key=lambda c: c.step)


def select_checkpoint(log_dir: Path, checkpoints_dir: Path, *, metric: str, mode: str, tie: str) -> Selection:
    if mode not in ("max", "min") or tie not in ("earliest", "latest"):
        raise ValueError(f"select: mode must be max|min and tie earliest|latest; got {mode!r}, {tie!r}")
    candidates = load_candidates(log_dir, checkpoints_dir, metric)
    return Selection(choose(candidates, mode, tie), metric, mode, tie, candidates)


def write_best(selection: Selection, checkpoints_dir: Path, out_dir: Path) -> None:
    """Copy the chosen adapter to ``out_dir`` with SELECTION.json, all at once (temp folder, rename)."""
    source = Path(checkpoints_dir) / selection.chosen.checkpoint / "adapter"
    with atomic_dir(Path(out_dir)) as tmp:
        tmp = Path(tmp)
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        atomic_write_json(tmp / SELECTION_FILE, selection.to_json())
    log.info("select: %s (step %d) with %s = %s (%s, ties -> %s) -> %s", selection.chosen.checkpoint,
             selection.chosen.step, selection.metric, selection.chosen.value, selection.mode, selection.tie,
             out_dir)
