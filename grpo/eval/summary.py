"""The eval_summary stage's library: merge the per-pair evaluation metrics into one nested JSON file
and one CSV table.

Kept apart from ``run.py`` (generation, verification) so that eval_summary runs only this module: an
edit to how models are evaluated reruns the evaluate stages, which then rerun eval_summary through
their metrics files, but an edit here reruns eval_summary alone.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from grpo.io import atomic_write_json, atomic_write_text

MODELS = ("base", "final", "best")  # what the evaluate stages evaluate; the summary's row order


def collect_metrics(metrics_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Every ``<model>/<benchmark>.json`` under ``metrics_dir``, nested model -> benchmark -> metric."""
    nested: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted(Path(metrics_dir).glob("*/*.json")):
        nested.setdefault(path.parent.name, {})[path.stem] = json.loads(path.read_text(encoding="utf-8"))
    if not nested:
        raise FileNotFoundError(f"no evaluation metrics under {metrics_dir}: run the evaluate stages first")
    return nested


def write_summary(nested: dict[str, dict[str, dict[str, Any]]], metrics_path: Path, csv_path: Path) -> None:
    """``metrics_path``: the nested metrics (sorted keys, rounded floats). ``csv_path``: one row per
    model x benchmark, models in base/final/best order, metric columns sorted."""
    atomic_write_json(metrics_path, nested)
    order = {name: i for i, name in enumerate(MODELS)}
    columns = sorted({key for benchmarks in nested.values() for m in benchmarks.values() for key in m})
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["model", "benchmark", *columns])
    for model in sorted(nested, key=lambda name: (order.get(name, len(order)), name)):
        for benchmark, metrics in sorted(nested[model].items()):
            writer.writerow([model, benchmark, *(_cell(metrics.get(c)) for c in columns)])
    atomic_write_text(csv_path, buf.getvalue())


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)
