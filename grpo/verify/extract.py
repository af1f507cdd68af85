"""Final-answer extraction from a model completion.

Sources, strongest first (``mode`` picks which are allowed):

0. A "final answer is X" / "final answer: X" statement that comes after the last closed box and holds
   math or a number (rule D); without a box, source 3 reads it.
1. ``\\boxed{...}`` / ``\\fbox{...}``: the final group of boxes (brace-matching scan, so nested
   ``\\frac{1}{2}`` and escaped ``\\{ \\}`` work): the last box whose braces close, and each box before
   it that is joined to the next by a connector (rule A). Several boxes make one answer, their contents
   joined by ", " (``\\boxed{-2} and \\boxed{1}`` gives ``-2, 1``), which the equivalence compares as
   MATH compares solution sets: unordered.
2. ``<answer>...</answer>``: the last closed pair. If the inner text holds a box, the box group; if it
   holds an answer phrase, that (source 3); else the whole inner text. An unclosed ``<answer>`` at the
   very end counts only when the model stopped on its own (``finish_reason="stop"``): engines that use
   ``</answer>`` as a stop string strip it from the output.
3. "the answer is X" / "final answer: X" / "Answer: X" (case-insensitive): the last occurrence. X runs
   to the end of its line and is cut at the first sentence-ending period. If X holds a box, its box
   group; if X is prose (rule B) or holds math spans, the math inside it (rule C: "Final Answer: The
   largest $n$ is 34." gives ``34``, "$12$ and $13$" gives ``12, 13``); else X itself ("12 dollars").
4. ``#### X`` (GSM8K style): the last occurrence, X to the end of its line.
5. The last group of math spans or the last number, whichever ends last (rule C): ``$x \\geq 5$ is the
   solution`` gives ``x \\geq 5``, not ``5``; "$x$ is 7" gives ``7``.

Modes: ``boxed`` = 1, ``tagged`` = 2, ``strict`` = 1-2, ``lenient`` = 0-5. Rewards that demand a format
use ``strict``/``tagged``/``boxed``; evaluation uses ``lenient``.

Rule A, boxes that make one answer: the text between two boxes, once layout is removed (``$``,
``\\(`` ``\\)`` ``\\[`` ``\\]``, ``\\quad``, LaTeX spaces, the braces of ``\\text{}``), is empty (but no
blank line), or holds a separator (``,`` ``;`` "and" "or") within ``_MAX_CONNECTOR`` characters and
``_MAX_CONNECTOR_WORDS`` words, and no brace (the boxes sit in different groups), no sentence end, no
blank line and no word of correction or sequence (``_NOT_ONE_ANSWER``: "wait", "no", "actually",
"then", "so", ...). ``\\boxed{1} papers and \\boxed{2} bins`` is one answer; ``\\boxed{1}. Wait, that is
wrong: \\boxed{2}`` and ``\\boxed{1} and then \\boxed{2}`` give the last box.

Rule B, prose: at least two words of three or more letters outside LaTeX commands and the text they
set (``\\text{all real numbers}`` is an answer) ("12 dollars" and
"3.5 kg" are answers; "The largest $n$ is 34" is a sentence; "dy" and "xy" are products of variables).
A sentence that holds no math and no number is kept whole ("cannot be determined").

Rule C, math spans: ``$$...$$``, ``\\[...\\]``, ``$...$`` and ``\\(...\\)`` (an escaped ``\\$`` is no
delimiter; an inline span that meets a blank line is abandoned). An inline ``$...$`` whose content is
prose ("pays $5 and she has $") is currency, not math: its closing ``$`` may open the next span
instead. Spans joined by nothing but a separator (``$1$, $2$ and $3$``) make one answer, as boxes do.
A number inside a span is part of it. A number is never glued to a Latin word or a digit ("AZYUK2A"
holds none; "答案是42" holds 42), may group thousands with commas or single spaces ("1 000"), keeps a
decimal comma whole ("2,74", for the equivalence to judge), and may be a LaTeX fraction written
without delimiters (``\\frac{10}{9}``).

Rule D, a final-answer statement after the boxes: in the Minerva format ("Final Answer: The final
answer is $10,455$. I hope it is correct.") the boxes before the statement are intermediate results,
and math-verify ranks that statement first too. Without "final", a box still beats later prose
("\\boxed{10} The answer is 11" gives 10), and a statement without math ("the final answer is in the
box above") overrides nothing.

Self-correction rule: within a source, the LAST occurrence wins ("the answer is 5 ... wait, actually the
answer is 6" gives 6; two boxes separated by a correction give the second; two ``####`` lines the
second). Across sources the priority above holds, so a box beats later prose: the box is the answer the
model committed to, prose after it is commentary. A correction therefore counts only when it is
restated in the same form as the answer it corrects or a stronger one: "The answer is 5. Hmm, no, it's
6." gives 5, because "it's 6" is no answer phrase (only the fallback would see it, and the phrase
outranks that).

Truncation rule (``finish_reason="length"``): only an answer the model had already finished counts: a
closed box, a closed answer tag, or a phrase / ``####`` answer that is followed by a line break or a
sentence-ending period (otherwise the generation may have been cut mid-number: "the answer is 12" of
"125"). An unclosed box or tag never counts, and the fallback (source 5) is never used.

The result is cleaned (surrounding whitespace, ``$``, ``\\(``/``\\)``, markdown ``**``, trailing period)
and an empty result counts as no answer. Every scan is linear in the text length (no nested regex
quantifiers; box scans never revisit text; each math delimiter is looked at once), so a 1 MB
completion takes milliseconds.
"""
from __future__ import annotations

import re

MODES = ("boxed", "tagged", "strict", "lenient")

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
# A backslash escapes the next character (``\{`` is a literal brace in a set); anything else is a brace.
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.S)
_PHRASE = re.compile(r"\banswer\s*(?:is\b\s*:?|:)\s*", re.I)
_FINAL_PHRASE = re.compile(r"\bfinal\s+answer\s*(?:is\b\s*:?|:)\s*", re.I)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
# Rule C's numbers; ".5" is one too.
_NUMBER = re.compile(
    r"(?<![A-Za-z\d])(?:(?:\d{1,3}(?:(?:,\d{3})+|(?: \d{3})+)(?!\d)|\d+)(?:[.,]\d+)?(?:[ \t]*/[ \t]*\d+)?"
    r"|(?<!\.)\.\d+|\\[dtc]?frac\{\d+(?:\.\d+)?\}\{\d+(?:\.\d+)?\})")
_SIGNS = "-+\u2212\u2012\u2013\ufe63\uff0d"  # ASCII, minus sign, figure/en dash, small/fullwidth
_WRAPPERS = (("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"))

_MATH_DELIMITER = re.compile(r"\\\$|\$\$|\$|\\[()\[\]]")
_MATH_CLOSER = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_TEXT_GROUP = re.compile(r"\\(?:text|textrm|textnormal|mathrm|mbox)\s*\{([^{}]*)\}")
_LAYOUT = re.compile(r"\$|\\[()\[\]]|\\q?quad\b|\\[,;:! ]|~")
_SEPARATOR = re.compile(r"[,;]|\b(?:and|or)\b", re.I)
_SPAN_JOINER = re.compile(r"\s*(?:[,;]|,?\s*\b(?:and|or)\b)\s*", re.I)
_NOT_ONE_ANSWER = re.compile(
    r"\b(?:wait|no|not|actually|but|hmm+|instead|rather|then|so|thus|hence|therefore|however|oops|sorry|"
    r"wrong|mistake|correct(?:ion|ed)?|check|again)\b|[.!?](?:\s|$)|\n\s*\n", re.I)
_MAX_CONNECTOR = 70  # characters
_MAX_CONNECTOR_WORDS = 6
_WORD = re.compile(r"[^\W\d_]{3,}")
# Removed before counting words: commands, environment names, and text set inside math (``\\text{all
# real numbers}`` is an answer, not currency prose).
_NOT_PROSE = re.compile(r"\\(?:text\w*|mbox|mathrm)\s*\{[^{}]*\}|\\(?:begin|end)\s*\{[^{}]*\}|\\[A-Za-z]+")


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


def _joined(between: str, loose: bool) -> bool:
    """Whether two answers with ``between`` between them are parts of one answer (rules A and C)."""
    if len(between) > 4 * _MAX_CONNECTOR:  # even with layout commands, no connector is that long
        return False
    rest = _LAYOUT.sub(" ", _TEXT_GROUP.sub(r" \1 ", between)).strip()
    if not loose:
        return _SPAN_JOINER.fullmatch(rest) is not None
    if not rest:
        return "\n\n" not in between
    return (len(rest) <= _MAX_CONNECTOR and len(rest.split()) <= _MAX_CONNECTOR_WORDS
            and "{" not in rest and "}" not in rest  # a brace left over: the boxes sit in different groups
            and _SEPARATOR.search(rest) is not None and _NOT_ONE_ANSWER.search(rest) is None)


def _combine(parts: list[str]) -> str:
    unique = list(dict.fromkeys(part.strip() for part in parts))
    return ", ".join(unique)


def _boxes_backwards(text: str):
    """Closed boxes as (command start, content start, content end), last first. Each scan is bounded by
    the start of the box found before it (or of a box that never closes), so the search is linear."""
    starts = [(m.start(), m.end()) for m in _BOX_OPEN.finditer(text)]
    limit = len(text)
    for command, start in reversed(starts):
        end = _closing_brace(text, start, limit)
        if end is not None:
            yield command, start, end
        # An unclosed box bounds the next scan: no earlier box still open here can close after it.
        limit = command if end is not None else start


def _box_group(text: str) -> str | None:
    """Rule A: the final group of boxes, combined; None if no box closes."""
    parts: list[str] = []
    group_start = None
    for command, start, end in _boxes_backwards(text):
        if group_start is not None and not _joined(text[end + 1:group_start], loose=True):
            break
        parts.append(text[start:end])
        group_start = command
    return _combine(parts[::-1]) if parts else None


def last_boxed(text: str) -> str | None:
    """Content of the last closed ``\\boxed{}``/``\\fbox{}``, or None."""
    for _, start, end in _boxes_backwards(text):
        return text[start:end]
    return None


def _math_spans(text: str) -> list[tuple[int, int, int, int]]:
    """Rule C: math spans as (start, content start, content end, end), in order. An inline span
    (``$``, ``\\(``) that meets a blank line before it closes is abandoned."""
    spans = []
    closer, opened, content_start = None, 0, 0
    blank = -1  # the first blank line at or after content_start; it only moves forward (linear)
    for match in _MATH_DELIMITER.finditer(text):
        token = match.group()
        if token == "\\$":
            continue
        if closer in ("$", "\\)") and blank < match.start():
            closer = None
        if closer is None or (closer == "$" == token and _is_prose(text[content_start:match.start()])):
            # Nothing open, or a currency "$...$": this delimiter may open a span.
            if token in _MATH_CLOSER:
                closer, opened, content_start = _MATH_CLOSER[token], match.start(), match.end()
                if blank < content_start:
                    found = text.find("\n\n", content_start)
                    blank = len(text) if found == -1 else found
            continue
        if token == closer:
            spans.append((opened, content_start, match.start(), match.end()))
            closer = None
    return spans


def _is_prose(text: str) -> bool:
    """Rule B: at least two words of three or more letters outside LaTeX commands and ``\\text{}``."""
    words = _WORD.finditer(_NOT_PROSE.sub(" ", text))
    return next(words, None) is not None and next(words, None) is not None


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


def _last_number(text: str) -> tuple[int, int] | None:
    """(start, end) of the last number, its sign included."""
    last = _last_match(_NUMBER, text)
    if last is None:
        return None
    start = last.start()
    # A sign belongs to the number unless it is an infix minus: "3-5" ends in 5, not -5.
    before = text[start - 2] if start > 1 else " "
    if start and text[start - 1] in _SIGNS and not (before.isalnum() or before in ")]}"):
        start -= 1
    return start, last.end()


def _last_math_or_number(text: str) -> str | None:
    """Rule C: the final group of math spans or the last number, whichever ends last."""
    spans = _math_spans(text)
    number = _last_number(text)
    if spans and (number is None or spans[-1][3] >= number[1]):
        parts = [text[spans[-1][1]:spans[-1][2]]]
        for previous, current in zip(reversed(spans[:-1]), reversed(spans)):
            if not _joined(text[previous[3]:current[0]], loose=False):
                break
            parts.append(text[previous[1]:previous[2]])
        return _combine(parts[::-1])
    return None if number is None else text[number[0]:number[1]]


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


def _answer_in(capture: str | None) -> str | None:
    """The answer an answer phrase states: its boxes; the math inside a sentence (rule B) or inside math
    delimiters ("$12$ and $13$"); else the capture itself ("12 dollars")."""
    if capture is not None and _BOX_OPEN.search(capture):
        return _box_group(capture)  # "the answer is \boxed{12" (unclosed) is no answer
    if capture is not None and (_is_prose(capture) or _math_spans(capture)):
        return _last_math_or_number(capture) or capture
    return capture


def _from_phrase(text: str, truncated: bool) -> str | None:
    # A case-insensitive regex scans slowly; one lower() and a substring test rule most texts out.
    last = _last_match(_PHRASE, text) if "answer" in text.lower() else None
    return None if last is None else _answer_in(_rest_of_line(text, last.end(), truncated))


def _from_final_phrase(text: str, truncated: bool) -> str | None:
    """Rule D: a "final answer" statement holding math, after the last closed box, overrides the box."""
    last = _last_match(_FINAL_PHRASE, text) if "final" in text.lower() else None
    box = None if last is None else next(_boxes_backwards(text), None)
    if box is None or box[2] > last.start():
        return None  # no box (the phrase source reads it), or the box comes after the statement
    capture = _rest_of_line(text, last.end(), truncated)
    if capture is None or _last_math_or_number(capture) is None:
        return None  # "the final answer is in the box above"
    return _answer_in(capture)


def _from_hashes(text: str, truncated: bool) -> str | None:
    start = text.rfind("####")
    return None if start == -1 else _rest_of_line(text, start + 4, truncated)


def _from_box(text: str, truncated: bool) -> str | None:
    return _box_group(text)


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
    boxed = _box_group(inner)
    if boxed is not None:
        return boxed
    return _from_phrase(inner, truncated=False) or inner


def _from_fallback(text: str, truncated: bool) -> str | None:
    return None if truncated else _last_math_or_number(text)


_SOURCES = {
    "boxed": (_from_box,),
    "tagged": (_from_tag,),
    "strict": (_from_box, _from_tag),
    "lenient": (_from_final_phrase, _from_box, _from_tag, _from_phrase, _from_hashes, _from_fallback),
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
