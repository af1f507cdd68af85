"""Semantic entropy of one question: cluster M sampled answers by verified equivalence, then
H = -sum_c p_c ln p_c over the clusters (Kuhn et al. 2023, with answer equivalence standing in for
bidirectional entailment, which is exact for math answers).

A question the model answers consistently has low entropy (easy for it, right or wrong); one whose
answers scatter has high entropy. Pure functions: no model, no files.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from grpo.verify import answers_equivalent, extract_answer, is_equivalent


@dataclass(frozen=True)
class Sample:
    """One sampled response as scoring sees it."""

    text: str  # the full response: prefill + generated text
    finish_reason: str  # "stop" or "length"
    num_tokens: int  # generated tokens (the prefill is prompt, not generated)


def cluster_answers(answers: Sequence[str | None], *, no_answer_cluster: bool) -> list[list[int]]:
    """Indices of ``answers`` grouped greedily: each answer joins the first cluster whose
    representative (its first member) is equivalent to it, else starts a new cluster.

    Unanswered samples (None) form one "no answer" cluster when ``no_answer_cluster``; otherwise each
    is its own singleton, so a model that never answers counts as maximally uncertain rather than
    perfectly consistent.
    """
    clusters: list[list[int]] = []
    unanswered: list[int] | None = None
    for i, answer in enumerate(answers):
        if answer is None:
            if not no_answer_cluster:
                clusters.append([i])
            elif unanswered is None:
                unanswered = [i]
                clusters.append(unanswered)
            else:
                unanswered.append(i)
            continue
        for cluster in clusters:
            if answers_equivalent(answers[cluster[0]], answer):  # None (the unanswered cluster) matches nothing
                cluster.append(i)
                break
        else:
            clusters.append([i])
    return clusters


def semantic_entropy(cluster_sizes: Sequence[int]) -> float:
    """H = -sum_c p_c ln p_c in nats, with p_c = size_c / total; 0 for a single cluster."""
    total = sum(cluster_sizes)
    if total <= 0 or any(size <= 0 for size in cluster_sizes):
        raise ValueError(f"cluster sizes must be positive, got {list(cluster_sizes)}")
    # 0.0 - sum, not -sum: a single cluster gives 0.0 rather than -0.0 in the scores file
    return 0.0 - sum((size / total) * math.log(size / total) for size in cluster_sizes)


def score_question(row: dict, samples: Sequence[Sample], *, no_answer_cluster: bool) -> dict:
    """The SENT record of one question (one line of data/sent/scores.jsonl).

    ``row`` is a prepared dataset row (id, answer, answer_type). Answers are extracted leniently:
    SmolLM2-class models rarely close the answer format, and SENT measures what the model believes
    the answer is, not whether it formats it.
    """
    if not samples:
        raise ValueError(f"question {row['id']!r}: no samples to score")
    answers = [extract_answer(s.text, mode="lenient", finish_reason=s.finish_reason) for s in samples]
    correct = [a is not None and is_equivalent(a, row["answer"], row["answer_type"]) for a in answers]
    clusters = cluster_answers(answers, no_answer_cluster=no_answer_cluster)
    n = len(samples)
    return {
        "id": row["id"],
        "entropy": semantic_entropy([len(c) for c in clusters]),
        "clusters": [
            {"answer": answers[c[0]], "count": len(c), "correct": correct[c[0]]} for c in clusters
        ],
        "pass_rate": sum(correct) / n,
        "n": n,
        "truncated": sum(s.finish_reason == "length" for s in samples) / n,
        "mean_length": sum(s.num_tokens for s in samples) / n,
    }
