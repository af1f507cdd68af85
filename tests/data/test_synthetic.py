"""The synthetic arithmetic task: deterministic from the seed, gold answers that an independent reading
of the question reproduces, balanced levels, and a train split kept apart from the benchmark."""
from __future__ import annotations

import re

import pytest

from grpo.data.loading import load_dataset_rows
from grpo.data.prepare import prepare_datasets
from grpo.data.synthetic import MAX_LEVEL, SPLIT_ROWS, generate_split, make_problem

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
        assert row["level"] == 1 + i % MAX_LEVEL and answer > 0


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


def test_prepare_trains_on_it_and_keeps_the_benchmark_out_of_training():
    prepared = prepare_datasets(["arith"], ["arith"], val_fraction=0.05, max_train=None, max_val=None,
                                max_eval={"arith": 30}, seed=0)
    test_questions = {r["question"] for r in load_dataset_rows("arith", "eval", seed=0).rows}
    assert not test_questions & {r["question"] for r in prepared.train + prepared.val}
    assert prepared.stats["dropped"]["overlap_eval"] > 0  # level-1 collisions exist and are dropped
    assert [r["meta"]["level"] for r in prepared.eval["arith"][:6]] == [1, 2, 3, 1, 2, 3]
    assert len(prepared.train) + len(prepared.val) + prepared.stats["dropped"]["overlap_eval"] \
        + prepared.stats["dropped"]["duplicates"] == SPLIT_ROWS["train"]
