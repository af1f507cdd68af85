"""eval_summary: per-pair metrics files merge into one nested metrics/eval.json and a flat CSV."""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.eval.summary import LIFT, LIFT_N, LIFT_STDERR, add_lifts, collect_metrics, question_scores, write_summary
from grpo.io import write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def write_pair(root: Path, model: str, benchmark: str, **metrics) -> None:
    path = root / "metrics" / "eval" / model / f"{benchmark}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics))


def write_samples(root: Path, model: str, benchmark: str, correct: dict[str, list[int]]) -> None:
    """eval/<model>/<benchmark>.jsonl as grpo/eval/run.py writes it: one line per sample, in question order."""
    write_jsonl(root / "eval" / model / f"{benchmark}.jsonl", [
        {"id": q, "sample": i, "completion": f"<answer>{c}</answer>", "answer": str(c), "gold": "1",
         "correct": bool(c), "length": 7, "finish_reason": "stop"}
        for q, samples in correct.items() for i, c in enumerate(samples)])


def write_evaluation(root: Path, model: str, benchmark: str, correct: dict[str, list[int]]) -> None:
    """One evaluate stage's two outputs: the samples and (the keys the lift reads) its metrics."""
    write_samples(root, model, benchmark, correct)
    per_question = [sum(c) / len(c) for c in correct.values()]
    write_pair(root, model, benchmark, **{"num_questions": len(correct), "n": len(next(iter(correct.values()))),
                                          "pass@1": sum(per_question) / len(per_question)})


# arith, two samples per question: per-question means base [0, 0.5, 1, 0.5, 0], final [1, 0.5, 1, 0, 0.5];
# d = [1, 0, 0, -0.5, 0.5]: mean 0.2, deviations 0.8, -0.2, -0.2, -0.7, 0.3, squares 0.64 + 0.04 + 0.04 + 0.49
# + 0.09 = 1.3, variance 1.3 / 4 = 0.325, SE sqrt(0.325 / 5) = sqrt(0.065) = 0.254951
ARITH_BASE = {"arith-0": [0, 0], "arith-1": [1, 0], "arith-2": [1, 1], "arith-3": [0, 1], "arith-4": [0, 0]}
ARITH_FINAL = {"arith-4": [1, 0], "arith-3": [0, 0], "arith-2": [1, 1], "arith-1": [0, 1], "arith-0": [1, 1]}


def test_question_scores_average_each_questions_samples(tmp_path):
    write_samples(tmp_path, "final", "arith", ARITH_FINAL)
    assert question_scores(tmp_path / "eval/final/arith.jsonl") == {
        "arith-0": 1.0, "arith-1": 0.5, "arith-2": 1.0, "arith-3": 0.0, "arith-4": 0.5}


def test_lifts_pair_questions_by_id(tmp_path):
    write_evaluation(tmp_path, "base", "arith", ARITH_BASE)
    write_evaluation(tmp_path, "final", "arith", ARITH_FINAL)  # the same questions in another order
    write_evaluation(tmp_path, "best", "arith", {q: [1, 1] for q in ARITH_BASE})
    write_evaluation(tmp_path, "best", "gsm8k", {"gsm8k-0": [1, 1]})  # no base result: no lift
    nested = collect_metrics(tmp_path / "metrics" / "eval")
    lifted = add_lifts(nested, tmp_path / "eval")

    final = lifted["final"]["arith"]
    assert final[LIFT] == pytest.approx(0.2, abs=1e-12) and final[LIFT_N] == 5
    assert final[LIFT_STDERR] == pytest.approx(math.sqrt(0.065), abs=1e-12)
    assert final[LIFT] == pytest.approx(final["pass@1"] - nested["base"]["arith"]["pass@1"], abs=1e-12)
    # best is right everywhere: d = 1 - base = [1, 0.5, 0, 0.5, 1], mean 0.6, variance (0.16+0.01+0.36+0.01+0.16)/4
    best = lifted["best"]["arith"]
    assert (best[LIFT], best[LIFT_N]) == (pytest.approx(0.6, abs=1e-12), 5)
    assert best[LIFT_STDERR] == pytest.approx(math.sqrt(0.175 / 5), abs=1e-12)
    assert LIFT not in lifted["best"]["gsm8k"] and LIFT not in lifted["base"]["arith"]
    assert LIFT not in nested["final"]["arith"]  # the input is left as it was


def test_different_questions_are_an_error_naming_the_benchmark(tmp_path):
    write_evaluation(tmp_path, "base", "arith", ARITH_BASE)
    write_evaluation(tmp_path, "final", "arith", {**{q: ARITH_FINAL[q] for q in list(ARITH_BASE)[:4]},
                                                  "arith-9": [1, 1]})
    with pytest.raises(ValueError, match=r"benchmark arith: final and base were evaluated on different questions.*"
                                         r"1 only in the base \['arith-4'\], 1 only in the trained model \['arith-9'\]"):
        add_lifts(collect_metrics(tmp_path / "metrics" / "eval"), tmp_path / "eval")


def test_samples_that_disagree_with_their_metrics_are_an_error(tmp_path):
    write_evaluation(tmp_path, "base", "arith", ARITH_BASE)
    write_evaluation(tmp_path, "final", "arith", ARITH_FINAL)
    write_samples(tmp_path, "final", "arith", {"arith-0": [1, 1]})  # a stale samples file
    with pytest.raises(ValueError, match=r"benchmark arith: metrics/eval/final/arith.json counts 5 questions, "
                                         r".*eval/final/arith.jsonl holds 1"):
        add_lifts(collect_metrics(tmp_path / "metrics" / "eval"), tmp_path / "eval")
    (tmp_path / "eval/final/arith.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="arith.jsonl is missing, but its metrics are not"):
        add_lifts(collect_metrics(tmp_path / "metrics" / "eval"), tmp_path / "eval")


def test_a_repeated_question_id_is_an_error(tmp_path):
    write_samples(tmp_path, "base", "arith", ARITH_BASE)
    path = tmp_path / "eval/base/arith.jsonl"
    path.write_text(path.read_text() + path.read_text().splitlines(keepends=True)[0])
    with pytest.raises(ValueError, match="question id 'arith-0' sample 0 appears twice"):
        question_scores(path)


def test_nesting_and_csv(tmp_path):
    write_pair(tmp_path, "final", "math500", **{"pass@1": 0.1234567891, "n": 1})
    write_pair(tmp_path, "base", "gsm8k", **{"pass@1": 0.25, "n": 4, "maj@2": 0.5})
    write_pair(tmp_path, "best", "gsm8k", **{"pass@1": 1 / 3, "n": 1})
    write_pair(tmp_path, "base", "math500", **{"pass@1": 0.0, "n": 1})
    nested = collect_metrics(tmp_path / "metrics" / "eval")
    write_summary(nested, tmp_path / "metrics" / "eval.json", tmp_path / "eval" / "summary.csv")

    text = (tmp_path / "metrics" / "eval.json").read_text()
    merged = json.loads(text)
    assert merged == {
        "base": {"gsm8k": {"pass@1": 0.25, "n": 4, "maj@2": 0.5}, "math500": {"pass@1": 0.0, "n": 1}},
        "best": {"gsm8k": {"pass@1": 0.333333, "n": 1}},
        "final": {"math500": {"pass@1": 0.123457, "n": 1}},
    }
    assert text.index('"best"') < text.index('"final"') and text.index('"maj@2"') < text.index('"n"')  # sorted

    with (tmp_path / "eval" / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["model"], r["benchmark"]) for r in rows] == [
        ("base", "gsm8k"), ("base", "math500"), ("final", "math500"), ("best", "gsm8k")]
    assert list(rows[0]) == ["model", "benchmark", "maj@2", "n", "pass@1"]
    assert rows[0]["maj@2"] == "0.5" and rows[1]["maj@2"] == "" and rows[3]["pass@1"] == "0.333333"


def test_no_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the evaluate stages first"):
        collect_metrics(tmp_path / "metrics" / "eval")


def test_stage_script(tmp_path):
    write_pair(tmp_path, "base", "gsm8k", **{"pass@1": 0.5, "n": 1})
    (tmp_path / "params.yaml").write_text("select: {}\n")
    proc = subprocess.run([sys.executable, "-m", "stages.eval_summary"], cwd=tmp_path, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "metrics" / "eval.json").read_text()) == {"base": {"gsm8k": {"n": 1, "pass@1": 0.5}}}
    assert (tmp_path / "eval" / "summary.csv").read_text().splitlines()[1] == "base,gsm8k,1,0.5"


def test_stage_script_writes_the_lifts_for_dvc_metrics(tmp_path):
    write_evaluation(tmp_path, "base", "arith", ARITH_BASE)
    write_evaluation(tmp_path, "final", "arith", ARITH_FINAL)
    (tmp_path / "params.yaml").write_text("select: {}\n")
    outputs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "stages.eval_summary"], cwd=tmp_path, capture_output=True,
                              text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert proc.returncode == 0, proc.stderr
        outputs.append([(tmp_path / p).read_bytes() for p in ("metrics/eval.json", "eval/summary.csv")])
    assert outputs[0] == outputs[1]  # same inputs, same bytes
    final = json.loads((tmp_path / "metrics" / "eval.json").read_text())["final"]["arith"]
    assert (final[LIFT], final[LIFT_STDERR], final[LIFT_N]) == (0.2, 0.254951, 5)  # rounded to 6 places
    with (tmp_path / "eval" / "summary.csv").open() as fh:
        rows = {r["model"]: r for r in csv.DictReader(fh)}
    assert rows["final"][LIFT] == "0.2" and rows["final"][LIFT_STDERR] == "0.254951" and rows["base"][LIFT] == ""
