"""A synthetic verifiable task: integer arithmetic word problems, generated from a seed.

Small models cannot solve GSM8K at short response budgets, so a GRPO run on it shows a format lift and
no correctness signal. These problems are a task such a model partly solves (TinyZero's reason for
Countdown), on which a working GRPO loop raises accuracy within minutes: a sanity check for the loop.

Difficulty levels (``ARITH_LEVELS``, 0 to ``MAX_LEVEL``):

- Level 0: one addition of single-digit amounts ("Ava has 7 apples. Then Ava buys 5 more apples. How
  many apples does Ava have now?"), which SmolLM2-135M-Instruct partly solves. There are only 64
  distinct additions (2-9 plus 2-9), so held-out questions repeat training ones' additions under other
  names, items and verbs: a lift on level 0 measures doing the one step and stating the number, not
  new arithmetic.
- Level L >= 1: L operations after a starting amount of 3 to 30. Each adds, removes or (from level 2)
  multiplies, with small operands, and every intermediate amount stays positive, so the gold answer is
  a positive integer.

Rows cycle through the requested levels (``prepare.arith_levels``; row i has level
``levels[i % len(levels)]``), so any prefix of a split is balanced across them. The default,
``DEFAULT_LEVELS`` = (1, 2, 3), gives the rows this module always gave.

Generation is a pure function of (split, seed, index, level): ``random.Random`` seeded with a string is
stable across Python runs and platforms, so ``prepare.seed`` fixes every question. Train and test use
different streams; prepare's overlap check drops the rare train question that equals a test one.
"""
from __future__ import annotations

import random
from collections.abc import Sequence

ARITH_LEVELS = (0, 1, 2, 3)  # the one list: prepare.arith_levels is validated against it (grpo/config.py)
MAX_LEVEL = max(ARITH_LEVELS)
DEFAULT_LEVELS = (1, 2, 3)
SPLIT_ROWS = {"train": 5000, "test": 1000}  # far more than CPU runs use; prepare caps them

_NAMES = ("Ava", "Ben", "Chloe", "Dan", "Emma", "Finn", "Grace", "Hugo", "Iris", "Jack", "Lena", "Max",
          "Nora", "Omar", "Priya", "Sam", "Tara", "Umar", "Vera", "Zoe")
_ITEMS = ("apples", "marbles", "stickers", "coins", "books", "pencils", "shells", "cards", "stamps", "beads")


def _operation(rng: random.Random, amount: int, name: str, item: str, allow_multiply: bool) -> tuple[str, int]:
    """One step's sentence and the amount after it."""
    kinds = ["add", "remove", "multiply"] if allow_multiply and amount <= 30 else ["add", "remove"]
    kind = rng.choice(kinds if amount > 1 else ["add"])
    if kind == "add":
        n = rng.randint(2, 20)
        verb = rng.choice(("buys", "finds", "is given"))
        return f"Then {name} {verb} {n} more {item}.", amount + n
    if kind == "remove":
        n = rng.randint(1, amount - 1)
        verb = rng.choice(("gives away", "loses", "sells"))
        return f"Then {name} {verb} {n} {item}.", amount - n
    n = rng.randint(2, 4)
    return f"Then the number of {item} {name} has becomes {n} times as large.", amount * n


def _check_levels(levels: Sequence[int]) -> tuple[int, ...]:
    levels = tuple(levels)
    bad = [level for level in levels if level not in ARITH_LEVELS]
    if not levels or bad:
        raise ValueError(f"arithmetic levels must be a non-empty list of {', '.join(map(str, ARITH_LEVELS))}, "
                         f"got {list(levels)!r}")
    return levels


def make_problem(split: str, seed: int, index: int, levels: Sequence[int] = DEFAULT_LEVELS) -> dict:
    """Row ``index`` of ``split``: ``{"question", "answer", "level"}`` (answer an integer string), at level
    ``levels[index % len(levels)]``."""
    levels = _check_levels(levels)
    rng = random.Random(f"arith:{split}:{seed}:{index}")
    level = levels[index % len(levels)]
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    if level == 0:
        start, more = rng.randint(2, 9), rng.randint(2, 9)
        verb = rng.choice(("buys", "finds", "is given"))
        question = (f"{name} has {start} {item}. Then {name} {verb} {more} more {item}. "
                    f"How many {item} does {name} have now?")
        return {"question": question, "answer": str(start + more), "level": 0}
    amount = rng.randint(3, 30)
    sentences = [f"{name} has {amount} {item}."]
    for _ in range(level):
        sentence, amount = _operation(rng, amount, name, item, allow_multiply=level > 1)
        sentences.append(sentence)
    sentences.append(f"How many {item} does {name} have now?")
    return {"question": " ".join(sentences), "answer": str(amount), "level": level}


def generate_split(split: str, seed: int, levels: Sequence[int] = DEFAULT_LEVELS) -> list[dict]:
    """Every row of ``split`` ("train" or "test") for ``seed``, cycling through ``levels``."""
    if split not in SPLIT_ROWS:
        raise ValueError(f"unknown split {split!r} of the arithmetic task; known: {', '.join(SPLIT_ROWS)}")
    levels = _check_levels(levels)
    return [make_problem(split, seed, i, levels) for i in range(SPLIT_ROWS[split])]
