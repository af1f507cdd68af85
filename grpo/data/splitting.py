"""Choosing rows: question normalisation, dedupe, eval-overlap removal and the seeded train/val split.

Everything here is deterministic given its inputs (and seed), so a rerun of ``prepare`` with the same
params writes byte-identical files and DVC skips everything downstream.
"""
from __future__ import annotations

import math
import random
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping


def normalize_question(text: str) -> str:
    """The key two questions share when they differ only in Unicode form, case, whitespace or
    punctuation at the ends (NFKC, lowercase, whitespace collapsed, leading/trailing punctuation cut)."""
    text = " ".join(unicodedata.normalize("NFKC", text).lower().split())
    start, end = 0, len(text)
    while start < end and _is_edge_noise(text[start]):
        start += 1
    while end > start and _is_edge_noise(text[end - 1]):
        end -= 1
    return text[start:end]


def _is_edge_noise(char: str) -> bool:
    return char.isspace() or unicodedata.category(char).startswith("P")


def dedupe_by_question(rows: Iterable[dict]) -> tuple[list[dict], list[dict]]:
    """``(kept, dropped)``: the first row of each normalised question is kept, in input order."""
    seen: set[str] = set()
    kept, dropped = [], []
    for row in rows:
        key = normalize_question(row["question"])
        (dropped if key in seen else kept).append(row)
        seen.add(key)
    return kept, dropped


def drop_overlap(rows: Iterable[dict], forbidden: Mapping[str, set[str]]) -> tuple[list[dict], Counter]:
    """Remove rows whose normalised question is a key of ``forbidden`` (normalised question → the
    benchmarks holding it). Returns the kept rows and, per benchmark, how many rows it removed (a row
    found in two benchmarks counts for both)."""
    kept, hits = [], Counter()
    for row in rows:
        benchmarks = forbidden.get(normalize_question(row["question"]))
        if benchmarks:
            hits.update(benchmarks)
        else:
            kept.append(row)
    return kept, hits


def split_train_val(rows: list[dict], val_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """``(train, val)``: rows sorted by id (so input order does not matter), shuffled by
    ``random.Random(seed)``; val takes the first ``ceil(val_fraction * n)``. Both keep the shuffled order,
    so capping either with a prefix keeps the other unchanged."""
    ordered = sorted(rows, key=lambda row: row["id"])
    random.Random(seed).shuffle(ordered)
    n_val = math.ceil(val_fraction * len(ordered))
    return ordered[n_val:], ordered[:n_val]


def cap(rows: list[dict], limit: int | None) -> list[dict]:
    """The first ``limit`` rows (all of them when ``limit`` is None)."""
    return rows if limit is None else rows[:limit]
