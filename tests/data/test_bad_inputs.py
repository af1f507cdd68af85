"""Bad dataset files stop loading with an error that names the file and the row; unparsable gold
answers are skipped up to a threshold."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo.data.errors import DataError
from grpo.data.loading import load_dataset_rows
from grpo.data.registry import DAPO_PREFIX, DAPO_SUFFIX


def gsm8k_row(i: int) -> dict:
    return {"question": f"Question {i}?", "answer": f"Work.\n#### {i}"}


def write_lines(path: Path, lines: list[str | bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return path


def write_gsm8k(data_dir: Path, rows: list[dict]) -> Path:
    return write_lines(data_dir / "gsm8k/train.jsonl", [json.dumps(row) for row in rows])


@pytest.mark.parametrize("missing", ["question", "answer"])
def test_missing_field_names_file_and_line(tmp_path, missing):
    rows = [gsm8k_row(1), gsm8k_row(2), gsm8k_row(3)]
    del rows[1][missing]
    path = write_gsm8k(tmp_path, rows)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: line 2: missing field '{missing}'"):
        load_dataset_rows("gsm8k", "train", "bundled", tmp_path)


def test_missing_nested_field_in_parquet_names_row(tmp_path):
    path = tmp_path / "dapo_math_17k/train.parquet"
    path.parent.mkdir()
    prompt = [{"role": "user", "content": DAPO_PREFIX + "What is 6*7?" + DAPO_SUFFIX}]
    pq.write_table(pa.Table.from_pylist([
        {"prompt": prompt, "reward_model": {"ground_truth": "42"}},
        {"prompt": [], "reward_model": {"ground_truth": "1"}},
    ]), path)
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: row 2: missing field 'prompt\[0\].content'"):
        load_dataset_rows("dapo_math_17k", "train", "bundled", tmp_path)
    pq.write_table(pa.Table.from_pylist([{"prompt": prompt, "reward_model": {"ground_truth": "42"}}]), path)
    [row] = load_dataset_rows("dapo_math_17k", "train", "bundled", tmp_path).rows
    assert row["question"] == "What is 6*7?" and row["answer"] == "42"


def test_empty_file_names_file(tmp_path):
    path = write_lines(tmp_path / "gsm8k/train.jsonl", [])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: empty file"):
        load_dataset_rows("gsm8k", "train", "bundled", tmp_path)
    write_lines(path, ["", "  "])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: empty file"):
        load_dataset_rows("gsm8k", "train", "bundled", tmp_path)


def test_invalid_utf8_names_file_and_line(tmp_path):
    good = json.dumps(gsm8k_row(1))
    path = write_lines(tmp_path / "gsm8k/train.jsonl", [good, good.replace("1", "2"), b'{"question": "caf\xe9"}'])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: line 3: invalid UTF-8"):
        load_dataset_rows("gsm8k", "train", "bundled", tmp_path)


def test_invalid_utf8_in_json_array_names_line(tmp_path):
    path = write_lines(tmp_path / "deepscaler_partial/aime.json",
                       [b"[", b'{"problem": "ok", "answer": "1"},', b'{"problem": "\xff", "answer": "2"}', b"]"])
    write_lines(tmp_path / "deepscaler_partial/math.json", ['[{"problem": "p", "answer": "3"}]'])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: line 3: invalid UTF-8"):
        load_dataset_rows("deepscaler", "train", "bundled", tmp_path)


def test_invalid_json_names_file_and_line(tmp_path):
    path = write_lines(tmp_path / "gsm8k/train.jsonl", [json.dumps(gsm8k_row(1)), '{"question": '])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: line 2: invalid JSON"):
        load_dataset_rows("gsm8k", "train", "bundled", tmp_path)


def test_duplicate_ids_name_file_and_id(tmp_path):
    row = {"problem": "Find x.", "answer": "2", "unique_id": "test/algebra/1.json"}
    path = write_lines(tmp_path / "math500/test.jsonl",
                       [json.dumps(row), json.dumps({**row, "problem": "Find y."})])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: line 2: duplicate id 'math500-test/algebra/1.json'"):
        load_dataset_rows("math500", "eval", "bundled", tmp_path)


def test_unparsable_gold_is_skipped_up_to_the_threshold(tmp_path):
    rows = [gsm8k_row(i) for i in range(10)]
    rows[4]["answer"] = "no final answer marker"
    path = write_gsm8k(tmp_path, rows)
    with pytest.raises(DataError, match=rf"gsm8k \(train\): 1 of 10 gold answers do not parse .*{re.escape(str(path))}: line 5"):
        load_dataset_rows("gsm8k", "train", "bundled", tmp_path)
    loaded = load_dataset_rows("gsm8k", "train", "bundled", tmp_path, max_unparsable_fraction=0.1)
    assert loaded.stats["unparsable"] == 1 and loaded.stats["read"] == 10
    assert [row["id"] for row in loaded.rows] == [f"gsm8k-{i}" for i in range(10) if i != 4]
