"""The registry against the real bundled files: every dataset loads, counts match the README, and the
gold answers parse the way each dataset writes them."""
from __future__ import annotations

import hashlib
import json
import re
from collections import Counter

import pytest

from grpo.config import BENCHMARKS, DATASETS
from grpo.data.errors import DataError
from grpo.data.loading import BUNDLED_DIR, load_dataset_rows
from grpo.data.registry import REGISTRY, get_spec
from grpo.data.answers import ANSWER_TYPES, parse_gsm8k, parse_gsm_plus, parse_math, parse_numeric
from grpo.data.loading import read_records
from grpo.data.registry import DAPO_PREFIX, DAPO_SUFFIX, EVAL, strip_dapo_wrapper


def readme_table() -> list[tuple[str, str, int]]:
    """(dataset, file, rows) for each row of data/bundled/README.md's table."""
    rows = []
    for line in (BUNDLED_DIR / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[2].isdigit():
            rows.append((cells[0], cells[1].strip("`"), int(cells[2])))
    return rows


@pytest.fixture(scope="module")
def bundled() -> dict[tuple[str, str], list[dict]]:
    """Every (dataset, role) that has a bundled copy, loaded once."""
    return {(name, role): load_dataset_rows(name, role, "bundled").rows
            for name, spec in REGISTRY.items() for role, split in spec.splits.items() if split.files}


def test_config_names_match_registry():
    assert set(DATASETS) == set(REGISTRY)
    assert set(BENCHMARKS) == {name for name, spec in REGISTRY.items() if EVAL in spec.splits}


def test_bundled_files_are_byte_identical_to_their_source():
    checked = 0
    for source_md in BUNDLED_DIR.glob("*/SOURCE.md"):
        for file, sha in re.findall(r"^\| (\S+) \| \d+ \| [\d,]+ \| ([0-9a-f]{64}) \|$", source_md.read_text(), re.M):
            assert hashlib.sha256((source_md.parent / file).read_bytes()).hexdigest() == sha, file
            checked += 1
    assert checked == 10


def test_readme_row_counts_match_files_and_registry():
    table = readme_table()
    assert len(table) == 10
    for dataset, file, rows in table:
        assert sum(1 for _ in read_records(BUNDLED_DIR / file)) == rows, file
        assert any(file in split.files for split in get_spec(dataset).splits.values()), (dataset, file)


def test_every_bundled_dataset_loads_into_the_schema(bundled):
    readme_rows = Counter()
    for dataset, _, rows in readme_table():
        readme_rows[dataset] += rows
    for (name, role), rows in bundled.items():
        spec = get_spec(name)
        assert rows, (name, role)
        assert len({row["id"] for row in rows}) == len(rows)
        for row in rows:
            assert set(row) == {"id", "source", "question", "answer", "answer_type", "meta"}
            assert row["source"] == name and row["question"].strip() and isinstance(row["answer"], str)
            assert row["answer_type"] in spec.answer_types and row["answer_type"] in ANSWER_TYPES
            json.dumps(row)  # meta must serialise
    # gsm8k counts both of its files (train and test roles)
    loaded = Counter()
    for (name, role), rows in bundled.items():
        loaded[name] += len(rows)
    skipped = {"deepscaler": 4}  # math.json: 2 null and 2 empty gold answers
    assert {name: loaded[name] + skipped.get(name, 0) for name in loaded} == dict(readme_rows)


def test_gsm8k_final_answer_after_hashes_without_commas(bundled):
    assert parse_gsm8k("She pays 2 * 617 = <<2*617=1234>>1,234.\n#### 1,234") .answer == "1234"
    assert parse_gsm8k("no final answer") is None
    train = bundled[("gsm8k", "train")]
    assert train[0]["answer"] == "72" and train[0]["answer_type"] == "integer"
    assert train[0]["meta"]["solution"].endswith("#### 72")
    assert not any("," in row["answer"] for row in train)
    assert len(bundled[("gsm8k", "eval")]) == 1319


def test_aime_and_amc_answers_are_canonical_integers(bundled):
    aime24 = bundled[("aime24", "eval")]
    raw = [json.loads(line)["answer"] for line in (BUNDLED_DIR / "aime24/test.jsonl").read_text().splitlines()]
    assert "025" in raw
    assert [row["answer"] for row in aime24] == [str(int(a)) for a in raw]
    assert "25" in {row["answer"] for row in aime24}
    assert parse_numeric("025").answer == "25" and parse_numeric(75.0).answer == "75"
    assert parse_numeric(2.5).answer_type == "number" and parse_numeric(True) is None
    assert bundled[("amc23", "eval")][0]["answer"] == "27"
    assert bundled[("aime25", "eval")][0]["answer"] == "70"


def test_gsm_plus_none_rows_and_perturbation_type(bundled):
    rows = bundled[("gsm_plus", "eval")]
    none_rows = [row for row in rows if row["answer_type"] == "none"]
    assert len(none_rows) == 300
    assert {row["answer"] for row in none_rows} == {"None"}
    assert {row["meta"]["perturbation_type"] for row in none_rows} == {"critical thinking"}
    assert len(Counter(row["meta"]["perturbation_type"] for row in rows)) == 8
    assert parse_gsm_plus("1/4").answer_type == "latex" and parse_gsm_plus("4.33").answer_type == "number"


def test_math500_keeps_latex_and_own_ids(bundled):
    rows = bundled[("math500", "eval")]
    assert rows[0]["answer"] == r"\left( 3, \frac{\pi}{2} \right)" and rows[0]["answer_type"] == "latex"
    assert rows[0]["id"] == "math500-test/precalculus/807.json"
    assert {"subject", "level"} <= set(rows[0]["meta"])
    assert parse_math("42").answer_type == "integer" and parse_math(None) is None and parse_math(" ") is None


def test_dapo_question_is_bare_and_wrapper_is_stripped(bundled):
    rows = bundled[("dapo_math_17k", "train")]
    assert len(rows) == 17917 and rows[0]["answer"] == "34"
    assert rows[0]["question"].startswith("In triangle $ABC$")
    assert strip_dapo_wrapper(DAPO_PREFIX + "What is 1+1?" + DAPO_SUFFIX) == "What is 1+1?"


def test_deepscaler_concatenates_both_files_and_skips_null_answers():
    loaded = load_dataset_rows("deepscaler", "train", "bundled")
    assert loaded.stats["read"] == 975 + 7474
    assert loaded.stats["unparsable"] == 4
    assert len(loaded.rows) == 975 + 7474 - 4


def test_open_rs_is_hub_only():
    with pytest.raises(DataError, match=r"open_rs has no bundled copy.*knoveleng/open-rs"):
        load_dataset_rows("open_rs", "train", "bundled")


def test_hub_offline_names_dataset_and_suggests_bundled(tmp_path):
    with pytest.raises(DataError, match=r"gsm8k: could not load openai/gsm8k .*source: bundled"):
        load_dataset_rows("gsm8k", "train", "hub")
    # auto without the bundled file falls back to the hub, which fails the same clear way
    with pytest.raises(DataError, match=r"math500: could not load HuggingFaceH4/MATH-500"):
        load_dataset_rows("math500", "eval", "auto", data_dir=tmp_path)


def test_unknown_names_and_roles():
    with pytest.raises(DataError, match="unknown dataset 'gsm9k'"):
        load_dataset_rows("gsm9k", "train")
    with pytest.raises(DataError, match="math500 has no 'train' split"):
        load_dataset_rows("math500", "train")
    with pytest.raises(DataError, match="unknown source 'disk'"):
        load_dataset_rows("gsm8k", "train", "disk")
