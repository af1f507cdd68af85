"""Benchmark metrics as pure functions of per-sample results (no I/O, no model).

- pass@1: the mean correctness over all samples (with n samples per question this equals the mean of
  the per-question means), with its standard error over questions: the sample standard deviation
  (ddof 1) of the per-question mean correctness divided by sqrt(number of questions). It measures how
  much the score would move on another draw of questions of the same kind, which is what matters when
  comparing base, final and best on 8 to 500 questions.
- pass@k: the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k), averaged over
  questions, for every k in {1, 2, 4, 8, ...} up to n.
- paired lift: how much a trained model beats the base on the same questions, with the standard error
  of the per-question differences (``paired_lift``).
- maj@k: a majority vote over the first k samples of a question; answers are clustered by verified
  equivalence (``1/2`` and ``0.5`` vote together), unanswered samples do not vote, a tie goes to the
  cluster whose first answer came earliest, and the vote is correct when that answer is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

Equivalent = Callable[[str, str], bool]


@dataclass(frozen=True)
class SampleResult:
    """One generated sample, as the metrics need it."""

    correct: bool
    answer: str | None  # the extracted answer; None when the response has none
    length: int  # generated tokens
    finish_reason: str  # "stop" or "length" (truncated)
    timed_out: bool = False  # the equivalence check ran out of time (then ``correct`` is False)


def k_values(n: int) -> list[int]:
    """The k reported for n samples: 1, 2, 4, 8, ... up to n."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that at least one of k samples drawn without replacement from n (c correct) is correct.

    1 - C(n-c, k) / C(n, k) written as a product, 1 - prod_{i=n-c+1..n} (1 - k/i), so that large n
    (64 samples and more) neither overflows nor loses precision to a difference of huge binomials.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0  # every k-subset contains a correct sample
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std, ddof 1); the error is 0 for fewer than 2 values."""
    if not values:
        raise ValueError("mean_and_stderr needs at least one value")
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


@dataclass(frozen=True)
class Lift:
    """A trained model's pass@1 minus the base's on the same questions (fractions, not points)."""

    lift: float  # mean over questions of trained - base
    stderr: float  # paired: std (ddof 1) of the per-question differences / sqrt(n); 0 for n < 2
    n: int  # questions compared

    @property
    def z(self) -> float | None:
        """lift / stderr; None when the standard error is 0 (every difference equal, or one question)."""
        return self.lift / self.stderr if self.stderr > 0 else None


class QuestionMismatch(ValueError):
    """The two sides of a paired lift hold different question ids."""


def paired_lift(base: Mapping[str, float], trained: Mapping[str, float]) -> Lift:
    """The lift of ``trained`` over ``base``: both map a question id to that question's mean correctness
    (the fraction of its n samples that are correct; 0 or 1 when greedy).

    Per question d_i = trained_i - base_i; lift = mean(d), stderr = std(d, ddof 1) / sqrt(n). Why
    paired: both models answer the same questions, and a question's difficulty moves both scores
    together (an easy one is solved by both, a hard one by neither). The standard error of the
    difference of two independent means, sqrt(se_base^2 + se_trained^2), counts that shared variation
    twice; the differences' own spread leaves it out. It is usually much smaller, and it is the right
    one for "did training help on these questions?".

    The two must hold the same question ids: a question one model answered and the other did not has
    no difference, and dropping it would compare the pass@1 of other question sets than the ones each
    model reports. QuestionMismatch (a ValueError, with the counts and a few ids) when they differ.
    """
    if base.keys() != trained.keys():
        only_base, only_trained = sorted(base.keys() - trained.keys()), sorted(trained.keys() - base.keys())
        raise QuestionMismatch(f"paired lift needs the same questions on both sides: {len(only_base)} only in the "
                               f"base {only_base[:3]}, {len(only_trained)} only in the trained model {only_trained[:3]}")
    if not base:
        raise ValueError("paired lift needs at least one question")
    # summed in id order, so the same scores give the same float whatever order they were read in
    lift, stderr = mean_and_stderr([trained[q] - base[q] for q in sorted(base)])
    return Lift(lift, stderr, len(base))


def cluster_answers(answers: Sequence[str | None], equivalent: Equivalent) -> list[int | None]:
    """A cluster id per answer (None for no answer); ids count up in order of each cluster's first answer.

    Each answer joins the first cluster whose first answer it is equivalent to. Comparing with the
    first answer only keeps the result independent of later samples, so the clusters of the first k
    samples are a prefix of the clusters of all n: one pass serves every maj@k.
    """
    representatives: list[str] = []
    ids: list[int | None] = []
    for answer in answers:
        if answer is None:
            ids.append(None)
            continue
        for cid, rep in enumerate(representatives):
            if equivalent(answer, rep):
                ids.append(cid)
                break
        else:
            representatives.append(answer)
            ids.append(len(representatives) - 1)
    return ids


def majority_index(cluster_ids: Sequence[int | None], k: int) -> int | None:
    """The index of the majority answer among the first k samples: the first answer of the largest
    cluster, ties going to the cluster that appeared first; None when none of them has an answer."""
    counts: dict[int, int] = {}
    first: dict[int, int] = {}
    for i, cid in enumerate(cluster_ids[:k]):
        if cid is not None:
            counts[cid] = counts.get(cid, 0) + 1
            first.setdefault(cid, i)
    if not counts:
        return None
    # cluster ids are numbered in order of first appearance, so the smallest id wins a tie
    winner = min(counts, key=lambda cid: (-counts[cid], cid))
    return first[winner]


def maj_at_k(samples: Sequence[SampleResult], k: int, equivalent: Equivalent,
             cluster_ids: list[int | None] | None = None) -> bool:
    """Whether the majority answer of the first k samples is correct; ``cluster_ids`` (from
    ``cluster_answers``) saves clustering again when one question is voted at several k."""
    if cluster_ids is None:
        cluster_ids = cluster_answers([s.answer for s in samples], equivalent)
    index = majority_index(cluster_ids, k)
    return index is not None and samples[index].correct


def summarize(groups: Sequence[Sequence[SampleResult]], *, equivalent: Equivalent) -> dict[str, float]:
    """All metrics of one (model, benchmark) run; ``groups`` holds each question's n samples in order.

    Keys: ``num_questions``, ``n``, ``pass@1``, ``pass@1_stderr``, ``pass@k`` for k in k_values(n),
    ``maj@k`` for those k >= 2 (maj@1 is just the first sample's accuracy), ``answer_rate``,
    ``truncation_rate``, ``mean_length`` (tokens) and ``verify_timeouts`` (samples whose correctness check
    timed out: a score with timeouts is a lower bound): results only, so the same samples give the same
    bytes (the generation speed is a measured figure: grpo/eval/run.py logs it apart).
    """
    if not groups:
        raise ValueError("no questions to summarize")
    n = len(groups[0])
    if n == 0 or any(len(g) != n for g in groups):
        raise ValueError(f"every question needs the same number of samples (n={n}, >0)")
    samples = [s for g in groups for s in g]
    per_question = [sum(s.correct for s in g) / n for g in groups]
    pass1, stderr = mean_and_stderr(per_question)
    metrics: dict[str, float] = {"num_questions": len(groups), "n": n, "pass@1": pass1, "pass@1_stderr": stderr}
    correct_counts = [sum(s.correct for s in g) for g in groups]
    for k in k_values(n)[1:]:
        metrics[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct_counts) / len(groups)
    if n >= 2:
        ids = [cluster_answers([s.answer for s in g], equivalent) for g in groups]
        for k in k_values(n)[1:]:
            metrics[f"maj@{k}"] = sum(maj_at_k(g, k, equivalent, cids) for g, cids in zip(groups, ids)) / len(groups)
    total_tokens = sum(s.length for s in samples)
    metrics.update(
        answer_rate=sum(s.answer is not None for s in samples) / len(samples),
        truncation_rate=sum(s.finish_reason == "length" for s in samples) / len(samples),
        mean_length=total_tokens / len(samples),
        verify_timeouts=sum(s.timed_out for s in samples),
    )
    return metrics
