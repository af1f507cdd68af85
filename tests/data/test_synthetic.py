"""The synthetic arithmetic task: deterministic from the seed, gold answers that an independent reading
of the question reproduces, balanced levels, a train split kept apart from the benchmark, the rows of
levels 1-3 unchanged since level 0 and ``prepare.arith_levels`` came, and bad levels refused."""
from __future__ import annotations

import hashlib
import json
import re
import runpy
import sys

import pytest

from grpo.config import ConfigError, parse_section
from grpo.data.loading import load_dataset_rows
from grpo.data.prepare import prepare_datasets
from grpo.data.synthetic import ARITH_LEVELS, DEFAULT_LEVELS, MAX_LEVEL, SPLIT_ROWS, generate_split, make_problem
from grpo.io import read_jsonl

_STEP = re.compile(r"has (\d+)|(?:buys|finds|is given) (\d+) more|(?:gives away|loses|sells) (\d+)|becomes (\d+) times")


def solve(question: str) -> tuple[int, int]:
    """(answer, number of operations), read from the sentences alone."""
    amount, ops = None, 0
    for start, add, remove, times in _STEP.findall(question):
        if start:
            amount = int(start)
            continue
        ops += 1
        amount = amount + int(add) if add else amount - int(remove) if remove else amount * int(times)
    return amount, ops


@pytest.mark.parametrize("split", list(SPLIT_ROWS))
def test_gold_answers_are_what_the_question_says(split):
    rows = generate_split(split, seed=0)
    assert len(rows) == SPLIT_ROWS[split]
    for i, row in enumerate(rows):
        answer, ops = solve(row["question"])
        assert (str(answer), ops) == (row["answer"], row["level"]), row
        assert row["level"] == DEFAULT_LEVELS[i % len(DEFAULT_LEVELS)] and answer > 0


# sha256 of json.dumps(generate_split(split, seed), sort_keys=True), computed with the generator as it was
# before level 0 and arith_levels existed (main at 3980c58): the default pipeline's data must not change
PINNED_SPLITS = {
    ("train", 0): "c0a13cf3756e557bea95ddf296cca26c6591ebec02c6686aca30c63ce108e996",
    ("train", 3): "99b396ca87815ed69181229983b3b2c1da92a603db1896b286572336dfea0e64",
    ("test", 0): "0ab65c2440e3b2deed3b2d1ffc4d33b504fb9527f2752e0e2ea226dbd2337208",
    ("test", 3): "f5ec8e12ad62249ec34ce8054a203862bc587c274bf95a2f585bc32b72c73e0b",
}
PINNED_ROWS = {
    ("train", 0, 0): {"question": "Emma has 16 stamps. Then Emma buys 9 more stamps. How many stamps does Emma "
                                  "have now?", "answer": "25", "level": 1},
    ("train", 0, 2): {"question": "Ava has 4 books. Then Ava gives away 2 books. Then the number of books Ava has "
                                  "becomes 2 times as large. Then Ava buys 20 more books. How many books does Ava "
                                  "have now?", "answer": "24", "level": 3},
    ("test", 5, 998): {"question": "Dan has 16 cards. Then Dan buys 19 more cards. Then Dan buys 10 more cards. "
                                   "Then Dan finds 3 more cards. How many cards does Dan have now?",
                       "answer": "48", "level": 3},
}


@pytest.mark.parametrize("split, seed", sorted(PINNED_SPLITS))
def test_levels_1_to_3_are_byte_identical_to_before_level_0(split, seed):
    for rows in (generate_split(split, seed), generate_split(split, seed, [1, 2, 3])):
        digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()
        assert digest == PINNED_SPLITS[split, seed]
    for (row_split, row_seed, index), row in PINNED_ROWS.items():
        assert make_problem(row_split, row_seed, index) == row


def test_level_0_is_one_small_addition_from_the_seed():
    rows = generate_split("test", 0, [0])
    assert rows == generate_split("test", 0, [0])  # deterministic
    assert rows != generate_split("test", 1, [0]) and rows != generate_split("train", 0, [0])
    for row in rows:
        start, more = map(int, re.fullmatch(
            r"(\w+) has (\d+) (\w+)\. Then \1 (?:buys|finds|is given) (\d+) more \3\. "
            r"How many \3 does \1 have now\?", row["question"]).group(2, 4))
        assert 2 <= start <= 9 and 2 <= more <= 9
        assert row["answer"] == str(start + more) and row["level"] == 0
        assert solve(row["question"]) == (start + more, 1)
    assert len({row["answer"] for row in rows}) == len(range(4, 19))  # every sum from 2+2 to 9+9 occurs


def test_rows_cycle_through_the_requested_levels():
    rows = generate_split("train", 0, [0, 2])
    assert [row["level"] for row in rows[:6]] == [0, 2, 0, 2, 0, 2]
    for i, row in enumerate(rows[:40]):
        answer, ops = solve(row["question"])
        assert (str(answer), ops) == (row["answer"], max(row["level"], 1))
        assert row == make_problem("train", 0, i, [row["level"]])  # a row's text depends on its index and level only
    assert [row["level"] for row in generate_split("test", 0, [3, 0, 0])[:6]] == [3, 0, 0, 3, 0, 0]


@pytest.mark.parametrize("levels", [[], [4], [-1], [0, 5]])
def test_the_generator_refuses_unknown_levels(levels):
    with pytest.raises(ValueError, match="arithmetic levels must be a non-empty list of 0, 1, 2, 3"):
        generate_split("train", 0, levels)


def test_config_and_generator_share_one_list_of_levels():
    assert MAX_LEVEL == max(ARITH_LEVELS) and set(DEFAULT_LEVELS) <= set(ARITH_LEVELS)
    for level in ARITH_LEVELS:
        assert make_problem("test", 0, 0, [level])["level"] == level
    assert parse_section("prepare", {}).arith_levels == list(DEFAULT_LEVELS)
    assert parse_section("prepare", {"arith_levels": [0, 3]}).arith_levels == [0, 3]


@pytest.mark.parametrize("raw, expected", [
    ([4], "prepare.arith_levels: got [4]; allowed: values from 0, 1, 2, 3 (got 4)"),
    ([0, 7, -1], "prepare.arith_levels: got [0, 7, -1]; allowed: values from 0, 1, 2, 3 (got 7, -1)"),
    ([], "prepare.arith_levels: got []; allowed: a non-empty list"),
    (["1"], "prepare.arith_levels[0]: expected an integer, got '1'"),
    ([True], "prepare.arith_levels[0]: expected an integer, got True"),
    (2, "prepare.arith_levels: expected a list, got 2"),
])
def test_bad_arith_levels_name_the_key(raw, expected):
    with pytest.raises(ConfigError) as err:
        parse_section("prepare", {"arith_levels": raw})
    assert expected in str(err.value)


def test_generation_follows_the_seed_and_the_split():
    assert generate_split("train", 3) == generate_split("train", 3)
    assert make_problem("train", 3, 7) != make_problem("train", 4, 7)
    assert make_problem("train", 3, 7) != make_problem("test", 3, 7)
    with pytest.raises(ValueError, match="unknown split 'val'"):
        generate_split("val", 0)


def test_loads_through_the_registry_whatever_the_source():
    rows = load_dataset_rows("arith", "eval", "hub", seed=5).rows  # generated: no hub access needed
    assert rows[0] == {"id": "arith-0", "source": "arith", "question": make_problem("test", 5, 0)["question"],
                       "answer": make_problem("test", 5, 0)["answer"], "answer_type": "integer", "meta": {"level": 1}}
    assert load_dataset_rows("arith", "eval", seed=5, levels=[1, 2, 3]).rows == rows
    easy = load_dataset_rows("arith", "eval", seed=5, levels=[0]).rows
    assert easy[1]["question"] == make_problem("test", 5, 1, [0])["question"] and easy[1]["meta"] == {"level": 0}


def test_prepare_trains_on_it_and_keeps_the_benchmark_out_of_training():
    prepared = prepare_datasets(["arith"], ["arith"], val_fraction=0.05, max_train=None, max_val=None,
                                max_eval={"arith": 30}, seed=0)
    test_questions = {r["question"] for r in load_dataset_rows("arith", "eval", seed=0).rows}
    assert not test_questions & {r["question"] for r in prepared.train + prepared.val}
    assert prepared.stats["dropped"]["overlap_eval"] > 0  # level-1 collisions exist and are dropped
    assert [r["meta"]["level"] for r in prepared.eval["arith"][:6]] == [1, 2, 3, 1, 2, 3]
    assert len(prepared.train) + len(prepared.val) + prepared.stats["dropped"]["overlap_eval"] \
        + prepared.stats["dropped"]["duplicates"] == SPLIT_ROWS["train"]


def test_prepare_passes_arith_levels_to_training_and_evaluation_alike():
    prepared = prepare_datasets(["arith"], ["arith"], val_fraction=0.05, max_train=64, max_val=16,
                                max_eval={"arith": 256}, seed=0, arith_levels=[0])
    rows = prepared.train + prepared.val + prepared.eval["arith"]
    assert len(prepared.eval["arith"]) == 256 and {row["meta"]["level"] for row in rows} == {0}
    test_questions = {r["question"] for r in load_dataset_rows("arith", "eval", seed=0, levels=[0]).rows}
    assert not test_questions & {r["question"] for r in prepared.train + prepared.val}
    default = prepare_datasets(["arith"], ["arith"], val_fraction=0.05, max_train=64, max_val=16,
                               max_eval={"arith": 256}, seed=0)
    assert default == prepare_datasets(["arith"], ["arith"], val_fraction=0.05, max_train=64, max_val=16,
                                       max_eval={"arith": 256}, seed=0, arith_levels=[1, 2, 3])


def test_the_prepare_stage_reads_arith_levels_from_params(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text(
        "prepare: {train_sources: [arith], benchmarks: [arith], max_train: 8, max_val: 4, max_eval: {arith: 8}, "
        "arith_levels: [0]}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["stages/prepare.py", "--params", "params.yaml"])
    try:  # as DVC runs it (tests/faults/test_bad_stage_inputs.py runs the stage the same way)
        runpy.run_module("stages.prepare", run_name="__main__")
    except SystemExit as exc:
        assert exc.code == 0
    for name in ("train.jsonl", "val.jsonl", "eval/arith.jsonl"):
        rows = read_jsonl(tmp_path / "data/prepared" / name)
        assert rows and {row["meta"]["level"] for row in rows} == {0}, name
    first = read_jsonl(tmp_path / "data/prepared/eval/arith.jsonl")[0]
    assert first["question"] == make_problem("test", 0, 0, [0])["question"]
