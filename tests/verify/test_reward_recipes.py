"""The shipped reward recipes (params.yaml and every preset) never make saying nothing the best policy:
an empty answer template, or one holding a template's placeholder ("<value>"), scores no more than any
real attempt that states a (wrong) answer within the response budget. Under the old format rewards the tagged recipe paid the empty template 1.5 and a
plain wrong attempt 0.5, and the default run learned to answer nothing (issue 19)."""
from __future__ import annotations

from pathlib import Path

import pytest

from grpo.config import SECTIONS, load_params
from grpo.preset import PRESETS
from grpo.verify.rewards import compute_rewards

ROOT = Path(__file__).resolve().parents[2]
RECIPES = [ROOT / "params.yaml", *sorted(PRESETS.glob("*.yaml"))]
ROW = {"question": "What is 6 times 7?", "answer": "42", "answer_type": "integer"}

EMPTY = {  # what a policy that has learned the layout but says nothing writes, in each style
    "tagged": ["<reasoning>\n\n</reasoning>\n<answer>\n\n</answer>", "<reasoning>\n\n</reasoning>\n<answer>\n\n</answer>\n",
               "<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>", "<reasoning>\n</reasoning>\n<answer>\n</answer>",
               # placeholders copied from a prompt's template (the arith-cpu run learned the first one)
               "<reasoning>\n...\n</reasoning>\n<answer>\n<value>\n</answer>\n",
               "<reasoning>\n...\n</reasoning>\n<answer>\n<final number>\n</answer>", "<reasoning>\n.\n</reasoning>\n<answer>\n[answer]\n</answer>",
               # ... and several of them (the next run learned these once a lone placeholder stopped paying)
               "<reasoning>\n...\n</reasoning>\n<answer>\n<total>\n<initial number>\n<remarks>\n</remarks>\n</answer>\n",
               "<reasoning>\n...\n</reasoning>\n<answer>\n<total>\n...\n</answer>"],
    "r1": ["<think>\n\n</think>\n\\boxed{}", "<think>\n\n</think>\n", "<think>\n...\n</think>\nThe answer is \\boxed{}.",
           "<think>\n...\n</think>\n\\boxed{<answer>}"],
}
ATTEMPTS = [  # wrong answers, stated in either layout or in none
    "<reasoning>\n6 times 7 is 41.\n</reasoning>\n<answer>\n41\n</answer>",
    "<think>\n6 times 7 is 41.\n</think>\nSo the answer is \\boxed{41}.",
    "6 times 7 is 41.",
    "<reasoning>\n6 times 7 is 41, so the answer is 41.",
]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_an_empty_template_never_outscores_a_real_attempt(recipe):
    params = load_params(recipe, list(SECTIONS))
    train, style = params["train"], params["prompt"].style
    budget = train.max_response_length

    def totals(completions: list[str]) -> list[float]:
        n = len(completions)
        return compute_rewards(completions, [ROW] * n, train.rewards, ["stop"] * n, [17] * n, budget).totals

    best_empty = max(totals(EMPTY["tagged"] + EMPTY["r1"]))
    attempts = totals(ATTEMPTS)
    assert best_empty <= min(attempts), (recipe.name, style, best_empty, attempts)
    assert totals(["<reasoning>\nso 42\n</reasoning>\n<answer>\n42\n</answer>"])[0] > max(attempts)
