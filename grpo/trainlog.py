"""The training log: the files DVCLive writes under ``metrics/train/`` and how select and the report read them.

The train stage logs through ``dvclive.Live(dir="metrics/train")`` (grpo/train/tracking.py), so the
layout is DVCLive's:

- ``metrics.json``: the summary, for ``dvc metrics`` and ``dvc exp show``: each metric's last value
  (nested by its ``/`` parts), the step, and the run's summary figures (``reward_mean_last5``, ...);
- ``plots/metrics/<name>.tsv``: one file per metric, columns ``step`` and the metric's last name part,
  one row per logged step, for ``dvc plots`` (dvc.yaml's ``plots:``). Validation metrics sit under
  ``eval/`` (``plots/metrics/eval/accuracy.tsv``), as DVCLive's Hugging Face callback files TRL's
  ``eval_*`` metrics; everything else is a per-step training metric with TRL's name (``reward``,
  ``completions/mean_length``, ``rewards/<function>/mean``, ...).

Both are results: a function of the run's inputs, identical for an uninterrupted and a resumed run.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from grpo.io import read_json

LIVE_DIR = Path("metrics/train")
EVAL = "eval"  # the validation metrics' folder


def summary_file(live_dir: Path) -> Path:
    return Path(live_dir) / "metrics.json"


def plots_dir(live_dir: Path) -> Path:
    """Where DVCLive puts the per-step files (``Live.plots_dir`` / ``Metric.subfolder``)."""
    return Path(live_dir) / "plots" / "metrics"


def validation_dir(live_dir: Path) -> Path:
    return plots_dir(live_dir) / EVAL


def _value(cell: str) -> float | str:
    try:
        return float(cell)
    except ValueError:
        return cell  # DVCLive writes a logged string as is


def read_table(folder: Path, exclude: str | None = None) -> list[dict[str, Any]]:
    """Every ``*.tsv`` under ``folder`` (except the subfolder ``exclude``) joined on ``step``: one dict
    per step, in step order, keyed by ``step`` and each metric's path under ``folder`` without
    ``.tsv`` (``reward``, ``rewards/correctness/mean``). A metric not logged at a step is absent."""
    folder = Path(folder)
    rows: dict[int, dict[str, Any]] = {}
    for path in sorted(folder.rglob("*.tsv")):
        name = path.relative_to(folder).with_suffix("").as_posix()
        if exclude is not None and name.startswith(f"{exclude}/"):
            continue
        with path.open(newline="", encoding="utf-8") as fh:
            for record in csv.DictReader(fh, delimiter="\t"):
                step = int(record["step"])
                rows.setdefault(step, {"step": step})[name] = _value(record[path.stem])
    return [rows[step] for step in sorted(rows)]


def read_steps(live_dir: Path) -> list[dict[str, Any]]:
    """The per-step training metrics (validation excluded)."""
    return read_table(plots_dir(live_dir), exclude=EVAL)


def read_validation(live_dir: Path) -> list[dict[str, Any]]:
    """The validation log: one row per validated step, keyed by the metric names under ``eval/``."""
    return read_table(validation_dir(live_dir))


def read_summary(live_dir: Path) -> dict[str, Any] | None:
    return read_json(summary_file(live_dir))
