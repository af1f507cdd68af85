"""A synthetic verifiable task: multi-step integer arithmetic word problems, generated from a seed.

Small models cannot solve GSM8K at short response budgets, so a GRPO run on it shows a format lift and
no correctness signal. These problems are a task such a model partly solves (TinyZero's reason for
Countdown), on which a working GRPO loop raises accuracy within minutes: a sanity check for the loop.

Difficulty level L (1 to ``MAX_LEVEL``) is the number of operations after the starting amount. Each
operation adds, removes or (from level 2) multiplies, with small operands, and every intermediate
amount stays positive, so the gold answer is a positive integer. Rows interleave the levels (row i has
level 1 + i mod MAX_LEVEL), so any prefix of a split is balanced across levels.

Generation is a pure function of (split, seed, index): ``random.Random`` seeded with a string is
stable across Python runs and platforms, so ``prepare.seed`` fixes every question. Train and test use
different streams; prepare's overlap check drops the rare train question that equals a test one.
"""
from __future__ import annotations

import random

MAX_LEVEL = 3
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


def make_problem(split: str, seed: int, index: int) -> dict:
    """Row ``index`` of ``split``: ``{"question", "answer", "level"}`` (answer an integer string)."""
    rng = random.Random(f"arith:{split}:{seed}:{index}")
    level = 1 + index % MAX_LEVEL
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    amount = rng.randint(3, 30)
    sentences = [f"{name} has {amount} {item}."]
    for _ in range(level):
        sentence, amount = _operation(rng, amount, name, item, allow_multiply=level > 1)
        sentences.append(sentence)
    sentences.append(f"How many {item} does {name} have now?")
    return {"question": " ".join(sentences), "answer": str(amount), "level": level}


def generate_split(split: str, seed: int) -> list[dict]:
    """Every row of ``split`` ("train" or "test") for ``seed``."""
    if split not in SPLIT_ROWS:
        raise ValueError(f"unknown split {split!r} of the arithmetic task; known: {', '.join(SPLIT_ROWS)}")
    return [make_problem(split, seed, i) for i in range(SPLIT_ROWS[split])]
