"""Small file helpers every stage shares: atomic writes and JSON lines.

A DVC stage must write its outs completely or not at all, so every writer here goes through a temp
path next to the target (same filesystem, so the final ``os.replace`` is atomic) and renames it into
place only after the content is fully written. A write killed with SIGKILL (no cleanup runs) leaves
its hidden temp sibling behind; the next write of the same target removes it (``sweep_stale``).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grpo.fault_injection import kill_point

FLOAT_DIGITS = 6


def round_floats(obj: Any, digits: int = FLOAT_DIGITS) -> Any:
    """``obj`` with every float rounded, so reruns on the same inputs write identical metrics."""
    if isinstance(obj, float):
        return round(obj, digits)
    if isinstance(obj, dict):
        return {k: round_floats(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [round_floats(v, digits) for v in obj]
    return obj


def sweep_stale(path: Path) -> None:
    """Delete the hidden temp siblings (``.<name>.tmp-*``, ``.<name>.old-*``) that a killed write of
    ``path`` left. Each stage is the only writer of its outputs, so any that exist are leftovers."""
    name = glob.escape(path.name)
    for stale in [*path.parent.glob(f".{name}.tmp-*"), *path.parent.glob(f".{name}.old-*")]:
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def atomic_write_text(path: Path | str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` via a temp file and ``os.replace``; creates parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    os.chmod(tmp, 0o644)  # mkstemp makes files private; outputs are ordinary files
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path | str, obj: Any) -> None:
    """Write ``obj`` as indented JSON with sorted keys and floats rounded to 6 places, atomically."""
    text = json.dumps(round_floats(obj), sort_keys=True, indent=2, ensure_ascii=False)
    atomic_write_text(path, text + "\n")


@contextmanager
def atomic_dir(path: Path | str) -> Iterator[Path]:
    """Yield a fresh temp folder next to ``path``; on success it replaces ``path`` (file or folder),
    on an exception it is deleted and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(path)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    os.chmod(tmp, 0o755)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # os.replace cannot overwrite a non-empty folder: move the old one aside first, so the window in
    # which ``path`` is missing is two renames long, and never shows a half-written folder.
    old = None
    if path.is_dir() and not path.is_symlink():
        old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.old-"))
        os.replace(path, old / path.name)
    elif path.exists() or path.is_symlink():
        path.unlink()
    kill_point(f"replace:{path.name}")
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_json(path: Path | str) -> Any:
    """The JSON in ``path``, or None when there is no such file; ValueError naming the file when it does
    not parse (for optional inputs: missing is normal, broken is not)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


_REQUIRED = object()


def parse_json(data: bytes, path: Path | str, line: int | None = None, *, blank: Any = _REQUIRED,
               error: type[Exception] = ValueError) -> Any:
    """The JSON value in UTF-8 ``data`` read from ``path``: one line of it (``line``, 1-based) or the
    whole file (``line`` None: an error names the line it is on). Raises ``error`` naming the file and
    line for invalid UTF-8 or invalid JSON; data holding only white space returns ``blank`` if given."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = line if line is not None else data.count(b"\n", 0, exc.start) + 1
        raise error(f"{path}: line {at}: invalid UTF-8 ({exc.reason})") from None
    if blank is not _REQUIRED and not text.strip():
        return blank
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: line {line if line is not None else exc.lineno}: invalid JSON ({exc.msg})") from None


def iter_jsonl(path: Path | str) -> Iterator[tuple[int, dict]]:
    """Yield ``(1-based line number, object)`` for each non-blank line of a JSON-lines file. Raises
    ValueError naming the file and line for invalid UTF-8, invalid JSON, or a non-object line."""
    path = Path(path)
    skip = object()
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            row = parse_json(raw, path, lineno, blank=skip)
            if row is skip:
                continue
            if not isinstance(row, dict):
                raise ValueError(f"{path}: line {lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def read_jsonl(path: Path | str) -> list[dict]:
    """All objects of a JSON-lines file, in order (see ``iter_jsonl`` for the errors)."""
    return [row for _, row in iter_jsonl(path)]


def write_jsonl(path: Path | str, rows: Iterable[dict]) -> None:
    """Write ``rows`` as JSON lines (keys sorted, non-ASCII kept as is), atomically."""
    lines = [json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows]
    atomic_write_text(path, "".join(lines))
