"""Gold-answer parsing: each dataset's raw answer field becomes one string plus its type.

The types are a contract with the verifier:
- ``integer``: the string is a canonical integer (``int(answer)`` works; no zero padding, no ``.0``).
- ``number``: a decimal that is not an integer (``float(answer)`` works).
- ``latex``: anything else (an expression, a fraction such as ``1/4``, a tuple, text); compare it with a
  math-equivalence checker, never by exact string match.
- ``none``: the question has no answer by design (GSM-Plus "critical thinking"); the expected
  response says so.

A parser returns ``None`` for a gold answer it cannot read; loading counts and skips those rows.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

INTEGER, NUMBER, LATEX, NONE = "integer", "number", "latex", "none"
ANSWER_TYPES = (INTEGER, NUMBER, LATEX, NONE)

_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(\d+\.\d*|\.\d+)")


@dataclass(frozen=True)
class Gold:
    answer: str
    answer_type: str


AnswerParser = Callable[[Any], Gold | None]


def numeric_text(text: str) -> Gold | None:
    """A plain integer or decimal string typed as integer/number (``"025"`` → ``25``, ``"75.0"`` → ``75``);
    ``None`` for anything else."""
    text = text.strip()
    if _INTEGER.fullmatch(text):
        return Gold(str(int(text)), INTEGER)
    if _DECIMAL.fullmatch(text):
        value = float(text)
        if value.is_integer():
            return Gold(str(int(value)), INTEGER)
        return Gold(text.lstrip("+"), NUMBER)
    return None


def parse_numeric(value: Any) -> Gold | None:
    """A numeric gold answer given as int, float or string (AIME ``"025"``, AMC ``75.0``, DAPO ``"34"``)."""
    if isinstance(value, bool):  # bool is an int subclass; a True/False gold answer is a data error
        return None
    if isinstance(value, int):
        return Gold(str(value), INTEGER)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return Gold(str(int(value)), INTEGER) if value.is_integer() else Gold(repr(value), NUMBER)
    if isinstance(value, str):
        return numeric_text(value)
    return None


def parse_gsm8k(value: Any) -> Gold | None:
    """GSM8K's worked solution: the final answer follows the last ``####``, possibly with thousands
    separators (``#### 1,234`` → ``1234``)."""
    if not isinstance(value, str) or "####" not in value:
        return None
    return numeric_text(value.rsplit("####", 1)[1].replace(",", ""))


def parse_math(value: Any) -> Gold | None:
    """A LaTeX final answer (MATH-500, DeepScaleR, Open-RS), kept as written. Plain numbers such as ``"42"``
    are typed integer/number so numeric rules apply to them; a null or empty answer does not parse."""
    if isinstance(value, (int, float)):
        return parse_numeric(value)
    if not isinstance(value, str) or not value.strip():
        return None
    return numeric_text(value) or Gold(value.strip(), LATEX)


def parse_gsm_plus(value: Any) -> Gold | None:
    """GSM-Plus's extracted answer: ``"None"`` marks the unanswerable critical-thinking rows; the rest
    are numbers, a few of them fractions such as ``"1/4"`` (typed latex: ``float()`` cannot read them)."""
    if not isinstance(value, str) or not value.strip():
        return None
    if value.strip() == "None":
        return Gold("None", NONE)
    return numeric_text(value.replace(",", "")) or Gold(value.strip(), LATEX)
