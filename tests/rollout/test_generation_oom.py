"""Out of memory in generation (grpo.rollout.native): the engine frees memory, halves the rows in flight,
redoes only the rows that had not finished, and returns exactly an unfaulted run's outputs, on both
the ``generate`` and the static path. The errors come from the fault hook (``GRPO_FAULT_OOM`` phase
``generate``, grpo/fault_injection.py): CPU cannot raise CUDA's, and the hook's InjectedOOM is a
torch.OutOfMemoryError like it."""
from __future__ import annotations

import pytest
import torch

from grpo.prompts import PromptStyle, build_prompt
from grpo.rollout.base import SamplingParams
from grpo.rollout.native import NativeEngine
from grpo.fault_injection import FaultHook

QUESTIONS = ["What is 15 + 27?", "2 + 2?", "Natalia sold clips to 48 of her friends in April. How many?"]
PARAMS = SamplingParams(n=3, temperature=1.0, top_p=0.95, max_new_tokens=10, seed=4)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[str]:
    return [build_prompt(tokenizer, q, PromptStyle("tagged")) for q in QUESTIONS]


def token_ids(groups) -> list[list[list[int]]]:
    return [[c.token_ids for c in group] for group in groups]


def attempts(engine: NativeEngine) -> list[tuple[int, int]]:
    """Record (rows, rows in flight) of each attempt the engine makes."""
    seen, run = [], engine._run

    def spy(decoder, rows, keys, params, in_flight, finish):
        seen.append((len(rows), in_flight))
        return run(decoder, rows, keys, params, in_flight, finish)

    engine._run = spy
    return seen


@pytest.mark.parametrize("backend", ["hf", "static"])
def test_oom_redoes_only_unfinished_rows_and_changes_nothing(model, tokenizer, prompts, backend):
    expected = token_ids(NativeEngine(model, tokenizer, batch_size=4, backend=backend).generate(prompts, PARAMS))
    # call 1 of the phase: the second batch (generate) or the second prefill (static, once the first
    # four rows have ended), so four rows are done when it fails
    engine = NativeEngine(model, tokenizer, batch_size=4, backend=backend, fault_hook=FaultHook("generate:1"))
    seen = attempts(engine)
    assert token_ids(engine.generate(prompts, PARAMS)) == expected
    assert seen == [(9, 4), (5, 2)]
    assert engine.size.oom_events == 1 and engine.size.current == 2
    # the next call starts at the shrunk size; clean calls grow it back (grow_after 4)
    for _ in range(4):
        assert token_ids(engine.generate(prompts, PARAMS)) == expected
    assert engine.size.current == 4


def test_oom_halves_what_the_memory_budget_let_in(model, tokenizer, prompts):
    budgets = []

    def two_slots(prompt_tokens: int, params: SamplingParams) -> int:
        budgets.append((prompt_tokens, params))
        return 2

    expected = token_ids(NativeEngine(model, tokenizer, batch_size=8, backend="static").generate(prompts, PARAMS))
    engine = NativeEngine(model, tokenizer, batch_size=8, backend="static", max_slots_for=two_slots,
                          fault_hook=FaultHook("generate:size>1"))
    seen = attempts(engine)
    assert token_ids(engine.generate(prompts, PARAMS)) == expected
    assert seen == [(9, 2), (9, 1)]  # the budget's 2, not the size's 8, is what halves
    longest = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    assert budgets[0] == (longest, PARAMS)


def test_oom_with_one_row_in_flight_is_a_clear_error(model, tokenizer, prompts):
    engine = NativeEngine(model, tokenizer, batch_size=2, backend="static", fault_hook=FaultHook("generate:all"))
    with pytest.raises(torch.OutOfMemoryError, match="generate at micro-batch size 1; lower max_new_tokens"):
        engine.generate(prompts, PARAMS)


def test_the_fault_hook_is_read_from_the_environment(model, tokenizer, prompts, monkeypatch):
    monkeypatch.setenv("GRPO_FAULT_OOM", "generate:0")
    engine = NativeEngine(model, tokenizer, batch_size=4)
    groups = engine.generate(prompts, PARAMS)
    assert engine.size.oom_events == 1 and [len(g) for g in groups] == [3, 3, 3]
