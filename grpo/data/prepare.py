"""The prepare stage's library: training data (deduped, decontaminated, split) and capped eval sets.

Order of operations, each counted in the stats that become ``metrics/prepare.json``:
1. Load each requested benchmark in full (its eval split) and index its normalised questions.
2. Load each training source (its train split); rows with unparsable gold answers are skipped.
3. Drop repeated questions across all training rows (the first by source order, then file order, wins).
4. Drop training rows whose question is in a requested benchmark, or is the seed of a GSM-Plus
   variant (those seeds are GSM8K test questions). The full benchmarks are indexed, not the capped
   slices, so a smaller ``max_eval`` never lets contaminated rows back into training.
5. Split train/val with the seed, then cap val and train, so ``max_train`` never changes val.
6. Cap each benchmark to its first ``max_eval`` rows in file order: a stable prefix that other papers'
   "first N" subsets can be compared with, unchanged by the seed.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo.data.errors import DataError
from grpo.data.loading import BUNDLED_DIR, LoadedRows, load_dataset_rows
from grpo.data.registry import EVAL, TRAIN
from grpo.data.splitting import cap, dedupe_by_question, drop_overlap, normalize_question, split_train_val
from grpo.io import atomic_dir, atomic_write_json, write_jsonl

log = logging.getLogger(__name__)


@dataclass
class PreparedData:
    train: list[dict]
    val: list[dict]
    eval: dict[str, list[dict]]  # benchmark → its (capped) rows
    stats: dict[str, Any]  # written to metrics/prepare.json


def prepare_datasets(train_sources: list[str], eval_benchmarks: list[str], val_fraction: float,
                     max_train: int | None, max_val: int | None, max_eval: dict[str, int | None], seed: int,
                     source: str = "auto", data_dir: Path = BUNDLED_DIR,
                     max_unparsable_fraction: float = 0.01,
                     arith_levels: Sequence[int] | None = None) -> PreparedData:
    """Build the train/val split and the eval sets (see the module docstring for the steps).
    ``max_eval`` maps a benchmark to its cap; a missing benchmark or None means no cap. ``arith_levels``:
    the generated datasets' difficulty levels, for training and evaluation alike (None: their default)."""
    def load(name: str, role: str) -> LoadedRows:
        return load_dataset_rows(name, role, source, Path(data_dir), max_unparsable_fraction, seed, arith_levels)

    ignored = sorted(set(max_eval) - set(eval_benchmarks))
    if ignored:
        log.warning("max_eval names benchmarks that are not evaluated, ignored: %s", ", ".join(ignored))

    benchmarks = {name: load(name, EVAL) for name in dict.fromkeys(eval_benchmarks)}
    forbidden: dict[str, set[str]] = {}
    for name, loaded in benchmarks.items():
        for row in loaded.rows:
            for question in (row["question"], row["meta"].get("seed_question")):
                if question:
                    forbidden.setdefault(normalize_question(question), set()).add(name)

    sources = {name: load(name, TRAIN) for name in dict.fromkeys(train_sources)}
    rows = [row for loaded in sources.values() for row in loaded.rows]
    unique, duplicates = dedupe_by_question(rows)
    clean, overlap_by_benchmark = drop_overlap(unique, forbidden)
    train_all, val_all = split_train_val(clean, val_fraction, seed)
    if not train_all:
        raise DataError(f"no training rows left from {', '.join(sources)}: {len(rows)} loaded, {len(duplicates)} "
                        f"duplicates and {len(unique) - len(clean)} benchmark overlaps dropped, "
                        f"{len(val_all)} taken for val (val_fraction {val_fraction})")
    train, val = cap(train_all, max_train), cap(val_all, max_val)
    evals = {name: cap(loaded.rows, max_eval.get(name)) for name, loaded in benchmarks.items()}

    per_source_unique = Counter(row["source"] for row in unique)
    per_source_dups = Counter(row["source"] for row in duplicates)
    per_source_clean = Counter(row["source"] for row in clean)
    stats = {
        "train": {"rows": len(train), "by_source": dict(Counter(row["source"] for row in train))},
        "val": {"rows": len(val), "by_source": dict(Counter(row["source"] for row in val))},
        "eval": {name: {"rows": len(evals[name]), "available": len(loaded.rows),
                        "unparsable": loaded.stats["unparsable"]} for name, loaded in benchmarks.items()},
        "sources": {name: {"read": loaded.stats["read"], "unparsable": loaded.stats["unparsable"],
                           "duplicates": per_source_dups[name],
                           "overlap_eval": per_source_unique[name] - per_source_clean[name],
                           "usable": per_source_clean[name]} for name, loaded in sources.items()},
        "dropped": {
            "unparsable": sum(loaded.stats["unparsable"] for loaded in sources.values()),
            "duplicates": len(duplicates),
            "overlap_eval": len(unique) - len(clean),
            "overlap_eval_by_benchmark": {name: overlap_by_benchmark[name] for name in benchmarks},
            "cap_train": len(train_all) - len(train),
            "cap_val": len(val_all) - len(val),
        },
    }
    for name, loaded in {**benchmarks, **sources}.items():
        log.info("%s: %d rows from %s", name, loaded.stats["kept"], loaded.stats["origin"])
    log.info("train %d, val %d; dropped %d duplicates, %d benchmark overlaps", len(train), len(val),
             len(duplicates), len(unique) - len(clean))
    return PreparedData(train, val, evals, stats)


def write_prepared(prepared: PreparedData, out_dir: Path, metrics_path: Path) -> None:
    """Write ``train.jsonl``, ``val.jsonl`` and ``eval/<benchmark>.jsonl`` into ``out_dir`` (replacing it
    whole, atomically), then the stats to ``metrics_path``."""
    # The old metrics go first: if the write below dies, no metrics file claims a finished run.
    Path(metrics_path).unlink(missing_ok=True)
    with atomic_dir(out_dir) as tmp:
        write_jsonl(tmp / "train.jsonl", prepared.train)
        write_jsonl(tmp / "val.jsonl", prepared.val)
        (tmp / "eval").mkdir()
        for name, rows in prepared.eval.items():
            write_jsonl(tmp / "eval" / f"{name}.jsonl", rows)
    atomic_write_json(metrics_path, prepared.stats)
