"""Is a predicted answer equivalent to the gold one?

Two paths, cheapest first:

1. Numeric (no sympy). Both sides are read as exact rationals (``normalize_number``) after NFKC
   normalisation (Unicode digits, fullwidth forms) and stripping of presentation: ``$``/``\\$``,
   thousands separators (``1,234``, ``1{,}234``, ``1\\,234``), ``\\text{}``/``\\mathrm{}`` wrappers,
   ``\\! \\, \\; \\left \\right``, degrees (``90^\\circ``, ``90°``), a leading ``+``, Unicode minus, and unit
   words after a space (``5 dollars``, ``12 cm``, ``3 hours``). Accepted number forms: integers,
   decimals, ``3/4``, ``\\frac{3}{4}``/``\\dfrac34``/``\\frac12``, ``1e3`` and ``1.5\\times10^{3}``.
   Two integers must be equal; otherwise values within a relative 1e-6 match (0.333 is not 1/3, but
   0.3333333 is). Under ``answer_type="integer"`` equality is always exact.
   Percent rule: ``%`` is a unit, so 50% ≡ 50. When exactly one side carries ``%``, its fraction reading
   is accepted too, so 50% ≡ 0.5; two plain numbers 0.5 and 50 stay different.
2. LaTeX, when either side is not a plain number: math-verify (``parse`` then ``verify(gold, pred)``,
   gold first as it requires). It covers intervals, tuples, sets, roots, pi, equations like ``x=5``.
   math-verify's own timeout uses SIGALRM (main thread only), so it runs in a child process
   (``latex_worker.py``) that is killed when a call overruns ``timeout_s``; a timeout counts as not
   equivalent (and is cached like any other result). A warm spare worker takes over at once, so the
   call after a timeout does not wait for sympy to import (about 0.5 s here). A symmetric check
   (``answers_equivalent``) tries both directions inside one request, under one timeout. An answer
   longer than ``_MAX_LATEX_LEN`` characters is not equivalent without being parsed: no final answer
   is that long (MATH-500's longest gold answer has 53), and a megabyte of "answer" would only burn the
   timeout. Results are cached because semantic-entropy clustering compares the same pairs often.
   The worker serves one call at a time; concurrent callers queue, and each one's timeout only starts
   once its request is sent. POSIX only (``select`` on pipes, ``fork`` and resource limits).

``answer_type="none"`` (GSM-Plus "critical thinking" rows whose question lacks information): the
prediction is right iff it says the problem cannot be answered (``says_unanswerable``); any number is
wrong.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
import unicodedata
from fractions import Fraction
from pathlib import Path

ANSWER_TYPES = ("integer", "number", "latex", "none")
REL_TOL = 1e-6
_MAX_NUMERIC_LEN = 200  # a number with its unit is short; longer text goes straight to the LaTeX path
_MAX_EXPONENT = 400  # 1e999999999 would build a gigantic integer; such inputs go to the LaTeX path
_MAX_LATEX_LEN = 2000

_MINUSES = dict.fromkeys(map(ord, "\u2212\u2012\u2013\ufe63"), "-")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\[!,;: ]|\\left\b|\\right\b|~")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree\b|\\circ\b")
_PERCENT = re.compile(r"\s*(?:\\%|%|\bper\s*cent\b)$", re.I)
_UNIT_TAIL = re.compile(r"\s+[a-z]+(?:[ ./]+[a-z]+)*(?:\^\{?[23]\}?)?$", re.I)
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_DECIMAL = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?(\d+))?$", re.I)
_TIMES_TEN = re.compile(r"^(.+?)\s*(?:\\times|\\cdot|×|\*)\s*10\s*\^\s*\{?\s*([+-]?\d+)\s*\}?$")
_FRAC_ARG = r"(?:\{\s*([+-]?[\d.]+)\s*\}|(\d))"
_LATEX_FRAC = re.compile(rf"^([+-]?)\\[dt]?frac\s*{_FRAC_ARG}\s*{_FRAC_ARG}$")
_SLASH_FRAC = re.compile(r"^([+-]?[\d.]+)\s*/\s*([+-]?[\d.]+)$")

_UNANSWERABLE = re.compile(
    r"\b(?:none|no answer|no solution|unanswerable|undetermined|indeterminate|unknown|"
    r"can ?not be (?:determined|answered|calculated|found|known)|can'?t be (?:determined|answered|calculated)|"
    r"not (?:enough|sufficient) info(?:rmation)?|insufficient info(?:rmation)?|missing info(?:rmation)?|"
    r"not (?:possible|able) to (?:determine|answer|calculate))\b",
    re.I,
)


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


def _plain_number(s: str) -> Fraction | None:
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
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
    s = _strip_presentation(s)
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


def says_unanswerable(answer: str) -> bool:
    """True for answers like "None", "cannot be determined", "not enough information" (no digits)."""
    text = _TEXT_WRAPPER.sub(r" \1", _ascii_digits(answer))
    return not any(c.isdigit() for c in text) and _UNANSWERABLE.search(text) is not None


class _LatexWorker:
    """A ``latex_worker.py`` child serving requests, plus a warm spare that replaces it the moment it is
    killed for overrunning a timeout (or dies), so no call waits for a fresh worker's start-up."""

    START_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core machine can take a while

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._spare: subprocess.Popen | None = None
        self._ready = False  # whether self._proc has said "ready"

    def compare(self, gold: str, pred: str, symmetric: bool, timeout_s: float) -> bool:
        with self._lock:
            proc = self._ensure_ready()
            try:
                proc.stdin.write((json.dumps([gold, pred, symmetric]) + "\n").encode())
                proc.stdin.flush()
                reply = self._read_line(proc, timeout_s)
            except OSError:
                reply = None
            if reply is None:  # timed out, or died (e.g. a sympy recursion crash): the spare takes over
                self._kill(proc)
                self._proc = None
                return False
            return reply == b"1"

    def stop(self) -> None:
        for proc in (self._proc, self._spare):
            self._kill(proc)
        self._proc = self._spare = None

    def forget_after_fork(self) -> None:
        # A forked child must not share the parent's worker pipes (or a lock held by a parent thread).
        self._lock = threading.Lock()
        self._proc = self._spare = None

    @staticmethod
    def _kill(proc: subprocess.Popen | None) -> None:
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                pipe.close()

    @staticmethod
    def _spawn() -> subprocess.Popen:
        script = Path(__file__).with_name("latex_worker.py")
        return subprocess.Popen([sys.executable, str(script), str(os.getpid())], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, bufsize=0)

    def _ensure_ready(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._kill(self._proc)
            spare_alive = self._spare is not None and self._spare.poll() is None
            self._proc, self._spare, self._ready = (self._spare if spare_alive else self._spawn()), None, False
        if not self._ready:
            if self._read_line(self._proc, self.START_TIMEOUT_S) != b"ready":
                self.stop()
                raise RuntimeError("the math-verify worker (grpo/verify/latex_worker.py) did not start; "
                                   "is math-verify installed?")
            self._ready = True
        if self._spare is None or self._spare.poll() is not None:
            self._kill(self._spare)
            self._spare = self._spawn()  # imports while the serving worker answers
        return self._proc

    @staticmethod
    def _read_line(proc: subprocess.Popen, timeout_s: float) -> bytes | None:
        """One reply line, or None on timeout or end of stream. POSIX only (select on a pipe)."""
        deadline = time.monotonic() + timeout_s
        buffer = b""
        while not buffer.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([proc.stdout], [], [], remaining)[0]:
                return None
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                return None
            buffer += chunk
        return buffer.strip()


_WORKER = _LatexWorker()
atexit.register(_WORKER.stop)
os.register_at_fork(after_in_child=_WORKER.forget_after_fork)


@functools.lru_cache(maxsize=65536)
def _latex_equal(gold: str, pred: str, timeout_s: float, symmetric: bool = False) -> bool:
    if len(gold) > _MAX_LATEX_LEN or len(pred) > _MAX_LATEX_LEN:
        return False
    return _WORKER.compare(gold, pred, symmetric, timeout_s)


def _latex_form(s: str) -> str:
    return s.replace("\\$", "").strip().strip("$").strip()


def is_equivalent(pred: str | None, gold: str, answer_type: str = "number", *, timeout_s: float = 1.0) -> bool:
    """Whether ``pred`` answers a question whose gold answer is ``gold`` (rules in the module docstring)."""
    if answer_type not in ANSWER_TYPES:
        raise ValueError(f"is_equivalent: unknown answer_type {answer_type!r}; "
                         f"allowed: {', '.join(ANSWER_TYPES)}")
    if pred is None or not pred.strip():
        return False
    if answer_type == "none":
        return says_unanswerable(pred)
    if pred.strip() == gold.strip():
        return True
    gold_number, pred_number = _parse_numeric(gold), _parse_numeric(pred)
    if gold_number is not None and pred_number is not None:
        return _numbers_match(gold_number, pred_number, exact=answer_type == "integer")
    gold_form, pred_form = _latex_form(gold), _latex_form(pred)
    return gold_form == pred_form or _latex_equal(gold_form, pred_form, timeout_s)


def answers_equivalent(a: str | None, b: str | None, *, timeout_s: float = 1.0) -> bool:
    """Symmetric equivalence of two predicted answers (semantic-entropy clustering). None matches nothing."""
    if a is None or b is None or not a.strip() or not b.strip():
        return False
    if a.strip() == b.strip():
        return True
    a_number, b_number = _parse_numeric(a), _parse_numeric(b)
    if a_number is not None and b_number is not None:
        return _numbers_match(a_number, b_number, exact=False)
    a_form, b_form = sorted((_latex_form(a), _latex_form(b)))  # one cache entry for (a, b) and (b, a)
    return a_form == b_form or _latex_equal(a_form, b_form, timeout_s, symmetric=True)
