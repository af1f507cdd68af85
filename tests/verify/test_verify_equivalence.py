"""Answer equivalence: the numeric fast path, math-verify through the worker, the none type, the timeout."""
from __future__ import annotations

import threading
import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo.verify.equivalence import answers_equivalent, is_equivalent, normalize_number, says_unanswerable
from grpo.verify.extract import extract_answer
from grpo.verify.rewards import compute_rewards

EQUIVALENT = [
    # (pred, gold, answer_type)
    ("1,234", "1234", "integer"),
    ("1234", "1,234", "integer"),
    ("1{,}234", "1234", "integer"),
    ("1\\,234", "1234", "integer"),
    ("$5", "5", "number"),
    ("\\$5.00", "5", "number"),
    ("50%", "50", "number"),
    ("50\\%", "50", "number"),
    ("50 percent", "50", "number"),
    ("50%", "0.5", "number"),
    ("0.5", "50\\%", "latex"),
    ("0.5", "\\frac{1}{2}", "latex"),
    ("\\frac12", "0.5", "number"),
    ("\\dfrac{3}{4}", "0.75", "number"),
    ("\\dfrac34", "0.75", "number"),
    ("\\tfrac{3}{4}", "3/4", "latex"),
    ("3/4", "0.75", "number"),
    ("-\\frac{3}{4}", "-0.75", "number"),
    ("\\frac{-3}{4}", "-0.75", "number"),
    ("-3", "−3", "integer"),
    ("−3", "-3", "integer"),
    ("+7", "7", "integer"),
    ("1e3", "1000", "integer"),
    ("1.5e-3", "0.0015", "number"),
    ("1.5\\times10^{3}", "1500", "number"),
    ("1.5 \\cdot 10^3", "1500", "number"),
    ("90^\\circ", "90", "number"),
    ("90^{\\circ}", "90", "number"),
    ("90°", "90", "number"),
    ("5 dollars", "5", "integer"),
    ("12 cm", "12", "number"),
    ("3 hours", "3", "integer"),
    ("12\\text{ cm}", "12", "number"),
    ("12\\text{cm}^2", "12", "number"),
    ("\\text{18}", "18", "integer"),
    ("5.0", "5", "integer"),
    ("5.", "5", "integer"),
    (".5", "0.5", "number"),
    ("0.3333333", "1/3", "number"),
    ("１２", "12", "integer"),
    ("١٢", "12", "integer"),
    ("\\left(3\\right)", "3", "integer"),
    ("\\!1,000", "1000", "integer"),
    ("\\sqrt{2}/2", "\\frac{\\sqrt2}{2}", "latex"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{\\sqrt2}{2}", "latex"),
    ("(0, 1]", "(0,1]", "latex"),
    ("\\left(0, 1\\right]", "(0,1]", "latex"),
    ("(1, 2)", "(1,2)", "latex"),
    ("\\{2,1\\}", "\\{1,2\\}", "latex"),
    ("\\pi", "\\pi", "latex"),
    ("\\frac{\\pi}{2}", "\\pi/2", "latex"),
    ("x=5", "5", "latex"),
    ("2^3", "8", "integer"),
    ("\\sqrt{4}", "2", "integer"),
    ("2\\sqrt{3}", "\\sqrt{12}", "latex"),
    # issue 14: spaced thousands, number words, decimal commas, upright e and i, unordered answer sets
    ("1 000", "1000", "integer"),
    ("12 345.5", "12345.5", "number"),
    ("1\u202f000", "1000", "integer"),  # a narrow no-break space
    ("three", "3", "integer"),
    ("Twenty-five", "25", "integer"),
    ("ninety nine", "99", "integer"),
    ("seven apples", "7", "integer"),
    ("\\text{zero}", "0", "integer"),
    ("2,74", "2.74", "number"),
    ("0.111", "0,111", "latex"),
    ("1000,99", "1000.99", "number"),
    ("\\mathrm{e}^2", "e^2", "latex"),
    ("\\exp(2)", "e^{2}", "latex"),
    ("1 - \\frac{1}{\\mathrm{e}}", "1-e^{-1}", "latex"),
    ("2\\mathrm{i}", "2i", "latex"),
    ("-2, 1", "1, -2", "latex"),
    ("(99, 503), (98, 2)", "(98, 2), (99, 503)", "latex"),
]

NOT_EQUIVALENT = [
    ("2", "3", "integer"),
    ("0.333", "1/3", "number"),
    ("0.33", "\\frac{1}{3}", "latex"),
    ("0.5", "50", "number"),  # only a written % allows the fraction reading
    ("5", "-5", "integer"),
    ("1234", "123", "integer"),
    ("1000001", "1000000", "integer"),  # integers never get the relative tolerance
    ("1000000.5", "1000000", "integer"),  # nor does anything under answer_type="integer"
    ("1,2", "12", "integer"),  # not a thousands separator
    ("3x", "3", "latex"),
    ("(0, 1)", "(0,1]", "latex"),
    ("(1, 2)", "(2,1)", "latex"),
    ("\\{1,2,3\\}", "\\{1,2\\}", "latex"),
    ("3.14", "\\pi", "latex"),
    ("\\sqrt{3}", "\\sqrt{2}", "latex"),
    ("", "5", "integer"),
    (None, "5", "integer"),
    ("the cat", "5", "integer"),
    ("1/0", "0", "number"),
    ("1 - \\frac{1}{\\mathrm{e}}", "1 + \\frac{1}{\\mathrm{e}}", "latex"),
    ("\\mathrm{e}^2", "2", "latex"),
    ("1 00", "100", "integer"),  # a space groups three digits, never two
    ("one of them", "1", "integer"),  # a number word is the whole answer, or one unit word after it
    ("twenty one apples each", "21", "integer"),
    ("5,2", "2.5", "number"),  # the decimal comma keeps its digits
    ("1,234", "1.234", "number"),  # a thousands separator, never a decimal comma
    ("2,5", "25", "integer"),
    ("1, 2", "1, 3", "latex"),
]


@pytest.mark.parametrize(("pred", "gold", "answer_type"), EQUIVALENT)
def test_equivalent(pred, gold, answer_type):
    assert is_equivalent(pred, gold, answer_type)


@pytest.mark.parametrize(("pred", "gold", "answer_type"), NOT_EQUIVALENT)
def test_not_equivalent(pred, gold, answer_type):
    assert not is_equivalent(pred, gold, answer_type)


@pytest.mark.parametrize(
    ("pred", "expected"),
    [
        ("None", True), ("none", True), ("\\text{None}", True), ("No answer", True),
        ("cannot be determined", True), ("It can't be determined", True), ("not enough information", True),
        ("Insufficient information", True), ("unanswerable", True),
        ("5", False), ("0", False), ("none of 3 options", False), ("42 apples", False), (None, False),
    ],
)
def test_none_answer_type(pred, expected):
    assert is_equivalent(pred, "None", "none") is expected


def test_says_unanswerable_wants_a_phrase():
    assert not says_unanswerable("nonetheless")
    assert says_unanswerable("The problem does not give enough information; cannot be determined")


def test_unknown_answer_type_is_rejected():
    with pytest.raises(ValueError, match="unknown answer_type 'float'"):
        is_equivalent("1", "1", "float")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("$1,234.50", Fraction(2469, 2)), ("50%", Fraction(50)), ("\\frac{3}{4}", Fraction(3, 4)),
        ("-2.5e2", Fraction(-250)), ("7 apples", Fraction(7)), ("−1", Fraction(-1)),
        ("x+1", None), ("1e100000", None), ("3/0", None), ("(1, 2)", None), ("1" * 5000, None),
    ],
)
def test_normalize_number(text, value):
    assert normalize_number(text) == value


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("1,000", "1000", True), ("0.5", "\\frac{1}{2}", True), ("\\frac{1}{2}", "0.5", True),
        ("50%", "0.5", True), ("x=3", "3", True), ("3", "x=3", True), ("\\{1,2\\}", "\\{2,1\\}", True),
        ("2,5", "5,2", True), ("2,74", "2.74", True), ("three", "3.0", True), ("1 000", "1,000", True),
        ("2", "3", False), (None, "3", False), (None, None, False),
    ],
)
def test_answers_equivalent(a, b, expected):
    assert answers_equivalent(a, b) is expected


PATHOLOGICAL = {
    "power": "10^{10^{10}}",  # one C-level big-integer operation: only a kill stops it
    "nested-frac": "\\frac{1}{" * 2000 + "2" + "}" * 2000,
}


def test_pathological_latex_times_out_off_the_main_thread():
    outcomes = {}

    def call() -> None:
        for n, (name, pred) in enumerate(PATHOLOGICAL.items(), start=2):
            # The worker (killed by the previous case) is started again before timing; a fresh pair, so
            # no cached result answers it.
            assert is_equivalent(f"\\sqrt{{{n * n}}}", str(n), "latex")
            start = time.perf_counter()
            result = is_equivalent(pred, "2", "latex", timeout_s=1.0)
            outcomes[name] = (result, time.perf_counter() - start)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(timeout=60)
    assert set(outcomes) == set(PATHOLOGICAL)
    for name, (result, seconds) in outcomes.items():
        assert result is False, name
        assert seconds < 1.5, (name, seconds)
    assert is_equivalent("\\sqrt{25}", "5", "latex")  # and a replacement worker serves the next call


# Rendered so that the text is a plain number: hypothesis decimals/fractions as strings.
numbers = st.one_of(
    st.integers(min_value=-10**12, max_value=10**12).map(str),
    st.decimals(min_value=-10**6, max_value=10**6, allow_nan=False, places=4).map(str),
    st.fractions(min_value=-1000, max_value=1000, max_denominator=1000).map(str),
)


@settings(max_examples=200, deadline=None)
@given(numbers)
def test_equivalence_is_reflexive(text):
    assert normalize_number(text) is not None
    assert is_equivalent(text, text, "number")
    assert answers_equivalent(text, text)


def _with_commas(n: int) -> str:
    return f"{n:,}"


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-10**9, max_value=10**9), st.data())
def test_formatting_variants_of_an_integer_are_equivalent(n, data):
    variants = [str(n), _with_commas(n), f"${_with_commas(n)}", f"{n}.0", f"\\text{{{n}}}", f"{n} dollars"]
    if n >= 0:
        variants += [f"+{n}", f"+{_with_commas(n)}"]
    pred = data.draw(st.sampled_from(variants))
    gold = data.draw(st.sampled_from(variants))
    assert is_equivalent(pred, gold, "integer")
    assert answers_equivalent(pred, gold)
    if n != 0:
        assert not is_equivalent(pred, str(n + 1), "integer")


def test_no_check_waits_for_a_replacement_worker_or_parses_a_megabyte():
    """The call after a timeout is served by a fresh fork of the warm server; a symmetric check (both
    directions) shares one timeout; an over-long answer is refused without parsing."""
    assert is_equivalent("\\sqrt{36}", "6", "latex")  # the fork server and a worker are up
    timings = {}
    for name, check in [
        ("timeout", lambda: is_equivalent("10^{10^{12}}", "3", "latex", timeout_s=1.0)),
        ("right after", lambda: is_equivalent("\\sqrt{49}", "7", "latex")),
        ("symmetric timeout", lambda: answers_equivalent("10^{10^{13}}", "2^{2^{50}}", timeout_s=1.0)),
        ("right after again", lambda: answers_equivalent("\\frac{\\pi}{4}", "\\pi/4")),
        ("megabyte", lambda: is_equivalent("\\frac{1}{2}+" * 100_000 + "1", "2", "latex")),
    ]:
        start = time.perf_counter()
        timings[name] = (check(), time.perf_counter() - start)
    assert [result for result, _ in timings.values()] == [False, True, False, True, False]
    assert all(seconds < 1.5 for _, seconds in timings.values()), timings
    assert timings["megabyte"][1] < 0.1, timings


MEGABYTE = 1_000_000


@pytest.mark.parametrize(("completion", "correct"), [
    ("<reasoning>\n" + "We add the numbers again. " * (MEGABYTE // 26) + "\n</reasoning>\n<answer>\n42\n</answer>", 1.0),
    ("<answer>" + "1" * MEGABYTE + "</answer>", 0.0),
    ("\\boxed{" + "\\frac{1}{2}+" * (MEGABYTE // 12) + "1}", 0.0),
    ("<answer>" + "x^{" * (MEGABYTE // 3) + "</answer>", 0.0),
], ids=["long-reasoning", "megabyte-number", "megabyte-box", "megabyte-open-powers"])
def test_one_megabyte_completion_is_scored_within_a_second(completion, correct):
    row = {"answer": "42", "answer_type": "integer"}
    start = time.perf_counter()
    scored = compute_rewards([completion], [row], {"correctness": 1.0}, ["stop"], [10], 16)
    assert time.perf_counter() - start < 1.0
    assert scored.per_fn["correctness"] == [correct] and scored.verify_timeouts == 0


DIGITS = {"ascii": "0", "arabic-indic": "\u0660", "extended-arabic-indic": "\u06f0", "devanagari": "\u0966",
          "bengali": "\u09e6", "thai": "\u0e50", "fullwidth": "\uff10"}
MINUSES = ["-", "\u2212", "\u2012", "\u2013", "\ufe63", "\uff0d"]


def _render(n: int, zero: str, minus: str) -> str:
    digits = "".join(chr(ord(zero) + int(d)) for d in str(abs(n)))
    return minus + digits if n < 0 else digits


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-10**9, max_value=10**9), st.sampled_from(sorted(DIGITS)), st.sampled_from(MINUSES))
def test_unicode_digits_and_minus_signs_are_the_same_integer(n, system, minus):
    text = _render(n, DIGITS[system], minus)
    assert normalize_number(text) == n
    assert is_equivalent(text, str(n), "integer") and is_equivalent(str(n), text, "integer")
    assert not is_equivalent(text, str(n + 1), "integer")
    assert extract_answer(f"So the result is {text}") == text  # the last-number fallback keeps the sign
    assert is_equivalent(extract_answer(f"The answer is {text}."), str(n), "integer")


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=50).filter(str.strip), st.sampled_from(["integer", "number", "latex"]))
def test_any_answer_is_equivalent_to_itself(text, answer_type):
    assert is_equivalent(text, text, answer_type)
    assert answers_equivalent(text, text)


def _number_forms(value: Fraction) -> list[str]:
    """Ways to write ``value``: fractions, a 12-significant-digit decimal, scientific, percent, money."""
    p, q = value.numerator, value.denominator
    sign, a = ("-" if p < 0 else ""), abs(p)
    x = float(value)
    return [f"{p}/{q}", f"{sign}\\frac{{{a}}}{{{q}}}", f"\\dfrac{{{p}}}{{{q}}}", f"{sign}\\tfrac{{{a}}}{{{q}}}",
            f"{x:.12g}", f"{x:.11e}", f"{x * 100:.12g}\\%", f"{x * 100:.12g}%", f"${x:.12g}$", f"\\text{{{x:.12g}}}"]


@settings(max_examples=200, deadline=None)
@given(st.fractions(min_value=-10**4, max_value=10**4, max_denominator=999), st.data())
def test_formatting_variants_of_one_value_are_equivalent(value, data):
    forms = _number_forms(value)
    pred, gold = data.draw(st.sampled_from(forms)), data.draw(st.sampled_from(forms))
    assert is_equivalent(pred, gold, "number"), (pred, gold)
    assert answers_equivalent(pred, gold), (pred, gold)
    other = value + (abs(value) + 1) / 1000  # far outside the relative tolerance of 1e-6
    assert not is_equivalent(pred, f"{other.numerator}/{other.denominator}", "number"), (pred, other)
