"""The eval_summary stage's library: merge the per-pair evaluation metrics into one nested JSON file
and one CSV table, with each trained model's paired lift over the base.

The lift (``grpo.eval.metrics.paired_lift``) needs each question's correctness, which only the
per-sample files eval/<model>/<benchmark>.jsonl hold; questions are matched by their ``id``. It is
stored next to the trained model's own metrics, ``final.<benchmark>.lift_over_base`` with
``lift_over_base_stderr`` and ``lift_over_base_n`` (fractions, like ``pass@1``), so ``dvc metrics diff``
shows it; the base has none.

Kept apart from ``run.py`` (generation, verification) so that eval_summary runs only this module: an
edit to how models are evaluated reruns the evaluate stages, which then rerun eval_summary through
their metrics and samples files, but an edit here reruns eval_summary alone.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from grpo.eval.metrics import QuestionMismatch, paired_lift
from grpo.io import atomic_write_json, atomic_write_text, read_jsonl

MODELS = ("base", "final", "best")  # what the evaluate stages evaluate; the summary's row order
LIFT, LIFT_STDERR, LIFT_N = "lift_over_base", "lift_over_base_stderr", "lift_over_base_n"


def collect_metrics(metrics_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Every ``<model>/<benchmark>.json`` under ``metrics_dir``, nested model -> benchmark -> metric."""
    nested: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted(Path(metrics_dir).glob("*/*.json")):
        nested.setdefault(path.parent.name, {})[path.stem] = json.loads(path.read_text(encoding="utf-8"))
    if not nested:
        raise FileNotFoundError(f"no evaluation metrics under {metrics_dir}: run the evaluate stages first")
    return nested


def question_scores(path: Path) -> dict[str, float]:
    """Each question's mean correctness over its samples, by id, from one eval/<model>/<benchmark>.jsonl
    (a line per sample: grpo/eval/run.py). ValueError when an (id, sample) pair repeats: two questions
    sharing an id could not be matched with the other model's."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing, but its metrics are not: the paired lift needs the per-sample "
                                f"file (dvc pull, or rerun the evaluate stage that writes it)")
    correct: dict[str, list[bool]] = {}
    seen: set[tuple[str, int]] = set()
    for row in read_jsonl(path):
        key = (str(row["id"]), int(row["sample"]))
        if key in seen:
            raise ValueError(f"{path}: question id {key[0]!r} sample {key[1]} appears twice: ids must be unique")
        seen.add(key)
        correct.setdefault(key[0], []).append(bool(row["correct"]))
    return {q: sum(c) / len(c) for q, c in correct.items()}


def add_lifts(nested: dict[str, dict[str, dict[str, Any]]], samples_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """``nested`` with ``LIFT``, ``LIFT_STDERR`` and ``LIFT_N`` added to every trained model's benchmark that the
    base was evaluated on too, computed from ``samples_dir/<model>/<benchmark>.jsonl``.

    Both models must have answered the same questions (they read the same data/prepared/eval file); when
    they did not, one of the two evaluations is stale, its pass@1 is over other questions too, and a lift
    over the common questions would hide that: ValueError naming the benchmark instead."""
    out = {model: {bench: dict(metrics) for bench, metrics in benches.items()} for model, benches in nested.items()}
    scores: dict[tuple[str, str], dict[str, float]] = {}

    def scores_of(model: str, bench: str) -> dict[str, float]:
        if (model, bench) not in scores:
            found = scores[model, bench] = question_scores(Path(samples_dir) / model / f"{bench}.jsonl")
            counted = nested[model][bench].get("num_questions")
            if counted is not None and counted != len(found):
                raise ValueError(f"benchmark {bench}: metrics/eval/{model}/{bench}.json counts {counted} questions, "
                                 f"{samples_dir}/{model}/{bench}.jsonl holds {len(found)}: one of the two is stale "
                                 f"(rerun its evaluate stage)")
        return scores[model, bench]

    for model in sorted(m for m in out if m != "base"):
        for bench in sorted(b for b in out[model] if b in nested.get("base", {})):
            try:
                lift = paired_lift(scores_of("base", bench), scores_of(model, bench))
            except QuestionMismatch as exc:
                raise ValueError(f"benchmark {bench}: {model} and base were evaluated on different questions, so "
                                 f"their pass@1 do not compare; rerun the evaluate stages of {bench} "
                                 f"(dvc repro). {exc}") from None
            out[model][bench].update({LIFT: lift.lift, LIFT_STDERR: lift.stderr, LIFT_N: lift.n})
    return out


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
