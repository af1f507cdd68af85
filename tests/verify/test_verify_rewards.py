"""Reward functions with hand-computed values, and their weighted combination."""
from __future__ import annotations

import pytest

from grpo.verify.rewards import (
    REWARD_FUNCTIONS,
    RewardResult,
    compute_rewards,
    correctness,
    correctness_strict,
    integer_answer,
    length_penalty,
    overlong_penalty,
    r1_format,
    tag_count,
    tagged_format_soft,
    tagged_format_strict,
)

ROW = {"id": "gsm8k-1", "source": "gsm8k", "question": "6 * 7?", "answer": "42", "answer_type": "integer"}
NONE_ROW = {**ROW, "answer": "None", "answer_type": "none"}
PERFECT = "<reasoning>\n6 times 7 is 42.\nDone.\n</reasoning>\n<answer>\n42\n</answer>\n"


@pytest.mark.parametrize(
    ("completion", "finish_reason", "row", "value", "reason"),
    [
        (PERFECT, "stop", ROW, 1.0, "gold 42, got 42"),
        ("<reasoning>\nso 41\n</reasoning>\n<answer>\n41\n</answer>", "stop", ROW, 0.0, "gold 42, got 41"),
        ("6*7 = 42", "stop", ROW, 1.0, "gold 42, got 42"),  # lenient: last number
        ("6*7 = 42 and", "length", ROW, 0.0, "truncated, no answer"),
        ("nothing", "stop", ROW, 0.0, "no answer"),
        ("<think>\nhmm\n</think>\n\\boxed{42.0}", "stop", ROW, 1.0, "gold 42, got 42.0"),
        ("The answer is \\$42 dollars.", "stop", ROW, 1.0, "gold 42, got \\$42 dollars"),
        ("<answer>cannot be determined</answer>", "stop", NONE_ROW, 1.0, "gold None, got cannot be determined"),
        ("<answer>12</answer>", "stop", NONE_ROW, 0.0, "gold None, got 12"),
    ],
)
def test_correctness(completion, finish_reason, row, value, reason):
    assert correctness(completion, row, finish_reason=finish_reason) == RewardResult(value, reason)


def test_correctness_strict_wants_a_box_or_a_tag():
    assert correctness_strict("6*7 = 42", ROW).value == 0.0
    assert correctness_strict("The answer is 42.", ROW).value == 0.0
    assert correctness_strict("\\boxed{42}", ROW).value == 1.0
    assert correctness_strict(PERFECT, ROW).value == 1.0


@pytest.mark.parametrize(
    ("completion", "value"),
    [
        ("<think>\nhmm\n</think>\nSo \\boxed{3}.", 1.0),
        ("  <think>\nhmm</think>\\boxed{\\frac{1}{2}}", 1.0),
        ("hmm\n</think>\n\\boxed{3}", 0.0),  # no <think>
        ("<think>\n\\boxed{3}\n</think>\nSo 3.", 0.0),  # the box is inside the thinking
        ("<think>\nhmm\n</think>\n\\boxed{3", 0.0),  # unclosed box
        ("<think>\nhmm \\boxed{3}", 0.0),  # never closed the thinking
    ],
)
def test_r1_format(completion, value):
    assert r1_format(completion, ROW).value == value


@pytest.mark.parametrize(
    ("completion", "value"),
    [
        (PERFECT, 1.0),
        (PERFECT.rstrip("\n"), 1.0),
        (PERFECT + "\n", 0.0),
        (PERFECT + "extra", 0.0),
        ("<reasoning>\nx</reasoning>\n<answer>\n42\n</answer>", 0.0),  # no newline before </reasoning>
        ("<reasoning>\nx\n</reasoning>\n<answer>42</answer>", 0.0),
        ("Sure!\n" + PERFECT, 0.0),
    ],
)
def test_tagged_format_strict(completion, value):
    assert tagged_format_strict(completion, ROW).value == value


EMPTY_TEMPLATES = ["<reasoning>\n\n</reasoning>\n<answer>\n\n</answer>", "<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n",
                   "<think>\n\n</think>\n\\boxed{}"]


@pytest.mark.parametrize("fn", [tagged_format_strict, tagged_format_soft, tag_count, r1_format])
@pytest.mark.parametrize("template", EMPTY_TEMPLATES)
def test_format_rewards_do_not_pay_an_empty_template(fn, template):
    result = fn(template, ROW, finish_reason="stop")
    assert result.value == 0.0, result


@pytest.mark.parametrize(
    ("completion", "value"),
    [
        (PERFECT, 1.0),
        ("<reasoning>x</reasoning> <answer>42</answer> trailing", 1.0),
        ("Sure! <reasoning>x</reasoning><answer>42</answer>", 1.0),
        ("<reasoning>x</reasoning> so <answer>42</answer>", 0.0),
        ("<reasoning>x</reasoning>\n<answer>42", 0.0),
        ("<answer>42</answer>", 0.0),
    ],
)
def test_tagged_format_soft(completion, value):
    assert tagged_format_soft(completion, ROW).value == value


@pytest.mark.parametrize(
    ("completion", "finish_reason", "value"),
    [
        (PERFECT, "stop", 1.0),
        ("<answer>\n-3\n</answer>", "stop", 1.0),
        ("<answer>\n1,234\n</answer>", "stop", 1.0),
        ("<answer>\n3.5\n</answer>", "stop", 0.0),
        ("<answer>\n5.0\n</answer>", "stop", 0.0),
        ("<answer>\n10/2\n</answer>", "stop", 0.0),
        ("<answer>\nx + 1\n</answer>", "stop", 0.0),
        ("it is 7", "stop", 1.0),
        ("it is 7 and", "length", 0.0),
    ],
)
def test_integer_answer(completion, finish_reason, value):
    assert integer_answer(completion, ROW, finish_reason=finish_reason).value == value


@pytest.mark.parametrize(
    ("completion", "value"),
    [
        (PERFECT, 0.5),
        (PERFECT.rstrip("\n"), 0.5),
        (PERFECT + "abc", 0.5 - 0.003),  # the first newline after </answer> is free
        (PERFECT.rstrip("\n") + "abc", 0.5 - 0.003),
        ("<reasoning>\nx\n<answer>\n42\n</answer>", 0.375),  # no "\n</reasoning>\n"
        ("<reasoning>\nx\n</reasoning>\n<answer>\n1\n</answer>\n<answer>\n2\n</answer>", 0.25),
        ("<reasoning>\nstill thinking", 0.0),  # tags pay only once an answer is stated
        ("<reasoning>\n\n</reasoning>\n<answer>\n\n</answer>", 0.0),  # the empty template
        ("<reasoning>\n\n</reasoning>\n<answer>\n\n</answer>abc", -0.003),  # the trailing charge still applies
        ("", 0.0),
    ],
)
def test_tag_count(completion, value):
    assert tag_count(completion, ROW).value == pytest.approx(value)


@pytest.mark.parametrize(("num_tokens", "value"), [(0, 0.0), (80, 0.0), (90, -0.5), (95, -0.75), (100, -1.0),
                                                   (130, -1.0)])
def test_overlong_penalty(num_tokens, value):
    assert overlong_penalty("x", ROW, num_tokens=num_tokens, max_tokens=100).value == pytest.approx(value)


@pytest.mark.parametrize(("num_tokens", "value"), [(0, 0.0), (25, -0.25), (100, -1.0)])
def test_length_penalty(num_tokens, value):
    assert length_penalty("x", ROW, num_tokens=num_tokens, max_tokens=100).value == pytest.approx(value)


@pytest.mark.parametrize("fn", [length_penalty, overlong_penalty])
def test_length_rewards_need_max_tokens(fn):
    with pytest.raises(ValueError, match="max_tokens > 0"):
        fn("x", ROW, num_tokens=5, max_tokens=0)


def test_registry_names_match_functions():
    assert set(REWARD_FUNCTIONS) == {
        "correctness", "correctness_strict", "r1_format", "tagged_format_strict", "tagged_format_soft",
        "integer_answer", "tag_count", "length_penalty", "overlong_penalty",
    }
    for name, fn in REWARD_FUNCTIONS.items():
        result = fn(PERFECT, ROW, finish_reason="stop", num_tokens=10, max_tokens=100)
        assert isinstance(result, RewardResult) and isinstance(result.value, float), name
        assert result.reason and len(result.reason) < 80, name


RECIPE_WEIGHTS = {"correctness": 2.0, "integer_answer": 0.5, "tagged_format_strict": 0.5,
                  "tagged_format_soft": 0.5, "tag_count": 1.0}


def test_compute_rewards_reproduces_the_recipe_scale():
    wrong = "<reasoning>\nguess\n</reasoning>\n<answer>\n41\n</answer>\nxyz"
    truncated = "<reasoning>\n6 times 7 is"
    totals, per_fn, reasons, timeouts = compute_rewards([PERFECT, wrong, truncated], [ROW, ROW, ROW],
                                                        RECIPE_WEIGHTS, ["stop", "stop", "length"], [20, 20, 100], 100)
    # PERFECT: 2.0 + 0.5 + 0.5 + 0.5 + 0.5 = 4.0 (the recipe's maximum).
    # wrong: 0 + 0.5 (41 is an integer) + 0 (trailing text) + 0.5 + (0.5 - 0.003) = 1.497.
    # truncated: no answer stated, so its one tag is not paid: 0.
    assert totals == pytest.approx([4.0, 1.497, 0.0])
    assert per_fn["correctness"] == [1.0, 0.0, 0.0]
    assert per_fn["tagged_format_strict"] == [1.0, 0.0, 0.0]
    assert list(per_fn) == list(RECIPE_WEIGHTS)
    assert reasons[1]["correctness"] == "gold 42, got 41"
    assert reasons[2]["correctness"] == "truncated, no answer"
    assert timeouts == 0


def test_compute_rewards_weights_scale_and_zero_weights_still_report():
    totals, per_fn, _, _ = compute_rewards(["\\boxed{42}"], [ROW], {"correctness": 3.0, "length_penalty": 0.0},
                                           ["stop"], [50], 100)
    assert totals == [3.0]
    assert per_fn == {"correctness": [1.0], "length_penalty": [-0.5]}


def test_compute_rewards_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown reward function.*formatt.*allowed: correctness"):
        compute_rewards(["x"], [ROW], {"correctness": 1.0, "formatt": 1.0}, ["stop"], [1], 10)


def test_compute_rewards_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="differ in length"):
        compute_rewards(["x", "y"], [ROW], {"correctness": 1.0}, ["stop"], [1], 10)


@pytest.mark.parametrize("answer, states", [
    ("<value>", False), ("<total>\n<initial number>\n<remarks>\n</remarks>", False), ("<total>\n...", False),
    ("[answer]", False),
    # real answers that hold angle brackets, square brackets or a tag next to content still count
    ("42", True), ("x < 5", True), ("[2, 3]", True), ("<total> 17", True), ("all real numbers", True),
])
def test_format_rewards_do_not_pay_template_placeholders(answer, states):
    completion = f"<reasoning>\nadd them\n</reasoning>\n<answer>\n{answer}\n</answer>"
    paid = tagged_format_strict(completion, {"answer": "17"}).value
    assert paid == (1.0 if states else 0.0), (answer, paid)
