"""Final-answer extraction from a model completion.

Sources, strongest first (``mode`` picks which are allowed):

1. ``\\boxed{...}`` / ``\\fbox{...}``: the last one whose braces close (brace-matching scan, so nested
   ``\\frac{1}{2}`` and escaped ``\\{ \\}`` work).
2. ``<answer>...</answer>``: the last closed pair. If the inner text holds a box, the box; if it holds
   "the answer is X", X; else the whole inner text. An unclosed ``<answer>`` at the very end counts only
   when the model stopped on its own (``finish_reason="stop"``): engines that use ``</answer>`` as a
   stop string strip it from the output.
3. "the answer is X" / "final answer: X" / "Answer: X" (case-insensitive): the last occurrence. X runs
   to the end of its line and is cut at the first sentence-ending period.
4. ``#### X`` (GSM8K style): the last occurrence, X to the end of its line.
5. The last number in the text (``1,234``, ``-3.5``, ``3/4``; Unicode digits and minus included).

Modes: ``boxed`` = 1, ``tagged`` = 2, ``strict`` = 1-2, ``lenient`` = 1-5. Rewards that demand a format use
``strict``/``tagged``/``boxed``; evaluation uses ``lenient``.

Self-correction rule: within a source, the LAST occurrence wins ("the answer is 5 ... wait, actually the
answer is 6" gives 6; two boxes give the second; two ``####`` lines the second). Across sources the
priority above holds, so a box beats later prose: the box is the answer the model committed to, prose
after it is commentary. A correction therefore counts only when it is restated in the same form as the
answer it corrects or a stronger one: "The answer is 5. Hmm, no, it's 6." gives 5, because "it's 6" is
no answer phrase (only the last-number fallback would see it, and the phrase outranks that).

Truncation rule (``finish_reason="length"``): only an answer the model had already finished counts: a
closed box, a closed answer tag, or a phrase / ``####`` answer that is followed by a line break or a
sentence-ending period (otherwise the generation may have been cut mid-number: "the answer is 12" of
"125"). An unclosed box or tag never counts, and the last-number fallback is never used.

The result is cleaned (surrounding whitespace, ``$``, ``\\(``/``\\)``, markdown ``**``, trailing period)
and an empty result counts as no answer. Every scan is linear in the text length (no nested regex
quantifiers; box scans never revisit text), so a 1 MB completion takes milliseconds.
"""
from __future__ import annotations

import re

MODES = ("boxed", "tagged", "strict", "lenient")

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
# A backslash escapes the next character (``\{`` is a literal brace in a set); anything else is a brace.
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.S)
_PHRASE = re.compile(r"\banswer\s*(?:is\b\s*:?|:)\s*", re.I)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
# Digits first (a sign is looked at by hand): a pattern that starts with a digit class lets the regex
# engine skip ahead quickly, which matters on long texts with few numbers.
_NUMBER = re.compile(r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:[ \t]*/[ \t]*\d+)?")
_SIGNS = "-+\u2212\u2012\u2013\ufe63\uff0d"  # ASCII, minus sign, figure/en dash, small/fullwidth
_WRAPPERS = (("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"))


def _closing_brace(text: str, start: int, limit: int) -> int | None:
    """Index of the brace that closes the group opened just before ``start``, searching text[start:limit]."""
    depth = 1
    for match in _BRACE_TOKEN.finditer(text, start, limit):
        token = match.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if depth == 0:
                return match.start()
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last closed ``\\boxed{}``/``\\fbox{}``, or None."""
    starts = [m.end() for m in _BOX_OPEN.finditer(text)]
    limit = len(text)
    for start in reversed(starts):
        end = _closing_brace(text, start, limit)
        if end is not None:
            return text[start:end]
        # This box never closes, so no earlier box that is still open here can close after this point
        # either: bounding the next scan keeps the whole search linear.
        limit = start
    return None


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The last match of ``pattern`` in ``text``, searching windows that grow from the end.

    Answers sit near the end of a long text. Each window starts just after a line break; lookbehinds
    and ``\\b`` still see the text before it. That yields the full scan's last match as long as the part
    of a match after a line break can never start a match itself: true here, since numbers hold no
    line break and a phrase match runs past one only with whitespace, ":" or "is".
    """
    size = 4096
    while True:
        start = 0 if size >= len(text) else text.find("\n", len(text) - size) + 1
        last = None
        for last in pattern.finditer(text, start):
            pass
        if last is not None or start == 0:
            return last
        size *= 16


def _terminated(capture: str, truncated: bool) -> str | None:
    """The capture cut at its first sentence end; in a truncated text, None unless such an end exists."""
    cut = _SENTENCE_END.search(capture)
    if cut is not None:
        return capture[: cut.start()]
    return None if truncated else capture


def _rest_of_line(text: str, start: int, truncated: bool) -> str | None:
    """text[start:] up to its line break; the line break also proves the answer was finished."""
    newline = text.find("\n", start)
    if newline != -1:
        return _terminated(text[start:newline], truncated=False)
    return _terminated(text[start:], truncated)


def _from_phrase(text: str, truncated: bool) -> str | None:
    # A case-insensitive regex scans slowly; one lower() and a substring test rule most texts out.
    last = _last_match(_PHRASE, text) if "answer" in text.lower() else None
    if last is None:
        return None
    capture = _rest_of_line(text, last.end(), truncated)
    if capture is not None and _BOX_OPEN.search(capture):
        return last_boxed(capture)  # "the answer is \boxed{12" (unclosed) is no answer
    return capture


def _from_hashes(text: str, truncated: bool) -> str | None:
    start = text.rfind("####")
    return None if start == -1 else _rest_of_line(text, start + 4, truncated)


def _from_box(text: str, truncated: bool) -> str | None:
    return last_boxed(text)


def _from_tag(text: str, truncated: bool) -> str | None:
    last_open = text.rfind("<answer>")
    last_close = text.rfind("</answer>")
    if last_open == -1:
        return None
    if last_open > last_close and not truncated:
        inner = text[last_open + len("<answer>"):]
    elif last_close != -1:
        open_ = text.rfind("<answer>", 0, last_close)
        if open_ == -1:
            return None
        inner = text[open_ + len("<answer>"):last_close]
    else:
        return None
    boxed = last_boxed(inner)
    if boxed is not None:
        return boxed
    return _from_phrase(inner, truncated=False) or inner


def _from_last_number(text: str, truncated: bool) -> str | None:
    last = None if truncated else _last_match(_NUMBER, text)
    if last is None:
        return None
    start = last.start()
    # A sign belongs to the number unless it is an infix minus: "3-5" ends in 5, not -5.
    before = text[start - 2] if start > 1 else " "
    if start and text[start - 1] in _SIGNS and not (before.isalnum() or before in ")]}"):
        start -= 1
    return text[start:last.end()]


_SOURCES = {
    "boxed": (_from_box,),
    "tagged": (_from_tag,),
    "strict": (_from_box, _from_tag),
    "lenient": (_from_box, _from_tag, _from_phrase, _from_hashes, _from_last_number),
}


def clean_answer(answer: str) -> str:
    """Strip presentation around an answer: whitespace, ``$``, ``\\(...\\)``, ``**...**``, trailing period."""
    previous = None
    while answer != previous:
        previous = answer
        answer = answer.strip().strip("$").strip()
        if answer.endswith(".") and not answer.endswith("\\."):
            answer = answer[:-1]
        for left, right in _WRAPPERS:
            if answer.startswith(left) and answer.endswith(right) and len(answer) >= len(left) + len(right):
                answer = answer[len(left):len(answer) - len(right)]
    return answer


def extract_answer(text: str, *, mode: str = "lenient", finish_reason: str = "stop") -> str | None:
    """The completion's final answer under ``mode`` (see the module docstring), cleaned, or None."""
    if mode not in _SOURCES:
        raise ValueError(f"extract_answer: unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    truncated = finish_reason == "length"
    for source in _SOURCES[mode]:
        found = source(text, truncated)
        if found is not None:
            cleaned = clean_answer(found)
            if cleaned:
                return cleaned
    return None
