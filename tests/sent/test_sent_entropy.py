"""SENT clustering, semantic entropy and per-question scores, against values worked out by hand."""
from __future__ import annotations

import math

import pytest

from grpo.sent.entropy import Sample, cluster_answers, score_question, semantic_entropy


def test_clusters_and_entropy_by_hand():
    answers = ["4", "4", "4", "5", None, None, None, None]
    clusters = cluster_answers(answers, no_answer_cluster=True)
    assert clusters == [[0, 1, 2], [3], [4, 5, 6, 7]]
    expected = -(3 / 8 * math.log(3 / 8) + 1 / 8 * math.log(1 / 8) + 4 / 8 * math.log(4 / 8))
    assert semantic_entropy([len(c) for c in clusters]) == pytest.approx(expected, abs=1e-12)


def test_unanswered_samples_as_singletons():
    answers = ["4", None, "4", None]
    clusters = cluster_answers(answers, no_answer_cluster=False)
    assert clusters == [[0, 2], [1], [3]]
    assert semantic_entropy([2, 1, 1]) == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))


def test_equivalent_forms_share_a_cluster():
    clusters = cluster_answers(["\\frac{1}{2}", "0.5", "1/2", "2", "1,000", "1000"], no_answer_cluster=True)
    assert clusters == [[0, 1, 2], [3], [4, 5]]


def test_entropy_edges():
    assert semantic_entropy([8]) == 0.0 and math.copysign(1, semantic_entropy([8])) == 1  # not -0.0
    assert semantic_entropy([1] * 8) == pytest.approx(math.log(8))
    with pytest.raises(ValueError):
        semantic_entropy([])
    with pytest.raises(ValueError):
        semantic_entropy([3, 0])


def test_score_question_counts_pass_rate_truncation_and_length():
    row = {"id": "q1", "question": "?", "answer": "4", "answer_type": "integer"}
    samples = [
        Sample("<reasoning>\n2+2</reasoning>\n<answer>\n4\n</answer>", "stop", 10),
        Sample("<reasoning>\nso the answer is 4.\n", "stop", 20),
        Sample("<reasoning>\nI think 5", "stop", 30),
        # truncated mid-thought: the last-number fallback does not apply, so no answer
        Sample("<reasoning>\nfirst 3 then", "length", 40),
    ]
    scored = score_question(row, samples, no_answer_cluster=True)
    assert scored["id"] == "q1" and scored["n"] == 4
    assert scored["clusters"] == [
        {"answer": "4", "count": 2, "correct": True},
        {"answer": "5", "count": 1, "correct": False},
        {"answer": None, "count": 1, "correct": False},
    ]
    assert scored["pass_rate"] == 0.5
    assert scored["truncated"] == 0.25
    assert scored["mean_length"] == 25.0
    assert scored["entropy"] == pytest.approx(semantic_entropy([2, 1, 1]))


def test_score_question_needs_samples():
    with pytest.raises(ValueError, match="no samples"):
        score_question({"id": "q", "answer": "1", "answer_type": "integer"}, [], no_answer_cluster=True)
