"""Question normalisation, dedupe, overlap removal and the seeded split."""
from __future__ import annotations

import random

from grpo.data.splitting import cap, dedupe_by_question, drop_overlap, normalize_question, split_train_val


def rows(n: int, prefix: str = "q") -> list[dict]:
    return [{"id": f"{prefix}-{i}", "question": f"Question number {i}?", "source": prefix} for i in range(n)]


def ids(rows_: list[dict]) -> list[str]:
    return [row["id"] for row in rows_]


def test_normalize_question():
    assert normalize_question("  What IS\n\t2 + 2 ?  ") == "what is 2 + 2"
    assert normalize_question("“Quoted.”") == "quoted"
    assert normalize_question("ｆｕｌｌ　ｗｉｄｔｈ") == "full width"  # NFKC
    assert normalize_question("Find $x$.") == "find $x$"  # $ is a symbol, not punctuation
    assert normalize_question("...") == ""


def test_dedupe_keeps_first_of_each_normalised_question():
    data = [{"id": "a", "question": "Add 1 and 2."}, {"id": "b", "question": "add 1  and 2"},
            {"id": "c", "question": "Add 2 and 1."}]
    kept, dropped = dedupe_by_question(data)
    assert ids(kept) == ["a", "c"] and ids(dropped) == ["b"]


def test_drop_overlap_counts_per_benchmark():
    data = [{"id": "a", "question": "  ADD 1 and 2 "}, {"id": "b", "question": "Other?"}]
    kept, hits = drop_overlap(data, {"add 1 and 2": {"gsm8k", "gsm_plus"}})
    assert ids(kept) == ["b"] and hits == {"gsm8k": 1, "gsm_plus": 1}


def test_split_is_deterministic_and_seeded():
    data = rows(100)
    train, val = split_train_val(data, 0.1, seed=0)
    assert len(val) == 10 and len(train) == 90 and not set(ids(train)) & set(ids(val))
    shuffled = data[:]
    random.Random(7).shuffle(shuffled)
    assert split_train_val(shuffled, 0.1, seed=0) == (train, val)  # input order does not matter
    other_train, other_val = split_train_val(data, 0.1, seed=1)
    assert ids(other_val) != ids(val) and ids(other_train) != ids(train)


def test_val_size_rounds_up():
    train, val = split_train_val(rows(21), 0.05, seed=0)
    assert len(val) == 2 and len(train) == 19


def test_cap_takes_a_prefix():
    data = rows(5)
    assert cap(data, None) == data and ids(cap(data, 2)) == ["q-0", "q-1"] and cap(data, 10) == data
