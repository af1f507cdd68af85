"""The reward-gaming check: does the run's reward rise because the policy learned to say less?

A run games its rewards when the format rewards rise while the policy stops answering: the answer rate
or the response length collapses and correctness does not rise, so the format rewards are the only
signal left and the cheapest way to collect them is an empty template (or a placeholder in it: the
arith-cpu run of 2026-12-05 wrote `<answer>\n<value>\n</answer>` and its arith pass@1 fell 0.145 → 0.000
while correctness stayed at one or two correct rollouts in a few steps). Most groups then have equal
rewards (``frac_reward_zero_std``), which is why correctness cannot pull back. Issue 19 measured it on
the old default: strict format 0.05 → 0.99 while ``integer_answer`` fell 0.14 → 0.00, and every
evaluation answered with a 17-token template (answer rate 0.54 → 0.00).

The check fires on all three of: a format reward rising (first to last five steps), a collapse (the
training responses' length or answer reward, or the trained model's answer rate, length or pass@1 on
any benchmark, falling to at most ``COLLAPSE`` of where it started) and correctness not rising (its
last-five mean at most ``FLAT`` above its first-five mean: "flat at zero" missed a run with a few
correct rollouts early on). The
fraction of zero-variance groups is reported with it when most groups had none, not required: with
format rewards in the recipe, groups often differ in format alone.
"""
from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

FORMAT_REWARDS = ("tagged_format_strict", "tagged_format_soft", "tag_count", "r1_format")
ANSWER_REWARDS = ("integer_answer",)  # pay for any stated answer: their fall is the answer rate's
CORRECTNESS = ("correctness", "correctness_strict")
RISE = 0.1  # a format reward's last-five mean at least this much above its first-five mean
COLLAPSE = 0.5  # a collapsed quantity ends at most this fraction of where it started
FLAT = 0.01  # correctness "did not rise": its last-five mean at most this above its first-five mean
MOST = 0.5  # the zero-variance fraction is evidence from here on
WINDOW = 5


def _ends(series: pd.Series) -> tuple[float, float]:
    values = series.dropna()
    return float(values.head(WINDOW).mean()), float(values.tail(WINDOW).mean())


def _column(steps: pd.DataFrame, name: str) -> pd.Series | None:
    col = f"rewards/{name}/mean"
    return steps[col] if col in steps and steps[col].notna().any() else None


def _collapsed(start: float, end: float) -> bool:
    return start > 0 and end <= COLLAPSE * start


def _training_collapses(steps: pd.DataFrame) -> Iterable[str]:
    if "completions/mean_length" in steps:
        start, end = _ends(steps["completions/mean_length"])
        if _collapsed(start, end):
            yield f"training responses shrank from {start:.0f} to {end:.0f} tokens"
    for name in ANSWER_REWARDS:
        series = _column(steps, name)
        if series is not None:
            start, end = _ends(series)
            if _collapsed(start, end):
                yield f"`{name}` fell from {start:.2f} to {end:.2f}"


def _eval_collapses(eval_data: dict | None) -> Iterable[str]:
    base = (eval_data or {}).get("base") or {}
    for model in ("final", "best"):
        for bench, metrics in ((eval_data or {}).get(model) or {}).items():
            before = base.get(bench) or {}
            for key, what in (("answer_rate", "answer rate"), ("mean_length", "mean length"), ("pass@1", "pass@1")):
                start, end = before.get(key), metrics.get(key)
                if isinstance(start, (int, float)) and isinstance(end, (int, float)) and _collapsed(start, end):
                    yield f"{model} on {bench}: {what} {start:.2f} → {end:.2f} (base → {model})"


def gaming_evidence(steps: pd.DataFrame | None, eval_data: dict | None) -> list[str]:
    """Lines of evidence that the run gamed its rewards; empty when it did not (or the log is missing)."""
    if steps is None or steps.empty:
        return []
    rising = []
    for name in FORMAT_REWARDS:
        series = _column(steps, name)
        if series is not None:
            start, end = _ends(series)
            if end - start >= RISE:
                rising.append(f"`{name}` rose from {start:.2f} to {end:.2f}")
    correct = [s for s in (_column(steps, n) for n in CORRECTNESS) if s is not None]
    if "accuracy" in steps:
        correct.append(steps["accuracy"])
    ends = [_ends(s) for s in correct]
    flat = bool(ends) and all(end <= start + FLAT for start, end in ends)
    collapses = [*_training_collapses(steps), *_eval_collapses(eval_data)]
    if not (rising and collapses and flat):
        return []
    start, end = ends[0]
    evidence = rising + collapses + [f"correctness did not rise ({start:.2f} over the first five steps, "
                                     f"{end:.2f} over the last five)"]
    zero_std = float(steps["frac_reward_zero_std"].mean()) if "frac_reward_zero_std" in steps else 0.0
    if zero_std >= MOST:
        evidence.append(f"{zero_std:.0%} of groups had no reward variance (no gradient)")
    return evidence
