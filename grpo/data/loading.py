"""Load one dataset split (bundled file or hub) into the project's row schema.

Each row: ``id`` (unique within the dataset), ``source`` (the dataset name), ``question``, ``answer``
(the gold final answer as a string), ``answer_type`` (see ``answers.py``) and ``meta`` (the original
fields worth keeping: solutions, subjects, perturbation types).

Structural problems (a missing field, invalid UTF-8, an empty file, duplicate ids) stop loading with a
DataError naming the file and row, since they mean the file is not what the registry expects. Gold
answers that do not parse are counted and skipped, because a few odd rows are normal in scraped data
(DeepScaleR has null answers); too many of them again means something is wrong, and stops loading.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo.data.errors import DataError
from grpo.data.registry import DatasetSpec, SplitSource, get_spec
from grpo.io import iter_jsonl, parse_json

log = logging.getLogger(__name__)

BUNDLED_DIR = Path(__file__).resolve().parents[2] / "data" / "bundled"
SOURCES = ("bundled", "hub", "auto")

_PATH_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
_MISSING = object()


@dataclass
class LoadedRows:
    rows: list[dict]
    stats: dict[str, Any]  # origin ("bundled" or "hub:<id>"), read, kept, unparsable


def load_dataset_rows(name: str, split_role: str, source: str = "auto", data_dir: Path = BUNDLED_DIR,
                      max_unparsable_fraction: float = 0.01, seed: int = 0,
                      levels: Sequence[int] | None = None) -> LoadedRows:
    """Load dataset ``name`` for ``split_role`` ("train" or "eval") from ``source``: "bundled" (files under
    ``data_dir``), "hub" (``datasets.load_dataset``) or "auto" (bundled when the files exist, else hub).
    A generated dataset ignores ``source`` and is generated from ``seed`` at difficulty ``levels``
    (None: its default levels); other datasets ignore ``levels``.
    Raises DataError when more than ``max_unparsable_fraction`` of the gold answers do not parse."""
    spec = get_spec(name)
    if split_role not in spec.splits:
        raise DataError(f"{name} has no {split_role!r} split; it serves: {', '.join(spec.roles)}")
    if source not in SOURCES:
        raise DataError(f"unknown source {source!r}; allowed: {', '.join(SOURCES)}")
    split = spec.splits[split_role]
    if spec.generate is not None:
        generated = spec.generate(split.hub_split, seed) if levels is None else \
            spec.generate(split.hub_split, seed, levels)
        records = ((f"{name} ({split.hub_split}, seed {seed}): row {n}", record)
                   for n, record in enumerate(generated, start=1))
        return _to_rows(spec, split_role, records, f"generated:seed {seed}", max_unparsable_fraction)
    if source == "auto":
        source = "bundled" if split.files and all((Path(data_dir) / f).is_file() for f in split.files) else "hub"
    if source == "bundled":
        records, origin = _bundled_records(spec, split, Path(data_dir)), "bundled"
    else:
        records, origin = _hub_records(spec, split), f"hub:{spec.hub_id}"
    return _to_rows(spec, split_role, records, origin, max_unparsable_fraction)


def _to_rows(spec: DatasetSpec, split_role: str, records: Iterator[tuple[str, dict]], origin: str,
             max_unparsable_fraction: float) -> LoadedRows:
    name = spec.name
    rows: list[dict] = []
    seen: dict[str, str] = {}  # own id → where it first appeared; index-based ids are unique by construction
    unparsable, first_unparsable = 0, ""
    for index, (where, record) in enumerate(records):
        if spec.id_field is None:
            row_id = f"{name}-{index}"
        else:
            row_id = f"{name}-{_required(record, spec.id_field, where)}"
            if row_id in seen:
                raise DataError(f"{where}: duplicate id {row_id!r} (first at {seen[row_id]})")
            seen[row_id] = where
        row = _normalise(spec, row_id, where, record)
        if row is not None:
            rows.append(row)
        else:
            unparsable += 1
            first_unparsable = first_unparsable or where

    read = len(rows) + unparsable
    stats = {"origin": origin, "read": read, "kept": len(rows), "unparsable": unparsable}
    if unparsable:
        fraction = unparsable / read
        if fraction > max_unparsable_fraction:
            raise DataError(
                f"{name} ({split_role}): {unparsable} of {read} gold answers do not parse ({fraction:.2%}, "
                f"more than max_unparsable_fraction {max_unparsable_fraction}); first at {first_unparsable}")
        log.warning("%s (%s): skipped %d of %d rows whose gold answer does not parse, first at %s",
                    name, split_role, unparsable, read, first_unparsable)
    return LoadedRows(rows, stats)


def get_field(record: Any, path: str, default: Any = _MISSING) -> Any:
    """The value at ``path`` (``a.b``, ``a[0].b``) in ``record``; ``default`` when absent, or KeyError."""
    value = record
    for key, index in _PATH_TOKEN.findall(path):
        if key and isinstance(value, dict) and key in value:
            value = value[key]
        elif index and isinstance(value, (list, tuple)) and int(index) < len(value):
            value = value[int(index)]
        elif default is _MISSING:
            raise KeyError(path)
        else:
            return default
    return value


def _required(record: dict, path: str, where: str) -> Any:
    try:
        return get_field(record, path)
    except KeyError:
        raise DataError(f"{where}: missing field {path!r}") from None


def _normalise(spec: DatasetSpec, row_id: str, where: str, record: dict) -> dict | None:
    """The schema row for ``record``, or None when its gold answer does not parse."""
    question = _required(record, spec.question_field, where)
    raw_answer = _required(record, spec.answer_field, where)
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: field {spec.question_field!r} is not a non-empty string")
    if spec.clean_question is not None:
        question = spec.clean_question(question)
    gold = spec.parse_answer(raw_answer)
    if gold is None:
        return None
    meta = {}
    for key, path in spec.meta_fields.items():
        value = get_field(record, path, None)
        if value is not None:
            meta[key] = value
    return {"id": row_id, "source": spec.name, "question": question, "answer": gold.answer,
            "answer_type": gold.answer_type, "meta": meta}


def _bundled_records(spec: DatasetSpec, split: SplitSource, data_dir: Path) -> Iterator[tuple[str, dict]]:
    if not split.files:
        raise DataError(f"{spec.name} has no bundled copy: it is published only on the Hugging Face hub "
                        f"({spec.hub_id}); use source: hub (or auto) on a machine that can reach the hub")
    for rel in split.files:
        path = data_dir / rel
        if not path.is_file():
            raise DataError(f"{spec.name}: bundled file {path} not found")
        yield from read_records(path)


def read_records(path: Path) -> Iterator[tuple[str, dict]]:
    """Yield ``(where, record)`` for each record of a .jsonl, .json (array) or .parquet file; ``where`` is
    "<file>: line N" (1-based) for JSON lines, "<file>: row N" otherwise. An empty file is a DataError."""
    if path.stat().st_size == 0:
        raise DataError(f"{path}: empty file")
    suffix = path.suffix
    if suffix == ".jsonl":
        # iter_jsonl raises a plain ValueError naming file and line for bad UTF-8 or JSON
        records = ((f"{path}: line {n}", r) for n, r in iter_jsonl(path))
    elif suffix == ".json":
        records = ((f"{path}: row {n}", r) for n, r in enumerate(_read_json_array(path), start=1))
    elif suffix == ".parquet":
        records = ((f"{path}: row {n}", r) for n, r in enumerate(_read_parquet(path), start=1))
    else:
        raise DataError(f"{path}: unsupported file format {suffix!r} (expected .jsonl, .json or .parquet)")
    empty = True
    for where, record in records:
        empty = False
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        yield where, record
    if empty:
        raise DataError(f"{path}: empty file (no records)")


def _read_json_array(path: Path) -> list:
    value = parse_json(path.read_bytes(), path, error=DataError)
    if not isinstance(value, list):
        raise DataError(f"{path}: expected a JSON array of objects, got {type(value).__name__}")
    return value


def _read_parquet(path: Path) -> list[dict]:
    import pyarrow
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pyarrow.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None


def _hub_records(spec: DatasetSpec, split: SplitSource) -> Iterator[tuple[str, dict]]:
    import datasets

    try:
        rows = datasets.load_dataset(spec.hub_id, spec.hub_config, split=split.hub_split)
    # The hub fails in many ways (offline mode, no network, auth, a renamed repo); each means the same
    # thing to the user, who gets one message with the way out.
    except Exception as exc:
        hint = ("use source: bundled (prepare.source in params.yaml) to load the copy in data/bundled"
                if split.files else f"{spec.name} has no bundled copy, so it needs a machine that can reach the hub")
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise DataError(f"{spec.name}: could not load {spec.hub_id} (split {split.hub_split}) from the Hugging Face "
                        f"hub: {type(exc).__name__}: {reason}; {hint}") from exc
    for n, record in enumerate(rows, start=1):
        yield f"hub {spec.hub_id} ({split.hub_split}): row {n}", record
