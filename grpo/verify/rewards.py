"""Reward functions for GRPO, by name, and their weighted sum.

Every function has the signature ``fn(completion, sample, *, finish_reason, num_tokens, max_tokens)``
and returns a ``RewardResult(value, reason)``; ``completion`` is the whole response including the
prompt's prefill (``<reasoning>\\n`` or ``<think>\\n``) and ``sample`` a dataset row (``answer``,
``answer_type``). Values are in [0, 1] or a natural unit (penalties in [-1, 0]); ``params.yaml``
weights set the scale. The five rewards of the well-known GSM8K GRPO recipe (willccbb's grpo_demo:
correctness 2.0, int 0.5, strict format 0.5, soft format 0.5, xmlcount up to 0.5) are reproduced by::

    rewards: {correctness: 2.0, integer_answer: 0.5, tagged_format_strict: 0.5,
              tagged_format_soft: 0.5, tag_count: 1.0}

A correctness reward whose LaTeX comparison timed out is 0 with ``timed_out`` set (the verdict is
unknown, not "wrong"); ``compute_rewards`` counts those completions in ``verify_timeouts``, which the
training log and the evaluation metrics report, so a run that loses verdicts to timeouts says so.

Where this module differs from the recipe: the strict format regex uses DOTALL (the recipe's did not,
so multi-line reasoning never matched), ``tag_count`` charges the text after ``</answer>`` once
(the recipe charged it twice when ``\\n</answer>\\n`` was present), and the format rewards
(``tagged_format_strict``, ``tagged_format_soft``, ``tag_count``, ``r1_format``) pay only when the
format holds an answer (``extract_answer`` finds one in the tag or box). Without that, an empty
template (``<answer>\\n\\n</answer>``, 17 tokens) collected 1.5 of the recipe's 4.0 at zero risk, more
than a wrong attempt, and a model that never answers correctly learned to stop answering (issue 19).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from grpo.verify.equivalence import Verdict, judge, normalize_number
from grpo.verify.extract import extract_answer, last_boxed

OVERLONG_BUFFER_FRACTION = 0.2  # DAPO's soft overlong punishment starts 20% of max_tokens before the cap
_TAG_COUNT_TAGS = ("<reasoning>\n", "\n</reasoning>\n", "\n<answer>\n", "\n</answer>")
_TAGGED_STRICT = re.compile(r"<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n?\Z", re.S)
_TAGGED_SOFT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", re.S)
_INTEGER_LITERAL = re.compile(r"[+\-\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)")


@dataclass(frozen=True)
class RewardResult:
    value: float
    reason: str  # short, for logs: "gold 42, got 41", "no <answer> tag", "truncated"
    timed_out: bool = False  # the equivalence check ran out of time: the value is not a verdict


RewardFn = Callable[..., RewardResult]
# Every reward by name, in the order they are defined: params' train.rewards may name these
# (grpo/config.py validates against this dict). Adding a reward is writing one ``@reward`` function.
REWARD_FUNCTIONS: dict[str, RewardFn] = {}


def reward(fn: RewardFn) -> RewardFn:
    """Register ``fn`` under its own name; the name is what params.yaml weights."""
    if fn.__name__ in REWARD_FUNCTIONS:
        raise ValueError(f"reward {fn.__name__!r} is registered twice")
    REWARD_FUNCTIONS[fn.__name__] = fn
    return fn


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _correctness(completion: str, sample: Mapping, finish_reason: str, mode: str) -> RewardResult:
    gold = str(sample["answer"])
    pred = extract_answer(completion, mode=mode, finish_reason=finish_reason)
    if pred is None:
        return RewardResult(0.0, "truncated, no answer" if finish_reason == "length" else "no answer")
    verdict = judge(pred, gold, sample.get("answer_type", "number"))
    reason = f"gold {_short(gold)}, got {_short(pred)}"
    if verdict is Verdict.TIMEOUT:
        return RewardResult(0.0, f"{reason}: verifier timeout", timed_out=True)
    return RewardResult(1.0 if verdict is Verdict.EQUIVALENT else 0.0, reason)


@reward
def correctness(completion: str, sample: Mapping, *, finish_reason: str = "stop", num_tokens: int = 0,
                max_tokens: int = 0) -> RewardResult:
    """1 if the answer (lenient extraction, truncation rule applies) is equivalent to the gold one."""
    return _correctness(completion, sample, finish_reason, "lenient")


@reward
def correctness_strict(completion: str, sample: Mapping, *, finish_reason: str = "stop", num_tokens: int = 0,
                       max_tokens: int = 0) -> RewardResult:
    """Like ``correctness``, but only a ``\\boxed{}`` or ``<answer>`` answer counts."""
    return _correctness(completion, sample, finish_reason, "strict")


# A template's placeholders in place of an answer: "<value>", "<total>\n<initial number>\n<remarks>",
# "[answer]". The arith-cpu runs learned `<answer>\n<value>\n</answer>` and then, once a lone placeholder
# no longer paid, several of them (every format reward paid, correctness 0; bench/RESULTS.md, "arith-cpu
# on level 0"): an answer with nothing but placeholders and punctuation states nothing, as an empty tag.
_PLACEHOLDER = re.compile(r"</?[A-Za-z][A-Za-z0-9 _-]*>|\[[A-Za-z][A-Za-z _-]*\]")


def _states_answer(completion: str, mode: str, finish_reason: str) -> bool:
    answer = extract_answer(completion, mode=mode, finish_reason=finish_reason)
    return answer is not None and any(c.isalnum() for c in _PLACEHOLDER.sub("", answer))


@reward
def r1_format(completion: str, sample: Mapping, *, finish_reason: str = "stop", num_tokens: int = 0,
              max_tokens: int = 0) -> RewardResult:
    """1 if the text is ``<think>...</think>`` followed by a response holding a closed, non-empty ``\\boxed{}``."""
    text = completion.lstrip()
    if not text.startswith("<think>"):
        return RewardResult(0.0, "no <think> at start")
    end = text.find("</think>")
    if end == -1:
        return RewardResult(0.0, "no </think>")
    if last_boxed(text[end + len("</think>"):]) is None:
        return RewardResult(0.0, "no \\boxed{} after </think>")
    if not _states_answer(text[end + len("</think>"):], "boxed", finish_reason):
        return RewardResult(0.0, "empty \\boxed{}")
    return RewardResult(1.0, "ok")


@reward
def tagged_format_strict(completion: str, sample: Mapping, *, finish_reason: str = "stop", num_tokens: int = 0,
                         max_tokens: int = 0) -> RewardResult:
    """1 if the whole text is exactly ``<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>[\\n]``
    and the answer tag holds an answer."""
    if not _TAGGED_STRICT.match(completion):
        return RewardResult(0.0, "not exactly <reasoning>/<answer> layout")
    if not _states_answer(completion, "tagged", finish_reason):
        return RewardResult(0.0, "layout ok, no answer in <answer>")
    return RewardResult(1.0, "ok")


@reward
def tagged_format_soft(completion: str, sample: Mapping, *, finish_reason: str = "stop", num_tokens: int = 0,
                       max_tokens: int = 0) -> RewardResult:
    """1 if ``<reasoning>...</reasoning>`` followed by ``<answer>...</answer>`` appears anywhere, and the
    answer tag holds an answer."""
    if not _TAGGED_SOFT.search(completion):
        return RewardResult(0.0, "no <reasoning> then <answer> block")
    if not _states_answer(completion, "tagged", finish_reason):
        return RewardResult(0.0, "blocks ok, no answer in <answer>")
    return RewardResult(1.0, "ok")


@reward
def integer_answer(completion: str, sample: Mapping, *, finish_reason: str = "stop", num_tokens: int = 0,
                   max_tokens: int = 0) -> RewardResult:
    """1 if the answer (lenient extraction) is an integer literal: ``42``, ``-3``, ``1,234``.

    ``5.0`` and ``10/2`` are not literals: the reward teaches the plain format GSM8K expects.
    """
    pred = extract_answer(completion, mode="lenient", finish_reason=finish_reason)
    if pred is None:
        return RewardResult(0.0, "no answer")
    if _INTEGER_LITERAL.fullmatch(pred) and normalize_number(pred) is not None:
        return RewardResult(1.0, "ok")
    return RewardResult(0.0, f"not an integer: {_short(pred)}")


@reward
def tag_count(completion: str, sample: Mapping, *, finish_reason: str = "stop", num_tokens: int = 0,
              max_tokens: int = 0) -> RewardResult:
    """The recipe's xmlcount: +0.125 per tag line present exactly once, -0.001 per character after the
    last ``</answer>`` (one trailing newline is free). At most 0.5; long trailing text makes it negative.
    The tags pay only when the answer tag holds an answer; the trailing charge applies regardless."""
    present = [tag for tag in _TAG_COUNT_TAGS if completion.count(tag) == 1]
    stated = _states_answer(completion, "tagged", finish_reason)
    value = 0.125 * len(present) if stated else 0.0
    close = completion.rfind("</answer>")
    trailing = 0
    if close != -1:
        tail = completion[close + len("</answer>"):]
        trailing = len(tail[1:] if tail.startswith("\n") else tail)
        value -= 0.001 * trailing
    paid = "" if stated else " (unpaid: no answer in <answer>)"
    return RewardResult(value, f"{len(present)}/4 tags{paid}, {trailing} trailing chars")


def _require_max_tokens(max_tokens: int, name: str) -> None:
    if max_tokens <= 0:
        raise ValueError(f"{name}: needs max_tokens > 0 (the response length cap), got {max_tokens}")


@reward
def overlong_penalty(completion: str, sample: Mapping, *, finish_reason: str = "stop", num_tokens: int = 0,
                     max_tokens: int = 0) -> RewardResult:
    """DAPO's soft overlong punishment: 0 up to ``max_tokens - buffer``, then linear down to -1 at
    ``max_tokens`` (and -1 beyond), with ``buffer = OVERLONG_BUFFER_FRACTION * max_tokens``."""
    _require_max_tokens(max_tokens, "overlong_penalty")
    buffer = OVERLONG_BUFFER_FRACTION * max_tokens
    excess = num_tokens - (max_tokens - buffer)
    if excess <= 0:
        return RewardResult(0.0, f"{num_tokens}/{max_tokens} tokens")
    return RewardResult(-min(excess / buffer, 1.0), f"{num_tokens}/{max_tokens} tokens, in overlong buffer")


@reward
def length_penalty(completion: str, sample: Mapping, *, finish_reason: str = "stop", num_tokens: int = 0,
                   max_tokens: int = 0) -> RewardResult:
    """``-num_tokens / max_tokens``: every token costs the same."""
    _require_max_tokens(max_tokens, "length_penalty")
    return RewardResult(-num_tokens / max_tokens, f"{num_tokens}/{max_tokens} tokens")


class Rewards(NamedTuple):
    totals: list[float]  # weighted sum per completion
    per_fn: dict[str, list[float]]  # each function's raw values
    reasons: list[dict[str, str]]  # each completion's reasons by function
    verify_timeouts: int  # completions with a reward whose equivalence check timed out


def compute_rewards(
    completions: Sequence[str],
    samples: Sequence[Mapping],
    weights: Mapping[str, float],
    finish_reasons: Sequence[str],
    num_tokens: Sequence[int],
    max_tokens: int,
    functions: Mapping[str, RewardFn] = REWARD_FUNCTIONS,
) -> Rewards:
    """Every reward of ``weights`` for every completion, their weighted totals, and the timeout count;
    ``functions`` holds the rewards by name (the trainer passes the ones its parts were built with)."""
    unknown = sorted(set(weights) - set(functions))
    if unknown:
        raise ValueError(f"unknown reward function(s) {', '.join(unknown)}; "
                         f"allowed: {', '.join(functions)}")
    lengths = {len(completions), len(samples), len(finish_reasons), len(num_tokens)}
    if len(lengths) != 1:
        raise ValueError("compute_rewards: completions, samples, finish_reasons and num_tokens differ in "
                         f"length ({len(completions)}, {len(samples)}, {len(finish_reasons)}, {len(num_tokens)})")
    totals = [0.0] * len(completions)
    per_fn: dict[str, list[float]] = {name: [] for name in weights}
    reasons: list[dict[str, str]] = [{} for _ in completions]
    timeouts = 0
    for i, (completion, sample, finish, tokens) in enumerate(zip(completions, samples, finish_reasons, num_tokens)):
        timed_out = False
        for name, weight in weights.items():
            result = functions[name](completion, sample, finish_reason=finish, num_tokens=tokens,
                                            max_tokens=max_tokens)
            per_fn[name].append(result.value)
            reasons[i][name] = result.reason
            totals[i] += weight * result.value
            timed_out = timed_out or result.timed_out
        timeouts += timed_out
    return Rewards(totals, per_fn, reasons, timeouts)
