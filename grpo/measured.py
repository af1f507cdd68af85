"""What a run measured (seconds, tokens per second, peak memory): kept out of every tracked output.

DVC records a hash of each stage output in dvc.lock and ``dvc metrics diff`` compares the metrics
files, so both must be a function of the stage's inputs: on CPU, rerunning a stage on the same inputs
writes the same bytes, and ``dvc.lock`` does not change. Wall-clock and memory figures differ run to
run, so the stages write them to ``logs/`` instead: plain JSON files that git ignores and no stage
declares, the same layout on every machine. The report stage never reads them (its outputs would then
depend on them): ``grpo/report/measured.py`` turns them into the untracked ``logs/report_measured.md``
and its throughput figure, when they are there (a fresh clone that pulled its outputs has none).

Convention: a measured figure's name ends in ``_s`` (seconds, or a rate per second) or starts with
``peak_memory_gib/``; everything else a stage computes is a result and stays in its tracked outputs.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo.io import atomic_write_json

LOGS = Path("logs")
SENT = LOGS / "sent.json"
TRAIN = LOGS / "train.json"


def eval_log(root: Path, model: str, benchmark: str) -> Path:
    return root / LOGS / "eval" / model / f"{benchmark}.json"


def is_measured(key: str) -> bool:
    return key.endswith("_s") or key.startswith("peak_memory_gib/")


def split_measured(metrics: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(results, measured figures) of one metrics mapping."""
    results = {k: v for k, v in metrics.items() if not is_measured(k)}
    return results, {k: v for k, v in metrics.items() if is_measured(k)}


def write_log(path: Path, figures: dict[str, Any]) -> None:
    atomic_write_json(path, figures)


def read_log(path: Path) -> dict[str, Any] | None:
    """A measured log, or None when this checkout has none (or it does not parse: it is only a log)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
