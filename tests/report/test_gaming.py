"""The reward-gaming check: it fires on a run like issue 19's old default (format rewards up, answers and
length collapsing, correctness zero, most groups without variance) and stays silent on a learning run."""
from __future__ import annotations

import pandas as pd

from grpo.config import SECTIONS, parse_section
from grpo.report import ReportInputs
from grpo.report.gaming import gaming_evidence
from grpo.report.markdown import report_blocks
from grpo.report.render import to_markdown

STEPS = 16


def ramp(first: float, last: float) -> list[float]:
    return [first + (last - first) * i / (STEPS - 1) for i in range(STEPS)]


def run(correctness: list[float], length: list[float], integer: list[float]) -> pd.DataFrame:
    return pd.DataFrame({
        "step": range(1, STEPS + 1),
        "rewards/correctness/mean": correctness,
        "rewards/integer_answer/mean": integer,
        "rewards/tagged_format_strict/mean": ramp(0.05, 0.99),  # the issue's figures
        "rewards/tagged_format_soft/mean": ramp(0.10, 1.0),
        "rewards/tag_count/mean": ramp(0.2, 0.5),
        "accuracy": correctness,
        "completions/mean_length": length,
        "frac_reward_zero_std": [0.5] * 4 + [1.0] * 12,
    })


GAMED = run([0.0] * STEPS, ramp(120, 17), ramp(0.14, 0.0))
GAMED_EVAL = {"base": {"gsm8k": {"pass@1": 0.0, "answer_rate": 0.54, "mean_length": 120.0}},
              "final": {"gsm8k": {"pass@1": 0.0, "answer_rate": 0.0, "mean_length": 17.0}}}
LEARNING = run(ramp(0.1, 0.5), ramp(60, 40), ramp(0.6, 0.95))
LEARNING_EVAL = {"base": {"arith": {"pass@1": 0.2, "answer_rate": 0.7, "mean_length": 50.0}},
                 "final": {"arith": {"pass@1": 0.45, "answer_rate": 0.98, "mean_length": 42.0}}}


def test_fires_on_the_issue_run():
    evidence = gaming_evidence(GAMED, GAMED_EVAL)
    assert "`tagged_format_strict` rose from 0.18 to 0.86" in evidence
    assert "`integer_answer` fell from 0.12 to 0.02" in evidence
    assert "final on gsm8k: answer rate 0.54 → 0.00 (base → final)" in evidence
    assert "correctness did not rise (0.00 over the first five steps, 0.00 over the last five)" in evidence
    assert evidence[-1] == "88% of groups had no reward variance (no gradient)"


def test_fires_on_the_evaluation_collapse_alone():
    flat_training = run([0.0] * STEPS, [60.0] * STEPS, [0.5] * STEPS).assign(frac_reward_zero_std=0.0)
    assert gaming_evidence(flat_training, None) == []
    evidence = gaming_evidence(flat_training, GAMED_EVAL)
    assert "final on gsm8k: answer rate 0.54 → 0.00 (base → final)" in evidence
    assert evidence[-1].startswith("correctness did not rise")  # few zero-variance groups: not evidence


def test_fires_on_a_placeholder_run_with_a_few_early_correct_rollouts():
    """The arith-cpu run of 2026-12-05 (its training log's figures, 12 steps): a few correct rollouts in
    the middle, none at the end, every format reward up, `<answer>\n<value>\n</answer>` at the end, and
    the final model's arith pass@1 0.145 -> 0.000: correctness never at zero throughout, yet no rise."""
    n = 12
    steps = pd.DataFrame({
        "step": range(1, n + 1),
        "rewards/correctness/mean": [0, 0, 0, 0, 0.062, 0.062, 0.062, 0, 0, 0, 0, 0],
        "rewards/integer_answer/mean": [0, 0, 0.062, 0.062, 0.25, 0.25, 0.125, 0.062, 0, 0, 0.062, 0],
        "rewards/tagged_format_strict/mean": [0, 0, 0, 0, 0.062, 0.188, 0.125, 0.188, 0.5, 0.75, 0.875, 0.688],
        "completions/mean_length": [60.0] * n,
    })
    eval_data = {"base": {"arith": {"pass@1": 0.145, "answer_rate": 0.4, "mean_length": 58.0}},
                 "final": {"arith": {"pass@1": 0.0, "answer_rate": 0.9, "mean_length": 20.0}}}
    evidence = gaming_evidence(steps, eval_data)
    assert "`integer_answer` fell from 0.07 to 0.02" in evidence
    assert "final on arith: pass@1 0.14 → 0.00 (base → final)" in evidence
    assert evidence[-1] == "correctness did not rise (0.01 over the first five steps, 0.00 over the last five)"


def test_silent_on_a_learning_run():
    assert gaming_evidence(LEARNING, LEARNING_EVAL) == []
    # shorter answers and rising format are fine while correctness moves
    assert gaming_evidence(run(ramp(0.0, 0.2), ramp(120, 17), ramp(0.14, 0.0)), GAMED_EVAL) == []


def test_silent_without_a_training_log():
    assert gaming_evidence(None, GAMED_EVAL) == []


def test_the_report_carries_the_warning():
    params = {name: parse_section(name, None) for name in SECTIONS}

    def report(steps: pd.DataFrame, eval_data: dict) -> str:
        train = {"frac_reward_zero_std_by_stage": {"0": 0.25, "1": 0.875}}
        inp = ReportInputs(params=params, changes=[], model_info=None, prepare=None, datasets={}, sent=None,
                           sent_scores=None, steps=steps, validation=None, train=train, selection=None,
                           eval=eval_data)
        return to_markdown(report_blocks(inp, {}))

    def summary(steps: pd.DataFrame, eval_data: dict) -> str:
        return report(steps, eval_data).split("## Evaluation")[0]

    assert "| 1 | 0.250 |\n| 2 | 0.875 |" in report(LEARNING, LEARNING_EVAL)  # per curriculum stage, 1-based

    gamed = summary(GAMED, GAMED_EVAL)
    assert "**Warning: this run games its rewards.**" in gamed and "- `integer_answer` fell" in gamed
    assert "games its rewards" not in summary(LEARNING, LEARNING_EVAL)
