"""The metric definitions against brute force and hand-computed examples."""
from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from grpo.eval.metrics import (
    Lift, QuestionMismatch, SampleResult, cluster_answers, k_values, maj_at_k, majority_index, mean_and_stderr,
    paired_lift, pass_at_k, summarize,
)
from grpo.verify import answers_equivalent


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """The fraction of k-subsets of n samples (the first c correct) that contain a correct sample."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 10])
def test_pass_at_k_matches_enumeration_of_k_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_is_stable_for_many_samples():
    # C(1024, 512) overflows a float; the product form does not
    assert pass_at_k(1024, 1, 512) == pytest.approx(0.5)
    assert pass_at_k(1024, 0, 512) == 0.0
    assert pass_at_k(64, 3, 1) == pytest.approx(3 / 64)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_k_values_are_powers_of_two_up_to_n():
    assert k_values(1) == [1]
    assert k_values(6) == [1, 2, 4]
    assert k_values(16) == [1, 2, 4, 8, 16]


def test_standard_error_by_hand():
    # per-question means 1, 0, 0.5, 0.5: mean 0.5, sample variance (0.25+0.25+0+0)/3 = 1/6
    mean, se = mean_and_stderr([1.0, 0.0, 0.5, 0.5])
    assert mean == 0.5
    assert se == pytest.approx(math.sqrt((1 / 6) / 4))
    assert mean_and_stderr([0.7]) == (0.7, 0.0)


def exact(a: str, b: str) -> bool:
    return a == b


def test_majority_vote_counts_and_breaks_ties_by_first_appearance():
    ids = cluster_answers(["3", None, "5", "5", "3", "7"], exact)
    assert ids == [0, None, 1, 1, 0, 2]
    assert majority_index(ids, 6) == 0  # 3 and 5 tie at two votes; 3 appeared first
    assert majority_index(ids, 4) == 2  # first four: 5 has two votes, 3 one
    assert majority_index(ids, 2) == 0  # the unanswered sample does not vote
    assert majority_index([None, None], 2) is None


def test_maj_at_k_clusters_equivalent_answers_written_differently():
    def sample(answer, correct):
        return SampleResult(correct=correct, answer=answer, length=10, finish_reason="stop")

    # gold 1/2: "0.5" and "\frac{1}{2}" are one cluster of two and outvote "3" (twice) only at k=5
    samples = [sample("3", False), sample("0.5", True), sample("3", False), sample("\\frac{1}{2}", True),
               sample("1/2", True)]
    assert cluster_answers([s.answer for s in samples], answers_equivalent) == [0, 1, 0, 1, 1]
    assert maj_at_k(samples, 2, answers_equivalent) is False  # tie 1-1: "3" came first
    assert maj_at_k(samples, 4, answers_equivalent) is False  # tie 2-2: "3" came first
    assert maj_at_k(samples, 5, answers_equivalent) is True  # 3 votes for one half
    assert maj_at_k([sample(None, False)] * 3, 3, answers_equivalent) is False


def test_summarize():
    def s(correct, answer, length=10, finish="stop", timed_out=False):
        return SampleResult(correct, answer, length, finish, timed_out)

    groups = [
        [s(True, "4"), s(True, "4"), s(False, "5", timed_out=True), s(True, "4")],
        [s(False, "1"), s(False, "2", timed_out=True), s(False, "2"), s(True, "3")],
        [s(False, None, 100, "length")] * 4,
    ]
    m = summarize(groups, equivalent=exact)
    assert m["num_questions"] == 3 and m["n"] == 4
    assert m["pass@1"] == pytest.approx((0.75 + 0.25 + 0) / 3)
    assert m["pass@1_stderr"] == pytest.approx(mean_and_stderr([0.75, 0.25, 0.0])[1])
    assert m["pass@2"] == pytest.approx((pass_at_k(4, 3, 2) + pass_at_k(4, 1, 2)) / 3)
    assert m["pass@4"] == pytest.approx(2 / 3)
    assert m["maj@2"] == pytest.approx(1 / 3)  # q1: 4 wins; q2: 1 vs 2 tie -> 1 (wrong)
    assert m["maj@4"] == pytest.approx(1 / 3)  # q2: 2 wins with two votes (wrong)
    assert "maj@1" not in m
    assert m["truncation_rate"] == pytest.approx(4 / 12)
    assert m["answer_rate"] == pytest.approx(8 / 12)
    assert m["mean_length"] == pytest.approx((8 * 10 + 4 * 100) / 12)
    assert "tokens_per_s" not in m  # a measured figure, logged apart (grpo/measured.py)
    assert m["verify_timeouts"] == 2
    with pytest.raises(ValueError):
        summarize([[s(True, "1")], []], equivalent=exact)


def test_paired_lift_by_hand():
    # d = trained - base per question = [1, 0, 0, -1, 1]: mean 0.2; deviations 0.8, -0.2, -0.2, -1.2, 0.8,
    # squares 0.64 + 0.04 + 0.04 + 1.44 + 0.64 = 2.8; variance 2.8 / 4 = 0.7; SE sqrt(0.7 / 5) = sqrt(0.14)
    base = {"q1": 0.0, "q2": 1.0, "q3": 1.0, "q4": 1.0, "q5": 0.0}
    trained = {"q5": 1.0, "q4": 0.0, "q3": 1.0, "q2": 1.0, "q1": 1.0}  # matched by id, not by position
    lift = paired_lift(base, trained)
    assert lift.n == 5
    assert lift.lift == pytest.approx(0.2, abs=1e-12)
    assert lift.stderr == pytest.approx(math.sqrt(0.14), abs=1e-12) and lift.stderr == pytest.approx(0.374166, abs=1e-6)
    assert lift.z == pytest.approx(0.2 / math.sqrt(0.14), abs=1e-12) and lift.z == pytest.approx(0.534522, abs=1e-6)


def slow_paired(base: dict[str, list[bool]], trained: dict[str, list[bool]]) -> tuple[float, float]:
    """Independently: per-question means from the raw samples, differences, statistics.stdev."""
    diffs = [statistics.fmean(trained[q]) - statistics.fmean(base[q]) for q in base]
    return statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))


def test_paired_lift_against_a_slow_computation_with_several_samples_per_question():
    rng = random.Random(7)
    ids = [f"gsm8k-{i}" for i in range(200)]
    difficulty = {q: rng.random() for q in ids}  # shared by both models: what pairing takes out
    base = {q: [rng.random() < difficulty[q] * 0.8 for _ in range(4)] for q in ids}
    trained = {q: [rng.random() < min(1.0, difficulty[q] * 0.8 + 0.1) for _ in range(4)] for q in reversed(ids)}
    lift = paired_lift({q: sum(s) / 4 for q, s in base.items()}, {q: sum(s) / 4 for q, s in trained.items()})
    mean, se = slow_paired(base, trained)
    assert lift == Lift(pytest.approx(mean, abs=1e-12), pytest.approx(se, abs=1e-12), 200)
    # with the same questions, the lift is the difference of the two pass@1 ...
    pass1 = [statistics.fmean(v for s in side.values() for v in s) for side in (base, trained)]
    assert lift.lift == pytest.approx(pass1[1] - pass1[0], abs=1e-12)
    # ... and its paired SE is well under the one that treats the two scores as independent
    unpaired = math.hypot(*(mean_and_stderr([sum(s) / 4 for s in side.values()])[1] for side in (base, trained)))
    assert lift.stderr < 0.75 * unpaired


def test_paired_lift_refuses_different_questions():
    with pytest.raises(QuestionMismatch, match=r"1 only in the base \['q3'\], 2 only in the trained model "
                                               r"\['q4', 'q5'\]"):
        paired_lift({"q1": 1.0, "q2": 0.0, "q3": 1.0}, {"q1": 1.0, "q2": 1.0, "q4": 0.0, "q5": 0.0})
    with pytest.raises(ValueError, match="at least one question"):
        paired_lift({}, {})


def test_paired_lift_without_spread_has_no_z():
    assert paired_lift({"q": 0.0}, {"q": 1.0}) == Lift(1.0, 0.0, 1)  # one question: no standard error
    same = paired_lift({"a": 0.5, "b": 1.0}, {"a": 0.5, "b": 1.0})
    assert (same.lift, same.stderr, same.z) == (0.0, 0.0, None)
