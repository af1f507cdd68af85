"""The report stage's library: figures, report.md/report.html and the model card.

This module holds what the three renderers share: ``ReportInputs``, everything the report reads,
loaded once and tolerantly. The report comes last in the DAG and is also useful on a partial run (no
SENT, evaluation not run yet), so every input is optional: a missing file is ``None`` and the
renderers say "not available" instead of failing. A file that exists but does not parse is an error,
since silently dropping it would publish a wrong report.

The measured figures (timings, throughput: grpo/measured.py) are no report input: reports/ is a
function of the tracked inputs alone, so a rerun on them writes the same bytes and ``dvc.lock`` does
not change. ``grpo.report.measured`` writes them, from ``logs/`` where this checkout has them (the
machine that ran the stages), to the untracked companion logs/report_measured.md, which the report
names.

It also holds the cell formatting that the report and the model card share, so both print a number
the same way. Modules: ``figures`` (matplotlib PNGs), ``markdown`` (one block structure rendered to
Markdown and to self-contained HTML; the report), ``model_card`` (reports/MODEL_CARD.md, Hugging Face
format), ``measured`` (the untracked companion of wall-clock figures). ``stages/report.py`` wires them
together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from grpo.config import SECTIONS, to_dict
from grpo.eval.metrics import Lift
# the evaluated models, also the column order of every comparison; the lift keys of metrics/eval.json
from grpo.eval.summary import LIFT, LIFT_N, LIFT_STDERR, MODELS
from grpo.io import read_json, read_jsonl
from grpo.trainlog import LIVE_DIR, read_steps, read_summary, read_validation

MISSING = "—"  # a table cell whose input is absent
PASS1, PASS1_STDERR = "pass@1", "pass@1_stderr"  # metrics/eval.json keys (grpo/eval/metrics.py)


@dataclass(frozen=True)
class ParamChange:
    key: str  # dotted path, e.g. "train.lora.r"
    default: Any  # UNSET when the key is absent from the defaults (an entry added to a mapping)
    value: Any  # UNSET when a default mapping entry was removed


class _Unset:
    def __repr__(self) -> str:
        return "(unset)"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class DatasetSource:
    """One row of data/bundled/README.md's table, merged over a dataset's files."""

    name: str
    license: str
    origin: str  # repository and path each bundled file was copied from; "; "-joined


@dataclass
class ReportInputs:
    params: dict[str, Any]  # validated sections (dataclasses), keyed by section name
    changes: list[ParamChange]
    model_info: dict | None
    prepare: dict | None
    datasets: dict[str, DatasetSource]
    sent: dict | None  # None also when SENT was disabled (the file then holds {"enabled": false})
    sent_scores: pd.DataFrame | None
    steps: pd.DataFrame | None
    validation: pd.DataFrame | None
    train: dict | None
    selection: dict | None
    eval: dict | None


@dataclass(frozen=True)
class InputPaths:
    """Where each input lives, relative to the project root (the dvc.yaml deps of the report stage)."""

    model_info: Path = Path("models/base/MODEL_INFO.json")
    prepare: Path = Path("metrics/prepare.json")
    bundled_index: Path = Path("data/bundled/README.md")
    sent: Path = Path("metrics/sent.json")
    sent_scores: Path = Path("data/sent/scores.jsonl")
    train_log: Path = LIVE_DIR  # DVCLive's folder: per-step metrics, validation, summary (grpo/trainlog.py)
    selection: Path = Path("models/best/SELECTION.json")
    eval: Path = Path("metrics/eval.json")


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    """Leaves of nested mappings by dotted path; lists are leaves (they are set as a whole)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}"))
        return out
    return {prefix: value}


def params_changes(params: dict[str, Any]) -> list[ParamChange]:
    """Every leaf of the validated params whose value differs from the dataclass default, by key path.

    Comparing validated values (not raw YAML) means ``lr: 5.0e-4`` and ``lr: 0.0005`` are equal, and an
    int written for a float key is not reported as a change.
    """
    changes = []
    for name, section in params.items():
        current = _flatten(to_dict(section), name)
        default = _flatten(to_dict(SECTIONS[name]()), name)
        for key in sorted(current.keys() | default.keys()):
            old, new = default.get(key, UNSET), current.get(key, UNSET)
            # an empty mapping flattens to {key: {}}; it is "no entries", not a value of its own
            if old == {} and new is UNSET or new == {} and old is UNSET:
                continue
            if old != new:
                changes.append(ParamChange(key, old, new))
    return changes


def frame(rows: list[dict]) -> pd.DataFrame | None:
    return pd.DataFrame(rows) if rows else None


def read_scores(path: Path) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    rows = read_jsonl(path)
    return pd.DataFrame(rows) if rows else None


def read_bundled_index(readme: Path) -> dict[str, DatasetSource]:
    """License and origin of each bundled dataset, from the table in ``data/bundled/README.md``
    (columns dataset | file | rows | license | origin; a dataset with a train and a test file has two rows)."""
    if not readme.is_file():
        return {}
    sources: dict[str, DatasetSource] = {}
    header: list[str] | None = None
    for line in readme.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
            continue
        row = dict(zip(header, cells))
        if not {"dataset", "license", "origin"} <= row.keys() or set(row["dataset"]) <= set("-: "):
            continue
        seen = sources.get(row["dataset"])
        origin = row["origin"] if seen is None else f"{seen.origin}; {row['origin']}"
        sources[row["dataset"]] = DatasetSource(row["dataset"], row["license"], origin)
    return sources


def _in_order(mapping: dict | None, order: list[str]) -> dict | None:
    """``mapping`` with the keys in ``order`` first: the JSON files have sorted keys, the report
    lists benchmarks in the order params.yaml names them."""
    if mapping is None:
        return None
    rank = {name: i for i, name in enumerate(order)}
    return dict(sorted(mapping.items(), key=lambda kv: rank.get(kv[0], len(rank))))


def load_inputs(params: dict[str, Any], root: Path = Path("."), paths: InputPaths = InputPaths()) -> ReportInputs:
    """Read every report input under ``root``; ``params`` are the validated sections of params.yaml."""
    at = root.joinpath
    sent = read_json(at(paths.sent))
    benchmarks = list(params["prepare"].benchmarks)
    prepare = read_json(at(paths.prepare))
    if prepare and "eval" in prepare:
        prepare["eval"] = _in_order(prepare["eval"], benchmarks)
    eval_data = read_json(at(paths.eval))
    if eval_data:
        eval_data = {model: _in_order(results, benchmarks) for model, results in eval_data.items()}
    return ReportInputs(
        params=params,
        changes=params_changes(params),
        model_info=read_json(at(paths.model_info)),
        prepare=prepare,
        datasets=read_bundled_index(at(paths.bundled_index)),
        sent=sent if sent and sent.get("enabled", True) else None,
        sent_scores=read_scores(at(paths.sent_scores)),
        steps=frame(read_steps(at(paths.train_log))),
        validation=frame(read_validation(at(paths.train_log))),
        train=read_summary(at(paths.train_log)),
        selection=read_json(at(paths.selection)),
        eval=eval_data,
    )


def eval_benchmarks(eval_data: dict | None) -> list[str]:
    """Benchmarks in metrics/eval.json across all models, in first-seen order."""
    seen: dict[str, None] = {}
    for model in MODELS:
        seen.update(dict.fromkeys((eval_data or {}).get(model) or {}))
    return list(seen)


def eval_metric(eval_data: dict | None, model: str, benchmark: str, key: str) -> float | None:
    """One number of metrics/eval.json, or None when the model, benchmark or metric is missing."""
    value = (((eval_data or {}).get(model) or {}).get(benchmark) or {}).get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def eval_lift(eval_data: dict | None, model: str, benchmark: str) -> Lift | None:
    """``model``'s paired lift over the base on ``benchmark`` as eval_summary wrote it to metrics/eval.json,
    or None where there is none (no base evaluation, or a file from before the lift)."""
    lift = eval_metric(eval_data, model, benchmark, LIFT)
    if lift is None:
        return None
    return Lift(lift, eval_metric(eval_data, model, benchmark, LIFT_STDERR) or 0.0,
                int(eval_metric(eval_data, model, benchmark, LIFT_N) or 0))


def fmt(x: Any, digits: int = 3) -> str:
    """A number for a table cell: "—" when missing, ints with separators, tiny floats in g-format."""
    if x is None or isinstance(x, float) and math.isnan(x):
        return MISSING
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, int) or float(x).is_integer() and abs(x) >= 2:  # counts logged as floats
        return f"{int(x):,}"
    if abs(x) >= 100:
        return f"{x:,.1f}"
    return f"{x:.{digits}f}" if x == 0 or abs(x) >= 10 ** -digits else f"{x:.2g}"


def fmt_param(value: Any) -> str:
    """A params value as it would be written in params.yaml."""
    if value is UNSET:
        return "(unset)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return format(value, "g")
    if isinstance(value, list):
        return "[" + ", ".join(fmt_param(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {fmt_param(v)}" for k, v in value.items()) + "}"
    return str(value)


def base_model_name(info: dict | None) -> str:
    """The hub id when there is one (the bundled GGUF records it), else the configured source."""
    if not info:
        return "the base model"
    return (info.get("source_detail") or {}).get("model") or info.get("source") or "the base model"
