"""grpo/io.py: atomic writes leave the old content or the new, never a half; JSON lines round-trip."""
from __future__ import annotations

import json

import pytest

import grpo.io as io_mod
from grpo.io import atomic_dir, atomic_write_json, atomic_write_text, read_jsonl, write_jsonl


def test_atomic_write_text_creates_parents_and_replaces(tmp_path):
    path = tmp_path / "a/b/file.txt"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two" and [p.name for p in path.parent.iterdir()] == ["file.txt"]


def test_atomic_write_text_failure_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "file.txt"
    atomic_write_text(path, "old")

    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr(io_mod.os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["file.txt"]


def test_atomic_write_json_sorts_keys_and_rounds_floats(tmp_path):
    path = tmp_path / "m.json"
    atomic_write_json(path, {"b": 2 / 3, "a": [0.1234567891, {"z": 1e-9, "y": 1}], "c": "x"})
    text = path.read_text()
    assert json.loads(text) == {"a": [0.123457, {"y": 1, "z": 0.0}], "b": 0.666667, "c": "x"}
    assert text.index('"a"') < text.index('"b"') < text.index('"c"') and text.endswith("\n")


def test_atomic_dir_replaces_existing_folder_on_success(tmp_path):
    out = tmp_path / "out"
    (out / "stale").mkdir(parents=True)
    with atomic_dir(out) as tmp:
        assert tmp.parent == tmp_path and tmp != out
        (tmp / "new.txt").write_text("complete")
    assert [p.name for p in out.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_dir_exception_mid_write_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_dir(out) as tmp:
            (tmp / "half.txt").write_text("half")
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_exception_keeps_previous_folder(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        (tmp / "v1.txt").write_text("v1")
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            (tmp / "v2.txt").write_text("v2")
            raise RuntimeError("killed")
    assert [p.name for p in out.iterdir()] == ["v1.txt"] and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_dir_replaces_a_file(tmp_path):
    out = tmp_path / "out"
    out.write_text("a file")
    with atomic_dir(out) as tmp:
        (tmp / "x").write_text("x")
    assert out.is_dir()


def test_jsonl_round_trip_sorted_keys_and_unicode(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [{"b": 1, "a": "café ∑"}, {"z": [1, 2], "m": {"k": None}}]
    write_jsonl(path, rows)
    text = path.read_text(encoding="utf-8")
    assert text.splitlines()[0] == '{"a": "café ∑", "b": 1}'
    assert read_jsonl(path) == rows


def test_read_jsonl_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"a": 1}\n\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: line 3: expected a JSON object, got list"):
        read_jsonl(path)
    path.write_bytes(b'{"a": 1}\n{"a": "\xc3"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2: invalid UTF-8"):
        read_jsonl(path)
