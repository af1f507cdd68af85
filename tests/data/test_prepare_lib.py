"""prepare_datasets and write_prepared: decontamination, dedupe, caps, determinism, atomic output."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import grpo.data.prepare as prepare_mod
from grpo.data.errors import DataError
from grpo.data.prepare import prepare_datasets, write_prepared

EVAL_QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"


def write_jsonl_file(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


@pytest.fixture()
def data_dir(tmp_path) -> Path:
    """A small bundled-layout folder: gsm8k train (with one duplicate and one eval overlap, differing
    only in case and whitespace), gsm8k test, and a gsm_plus whose seed is a training question."""
    root = tmp_path / "bundled"
    train = [{"question": f"Sam has {i} pens and gets {i} more. How many pens?", "answer": f"...\n#### {2 * i}"}
             for i in range(40)]
    train.append({"question": "  sam HAS 3 pens and gets 3 more.\nHow many pens? ", "answer": "...\n#### 6"})
    train.append({"question": EVAL_QUESTION.upper().replace(" ", "   "), "answer": "...\n#### 7"})
    train.append({"question": "A seed question about 5 cats?", "answer": "...\n#### 5"})
    write_jsonl_file(root / "gsm8k/train.jsonl", train)
    write_jsonl_file(root / "gsm8k/test.jsonl", [{"question": EVAL_QUESTION, "answer": "3 + 4 = 7\n#### 7"},
                                                {"question": "Another test question?", "answer": "#### 1,000"}])
    write_jsonl_file(root / "gsm_plus/testmini.jsonl", [
        {"question": "A perturbed question about 6 cats?", "answer": "6", "perturbation_type": "numerical substitution",
         "seed_question": "A seed question about 5 cats?"},
        {"question": "A question missing information?", "answer": "None", "perturbation_type": "critical thinking",
         "seed_question": "A seed question about 5 cats?"},
    ])
    return root


def run(data_dir: Path, **overrides) -> prepare_mod.PreparedData:
    args = dict(train_sources=["gsm8k"], eval_benchmarks=["gsm8k", "gsm_plus"], val_fraction=0.1, max_train=None,
                max_val=None, max_eval={}, seed=0, source="bundled", data_dir=data_dir)
    return prepare_datasets(**{**args, **overrides})


def test_dedupe_and_decontamination_are_dropped_and_counted(data_dir):
    prepared = run(data_dir)
    questions = {row["question"] for row in prepared.train + prepared.val}
    assert len(questions) == 40
    assert not any("apples" in q.lower() or "seed question" in q for q in questions)
    dropped = prepared.stats["dropped"]
    assert dropped["duplicates"] == 1 and dropped["overlap_eval"] == 2
    assert dropped["overlap_eval_by_benchmark"] == {"gsm8k": 1, "gsm_plus": 1}
    assert prepared.stats["sources"]["gsm8k"] == {"read": 43, "unparsable": 0, "duplicates": 1, "overlap_eval": 2,
                                                  "usable": 40}
    assert prepared.stats["train"]["rows"] == 36 and prepared.stats["val"]["rows"] == 4
    assert prepared.eval["gsm8k"][1]["answer"] == "1000"
    assert [row["answer_type"] for row in prepared.eval["gsm_plus"]] == ["integer", "none"]


def test_decontamination_only_against_requested_benchmarks(data_dir):
    prepared = run(data_dir, eval_benchmarks=["gsm8k"])
    assert prepared.stats["dropped"]["overlap_eval_by_benchmark"] == {"gsm8k": 1}
    assert "gsm_plus" not in prepared.eval


def test_split_is_seeded_and_max_train_leaves_val_unchanged(data_dir):
    first, again = run(data_dir, seed=3), run(data_dir, seed=3)
    assert (first.train, first.val) == (again.train, again.val)
    other = run(data_dir, seed=4)
    assert [r["id"] for r in other.val] != [r["id"] for r in first.val]
    capped = run(data_dir, seed=3, max_train=5, max_val=3)
    assert capped.train == first.train[:5] and capped.val == first.val[:3]
    assert capped.stats["dropped"]["cap_train"] == 31 and capped.stats["dropped"]["cap_val"] == 1
    assert run(data_dir, seed=3, max_train=7).val == first.val


def test_eval_caps_take_the_first_rows_in_file_order(data_dir):
    prepared = run(data_dir, max_eval={"gsm8k": 1, "math500": 5})
    assert [row["id"] for row in prepared.eval["gsm8k"]] == ["gsm8k-0"]
    assert len(prepared.eval["gsm_plus"]) == 2
    assert prepared.stats["eval"]["gsm8k"] == {"rows": 1, "available": 2, "unparsable": 0}
    # the cap never weakens decontamination: the full benchmark is indexed
    assert prepared.stats["dropped"]["overlap_eval_by_benchmark"]["gsm8k"] == 1


def test_no_training_rows_left_is_an_error(data_dir):
    write_jsonl_file(data_dir / "gsm8k/train.jsonl", [{"question": EVAL_QUESTION, "answer": "#### 7"}])
    with pytest.raises(DataError, match="no training rows left from gsm8k"):
        run(data_dir)


def test_write_prepared_files_and_metrics(data_dir, tmp_path):
    prepared = run(data_dir)
    prepared.stats["ratio"] = 1 / 3
    out, metrics = tmp_path / "out/prepared", tmp_path / "out/metrics/prepare.json"
    write_prepared(prepared, out, metrics)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.jsonl")) == [
        "eval/gsm8k.jsonl", "eval/gsm_plus.jsonl", "train.jsonl", "val.jsonl"]
    first_line = (out / "train.jsonl").read_text(encoding="utf-8").splitlines()[0]
    assert list(json.loads(first_line)) == sorted(json.loads(first_line))
    assert len((out / "val.jsonl").read_text().splitlines()) == 4
    text = metrics.read_text()
    assert json.loads(text)["ratio"] == 0.333333 and text.index('"dropped"') < text.index('"eval"')
    before = {p: p.read_bytes() for p in out.rglob("*.jsonl")}
    write_prepared(run(data_dir), out, tmp_path / "again.json")  # a rerun writes identical bytes
    assert {p: p.read_bytes() for p in out.rglob("*.jsonl")} == before


def test_write_prepared_crash_leaves_nothing_finished(data_dir, tmp_path, monkeypatch):
    prepared = run(data_dir)
    out, metrics = tmp_path / "prepared", tmp_path / "prepare.json"
    write_prepared(prepared, out, metrics)
    old = {p: p.read_bytes() for p in out.rglob("*.jsonl")}
    real = prepare_mod.write_jsonl

    def failing(path, rows):
        if "eval" in Path(path).parts:
            raise RuntimeError("disk full")
        real(path, rows)

    monkeypatch.setattr(prepare_mod, "write_jsonl", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        write_prepared(prepared, out, metrics)
    assert {p: p.read_bytes() for p in out.rglob("*.jsonl")} == old  # the old complete out_dir is untouched
    assert not metrics.exists()  # no metrics file claims this run finished
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundled", "prepared"]  # no temp folders left


def test_prepare_on_bundled_defaults():
    """The shipped params.yaml's prepare section on the real bundled files."""
    prepared = prepare_datasets(["gsm8k"], ["gsm8k", "gsm_plus", "math500", "aime24"], 0.05, 256, 16,
                                {"gsm8k": 24, "gsm_plus": 24, "math500": 16, "aime24": 8}, 0, "auto",
                                prepare_mod.BUNDLED_DIR)
    assert (len(prepared.train), len(prepared.val)) == (256, 16)
    assert {name: len(rows) for name, rows in prepared.eval.items()} == {"gsm8k": 24, "gsm_plus": 24,
                                                                         "math500": 16, "aime24": 8}
    assert prepared.stats["sources"]["gsm8k"]["read"] == 7473
