"""Is a predicted answer equivalent to the gold one?

Two paths, cheapest first:

1. Numeric (no sympy). Both sides are read as exact rationals (``normalize_number``) after NFKC
   normalisation (Unicode digits, fullwidth forms) and stripping of presentation: ``$``/``\\$``,
   thousands separators (``1,234``, ``1{,}234``, ``1\\,234``, and a space: ``1 000``, ``12 345.5``; the
   groups must all have three digits), ``\\text{}``/``\\mathrm{}`` wrappers, ``\\! \\, \\; \\left \\right``,
   degrees (``90^\\circ``, ``90°``), a leading ``+``, Unicode minus, and unit words after a space
   (``5 dollars``, ``12 cm``, ``3 hours``). Accepted number forms: integers, decimals, ``3/4``,
   ``\\frac{3}{4}``/``\\dfrac34``/``\\frac12``, ``1e3``, ``1.5\\times10^{3}`` and number words from zero to
   ninety-nine (``three``, ``Twenty``, ``forty-two``, ``seven apples``: the whole answer, with at most one
   unit word, so that "one of them" stays prose). Why accept them: GSM8K answers are integers that small
   models sometimes spell out ("The answer is three."); as a whole answer a number word is unambiguous,
   and math-verify would read "three" as the product t·h·r·e·e. Extraction never picks one out of prose
   (in "the three of them paid 12", the answer is 12).
   Two integers must be equal; otherwise values within a relative 1e-6 match (0.333 is not 1/3, but
   0.3333333 is). Under ``answer_type="integer"`` equality is always exact.
   Percent rule: ``%`` is a unit, so 50% ≡ 50. When exactly one side carries ``%``, its fraction reading
   is accepted too, so 50% ≡ 0.5; two plain numbers 0.5 and 50 stay different.
   Decimal-comma rule: ``2,74`` is no number (a comma separates list items in MATH answers), but it is
   accepted as 2.74 when the other side is exactly that decimal written with a point (``2.74``), as
   math-verify does. The rule only ever accepts (``2,5`` against ``5,2`` still goes to the LaTeX path
   and compares as sets); it errs only on a list whose digits spell the other side's decimal.
2. LaTeX, when either side is not a plain number: math-verify (``parse`` then ``verify(gold, pred)``,
   gold first as it requires), in worker processes under a hard time limit (``latex_pool.py`` says
   how). It covers intervals, tuples, sets (unordered, as MATH's solution sets), roots, pi, equations
   like ``x=5``. ``\\mathrm{e}`` and ``\\mathrm{i}`` are rewritten to ``e`` and ``i`` first (math-verify
   reads ``e`` as Euler's number, ``\\exp(x)`` as e^x, but loses an upright ``\\mathrm{e}`` entirely). A
   symmetric check (``answers_equivalent``) tries both directions inside one call, under one limit.
   An answer longer than ``_MAX_LATEX_LEN`` characters is not equivalent without being parsed: no
   final answer is that long (MATH-500's longest gold answer has 53), and a megabyte of "answer"
   would only burn the time limit. Verdicts are cached because semantic-entropy clustering compares
   the same pairs often.

Timeouts: ``timeout_s`` bounds a whole call (waiting for the worker included); after
``RETRY_AFTER`` of it the pair is retried on a fresh warm worker. A call that still gets no answer
is ``Verdict.TIMEOUT``: logged with the pair, never cached (the same pair asked again is compared
again), and counted by the rewards and the evaluation (``verify_timeouts``). ``is_equivalent`` and
``answers_equivalent`` read a timeout as "not shown equivalent"; ``judge`` tells the three apart.

``answer_type="none"`` (GSM-Plus "critical thinking" rows whose question lacks information): the
prediction is right iff it says the problem cannot be answered (``says_unanswerable``); any number is
wrong.
"""
from __future__ import annotations

import atexit
import enum
import functools
import logging
import os
import re
import unicodedata
from fractions import Fraction

from grpo.verify.latex_pool import LatexPool

ANSWER_TYPES = ("integer", "number", "latex", "none")
REL_TOL = 1e-6
DEFAULT_TIMEOUT_S = 2.0  # one MATH-style pair (two sums) takes 0.8-1.2 s on every run (bench/RESULTS.md)
RETRY_AFTER = 1 / 3  # of the time limit: the first attempt's share; the retry gets the rest
_MAX_NUMERIC_LEN = 200  # a number with its unit is short; longer text goes straight to the LaTeX path
_MAX_EXPONENT = 400  # 1e999999999 would build a gigantic integer; such inputs go to the LaTeX path
_MAX_LATEX_LEN = 2000

_LOG = logging.getLogger(__name__)
_MINUSES = dict.fromkeys(map(ord, "\u2212\u2012\u2013\ufe63"), "-")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\[!,;: ]|\\left\b|\\right\b|~")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree\b|\\circ\b")
_PERCENT = re.compile(r"\s*(?:\\%|%|\bper\s*cent\b)$", re.I)
_UNIT_TAIL = re.compile(r"\s+[a-z]+(?:[ ./]+[a-z]+)*(?:\^\{?[23]\}?)?$", re.I)
_THOUSANDS = re.compile(r"^[+-]?[1-9]\d{0,2}([, ])\d{3}(?:\1\d{3})*(?:\.\d+)?$")  # one separator throughout
_DECIMAL = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?(\d+))?$", re.I)
_DECIMAL_COMMA = re.compile(r"^([+-]?\d+),(\d+)$")
_POINT_DECIMAL = re.compile(r"^[+-]?\d*\.\d+$")
_TIMES_TEN = re.compile(r"^(.+?)\s*(?:\\times|\\cdot|×|\*)\s*10\s*\^\s*\{?\s*([+-]?\d+)\s*\}?$")
_FRAC_ARG = r"(?:\{\s*([+-]?[\d.]+)\s*\}|(\d))"
_LATEX_FRAC = re.compile(rf"^([+-]?)\\[dt]?frac\s*{_FRAC_ARG}\s*{_FRAC_ARG}$")
_SLASH_FRAC = re.compile(r"^([+-]?[\d.]+)\s*/\s*([+-]?[\d.]+)$")
_UPRIGHT_CONSTANT = re.compile(r"\\mathrm\s*\{\s*([ei])\s*\}")

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_NUMBER_WORDS = re.compile(
    rf"^(?:(?P<tens>{'|'.join(_TENS)})(?:[- ](?P<unit>{'|'.join(_ONES[1:10])}))?|(?P<ones>{'|'.join(_ONES)}))"
    r"(?P<rest>\s+[a-z]+)?$", re.I)

_UNANSWERABLE = re.compile(
    r"\b(?:none|no answer|no solution|unanswerable|undetermined|indeterminate|unknown|"
    r"can ?not be (?:determined|answered|calculated|found|known)|can'?t be (?:determined|answered|calculated)|"
    r"not (?:enough|sufficient) info(?:rmation)?|insufficient info(?:rmation)?|missing info(?:rmation)?|"
    r"not (?:possible|able) to (?:determine|answer|calculate))\b",
    re.I,
)


class Verdict(enum.Enum):
    EQUIVALENT = "equivalent"
    DIFFERENT = "different"
    TIMEOUT = "timeout"  # the LaTeX comparison did not finish within the time limit


def _ascii_digits(s: str) -> str:
    """NFKC plus every Unicode decimal digit (Arabic-Indic, Devanagari, ...) mapped to 0-9."""
    s = unicodedata.normalize("NFKC", s).translate(_MINUSES)
    return "".join(str(unicodedata.decimal(c)) if c.isdecimal() and not c.isascii() else c for c in s)


def _strip_presentation(s: str) -> str:
    s = _ascii_digits(s).replace("\\$", "").replace("{,}", ",")
    s = _TEXT_WRAPPER.sub(r" \1", s)  # the space lets "12\text{cm}" read as the unit word "12 cm"
    s = _DEGREES.sub("", _SPACING.sub("", s))
    s = s.strip().strip("$").strip().rstrip(".").strip()
    return s[1:-1].strip() if s.startswith("(") and s.endswith(")") else s  # "(3)"; a tuple stays no number


def _words_to_digits(s: str) -> str:
    """``forty-two apples`` → ``42 apples``; anything else unchanged."""
    match = _NUMBER_WORDS.match(s)
    if match is None:
        return s
    if match["ones"]:
        value = _ONES.index(match["ones"].lower())
    else:
        value = 10 * (_TENS.index(match["tens"].lower()) + 2)
        value += _ONES.index(match["unit"].lower()) if match["unit"] else 0
    return f"{value}{match['rest'] or ''}"


def _plain_number(s: str) -> Fraction | None:
    if thousands := _THOUSANDS.match(s):
        s = s.replace(thousands.group(1), "")
    decimal = _DECIMAL.match(s)
    if decimal is None or (decimal.group(1) and int(decimal.group(1)) > _MAX_EXPONENT):
        return None
    try:
        return Fraction(s)
    except ValueError:  # e.g. more digits than int() accepts from a string
        return None


def _ratio(numerator: str, denominator: str) -> Fraction | None:
    top, bottom = _plain_number(numerator), _plain_number(denominator)
    if top is None or bottom is None or bottom == 0:
        return None
    return top / bottom


def _number_value(s: str) -> Fraction | None:
    if (value := _plain_number(s)) is not None:
        return value
    if match := _LATEX_FRAC.match(s):
        sign, top_braced, top_digit, bottom_braced, bottom_digit = match.groups()
        value = _ratio(top_braced or top_digit, bottom_braced or bottom_digit)
        return None if value is None else (-value if sign == "-" else value)
    if match := _SLASH_FRAC.match(s):
        return _ratio(*match.groups())
    if match := _TIMES_TEN.match(s):
        mantissa, exponent = _number_value(match.group(1).strip()), int(match.group(2))
        if mantissa is None or abs(exponent) > _MAX_EXPONENT:
            return None
        return mantissa * Fraction(10) ** exponent
    return None


def _parse_numeric(s: str) -> tuple[Fraction, bool] | None:
    """(value, written as a percent) for a plain number with presentation around it, else None."""
    if len(s) > _MAX_NUMERIC_LEN:
        return None
    s = _words_to_digits(_strip_presentation(s))
    percent = _PERCENT.search(s)
    if percent:
        s = s[: percent.start()].strip()
    else:
        s = _UNIT_TAIL.sub("", s)
    value = _number_value(s)
    return None if value is None else (value, percent is not None)


def normalize_number(s: str) -> Fraction | None:
    """The exact value of ``s`` if it is a plain number (``"$1,234.50"`` → 2469/2, ``"50%"`` → 50)."""
    parsed = _parse_numeric(s)
    return None if parsed is None else parsed[0]


def _close(a: Fraction, b: Fraction, exact: bool) -> bool:
    if a == b:
        return True
    if exact or (a.denominator == 1 and b.denominator == 1):
        return False
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b))


def _numbers_match(a: tuple[Fraction, bool], b: tuple[Fraction, bool], exact: bool) -> bool:
    (a_value, a_percent), (b_value, b_percent) = a, b
    if _close(a_value, b_value, exact):
        return True
    if a_percent != b_percent:
        a_value, b_value = (a_value / 100, b_value) if a_percent else (a_value, b_value / 100)
        return _close(a_value, b_value, exact)
    return False


def _decimal_comma_match(a: str, b: str) -> bool:
    """The decimal-comma rule: ``2,74`` against ``2.74`` (either way round)."""
    if len(a) > _MAX_NUMERIC_LEN or len(b) > _MAX_NUMERIC_LEN:
        return False
    a, b = _strip_presentation(a), _strip_presentation(b)
    for comma, point in ((a, b), (b, a)):
        match = _DECIMAL_COMMA.match(comma)
        if match and not _THOUSANDS.match(comma) and _POINT_DECIMAL.match(point):
            return Fraction(f"{match[1]}.{match[2]}") == Fraction(point)
    return False


def says_unanswerable(answer: str) -> bool:
    """True for answers like "None", "cannot be determined", "not enough information" (no digits)."""
    text = _TEXT_WRAPPER.sub(r" \1", _ascii_digits(answer))
    return not any(c.isdigit() for c in text) and _UNANSWERABLE.search(text) is not None


_POOL = LatexPool()
atexit.register(_POOL.stop)
os.register_at_fork(after_in_child=_POOL.forget_after_fork)


class _Undecided(Exception):
    """The worker pool gave no answer within the limit. Raised, not returned, so that ``lru_cache``
    (which stores only returned values) never keeps a timeout as a verdict."""


@functools.lru_cache(maxsize=65536)
def _latex_equal(gold: str, pred: str, timeout_s: float, symmetric: bool = False) -> bool:
    result = _POOL.compare(gold, pred, symmetric, timeout_s=timeout_s, retry_after_s=timeout_s * RETRY_AFTER)
    if result is None:
        raise _Undecided
    return result


def _latex_form(s: str) -> str:
    return _UPRIGHT_CONSTANT.sub(r"\1", s.replace("\\$", "")).strip().strip("$").strip()


def _latex_verdict(gold: str, pred: str, timeout_s: float, symmetric: bool) -> Verdict:
    if len(gold) > _MAX_LATEX_LEN or len(pred) > _MAX_LATEX_LEN:
        return Verdict.DIFFERENT
    gold_form, pred_form = _latex_form(gold), _latex_form(pred)
    if symmetric:
        gold_form, pred_form = sorted((gold_form, pred_form))  # one cache entry for (a, b) and (b, a)
    if gold_form == pred_form:
        return Verdict.EQUIVALENT
    try:
        return Verdict.EQUIVALENT if _latex_equal(gold_form, pred_form, timeout_s, symmetric) else Verdict.DIFFERENT
    except _Undecided:
        _LOG.warning("verifier timeout (limit %.1f s): gold %r, pred %r", timeout_s, gold[:200], pred[:200])
        return Verdict.TIMEOUT


def judge(pred: str | None, gold: str, answer_type: str = "number", *,
          timeout_s: float = DEFAULT_TIMEOUT_S) -> Verdict:
    """Whether ``pred`` answers a question whose gold answer is ``gold`` (rules in the module docstring)."""
    if answer_type not in ANSWER_TYPES:
        raise ValueError(f"unknown answer_type {answer_type!r}; "
                         f"allowed: {', '.join(ANSWER_TYPES)}")
    if pred is None or not pred.strip():
        return Verdict.DIFFERENT
    if answer_type == "none":
        return Verdict.EQUIVALENT if says_unanswerable(pred) else Verdict.DIFFERENT
    if pred.strip() == gold.strip():
        return Verdict.EQUIVALENT
    gold_number, pred_number = _parse_numeric(gold), _parse_numeric(pred)
    if gold_number is not None and pred_number is not None:
        same = _numbers_match(gold_number, pred_number, exact=answer_type == "integer")
        return Verdict.EQUIVALENT if same else Verdict.DIFFERENT
    if _decimal_comma_match(gold, pred):
        return Verdict.EQUIVALENT
    return _latex_verdict(gold, pred, timeout_s, symmetric=False)


def is_equivalent(pred: str | None, gold: str, answer_type: str = "number", *,
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """``judge(...) is Verdict.EQUIVALENT``: a timeout reads as not equivalent (and is logged)."""
    return judge(pred, gold, answer_type, timeout_s=timeout_s) is Verdict.EQUIVALENT


def answers_equivalent(a: str | None, b: str | None, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Symmetric equivalence of two predicted answers (semantic-entropy clustering). None matches nothing;
    a timeout reads as not equivalent (and is logged)."""
    if a is None or b is None or not a.strip() or not b.strip():
        return False
    if a.strip() == b.strip():
        return True
    a_number, b_number = _parse_numeric(a), _parse_numeric(b)
    if a_number is not None and b_number is not None:
        return _numbers_match(a_number, b_number, exact=False)
    if _decimal_comma_match(a, b):
        return True
    return _latex_verdict(a, b, timeout_s, symmetric=True) is Verdict.EQUIVALENT
