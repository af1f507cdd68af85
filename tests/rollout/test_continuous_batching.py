"""Continuous batching in the static decoder (grpo.rollout.static_decode with grpo.rollout.slots) against
HF ``generate`` on the tiny fp32 model (CPU, the eager decode step): fewer slots than rows, prompts of
mixed lengths, rows that stop at different steps (by stop id and by per-row limits), tiny cache buckets
and frequent syncs, so slots are refilled mid-run and the length bucket moves both ways. Rerun under
Triton's interpreter with the decode-attention kernel a GPU uses, which reads each slot's cache up to
its own cursor (a refilled slot's stale entries must stay masked)."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo.prompts import PromptStyle, build_prompt
from grpo.rollout.base import SamplingParams
from grpo.rollout.native import NativeEngine
from grpo.rollout.slots import SlotSchedule
from grpo.rollout.static_decode import StaticDecoder
from tests.kernels.interpreter import run_under_interpreter

QUESTIONS = ["2 + 2?", "What is 15 + 27?", "Natalia sold clips to 48 of her friends in April. How many?",
             "7 * 8?", "What is 3 + 4? Then add 5 and tell me the result.", "1 + 1 = ?"]
MAX_NEW = 14


def test_every_test_again_with_the_triton_attention():
    run_under_interpreter(__file__, passed=7)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[str]:
    texts = [build_prompt(tokenizer, q, PromptStyle("r1")) for q in QUESTIONS]
    assert len({len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts}) >= 4
    return texts


def ids(engine: NativeEngine, prompts: list[str], params: SamplingParams):
    return [[(c.token_ids, c.finish_reason) for c in group] for group in engine.generate(prompts, params)]


def small_decoder(model) -> StaticDecoder:
    return StaticDecoder(model, bucket=4, sync_every=3)  # many buckets, many syncs


@pytest.fixture(scope="module")
def stop_ids(model, tokenizer, prompts) -> list[int]:
    """Stop ids that end greedy rows at different steps: the tokens rows 0, 2 and 4 emit at steps 2, 6
    and 10 (without them the tiny model runs every row to the limit). A row stops at the first of
    them it emits, wherever that is; the tests check that the stop points really are mixed."""
    free = NativeEngine(model, tokenizer, batch_size=8, backend="hf")
    rows = [g[0][0] for g in ids(free, prompts, SamplingParams(temperature=0, max_new_tokens=MAX_NEW))]
    return free.stop_ids + [rows[row][step] for row, step in ((0, 2), (2, 6), (4, 10))]


def engines(model, tokenizer, stop_ids, slots: int):
    hf = NativeEngine(model, tokenizer, batch_size=len(QUESTIONS), backend="hf")
    fast = NativeEngine(model, tokenizer, batch_size=slots, backend="static", decoder=small_decoder(model))
    hf.stop_ids = fast.stop_ids = stop_ids
    return hf, fast


@pytest.mark.parametrize("slots", [1, 2, 4])
def test_greedy_equals_generate_with_fewer_slots_than_rows(model, tokenizer, prompts, stop_ids, slots):
    hf, fast = engines(model, tokenizer, stop_ids, slots)
    params = SamplingParams(n=2, temperature=0, max_new_tokens=MAX_NEW)
    expected = ids(hf, prompts, params)
    lengths = {len(t) for group in expected for t, _ in group}
    assert len(lengths) >= 3 and {r for g in expected for _, r in g} == {"stop", "length"}  # mixed stop points
    assert ids(fast, prompts, params) == expected


def test_sampled_rows_equal_generate_and_do_not_depend_on_slots(model, tokenizer, prompts, stop_ids):
    """The keyed noise makes a row's draw independent of its slot and neighbours, and the generate path
    adds the same noise to (nearly) the same logits: every path draws the same tokens."""
    params = SamplingParams(n=3, temperature=1.0, top_p=0.95, top_k=40, max_new_tokens=MAX_NEW, seed=5)
    hf, _ = engines(model, tokenizer, stop_ids, 1)
    expected = ids(hf, prompts, params)
    assert len({tuple(t) for t, _ in expected[1]}) > 1  # samples of one prompt differ
    for slots in (1, 3, 18):
        _, fast = engines(model, tokenizer, stop_ids, slots)
        assert ids(fast, prompts, params) == expected
    hf_small = NativeEngine(model, tokenizer, batch_size=4, backend="hf")  # batches cut across groups
    hf_small.stop_ids = stop_ids
    assert ids(hf_small, prompts, params) == expected


@pytest.mark.parametrize("refill", [True, False])
def test_per_row_limits_equal_generate_truncated(model, tokenizer, prompts, refill):
    """Rows end by length at different steps; refill off is plain static batching in waves."""
    rows = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    limits = [3, MAX_NEW, 1, 7, 11, 5]
    hf = NativeEngine(model, tokenizer, batch_size=8, backend="hf")
    full = [g[0].token_ids for g in hf.generate(prompts, SamplingParams(temperature=0, max_new_tokens=MAX_NEW))]
    finished_order = []
    got = small_decoder(model).generate(rows, max_new_tokens=limits, stop_ids=hf.stop_ids, pad_id=hf.pad_id,
                                        temperature=0, slots=2, refill=refill,
                                        on_done=lambda row, new: finished_order.append(row))
    assert got == [f[:n] for f, n in zip(full, limits)]
    assert sorted(finished_order) == list(range(len(rows)))
    if refill:  # row 1 (14 tokens) holds one slot while rows 2 and 3 pass through the other
        assert finished_order == [0, 2, 3, 1, 5, 4]
    else:  # waves of two: each waits for its longest row
        assert finished_order == [0, 1, 2, 3, 5, 4]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (the eager step is tested above)")
def test_cuda_graphs_with_continuous_batching_equal_generate(tiny_model_dir, tokenizer, prompts, stop_ids):
    """The captured path: graphs captured per length bucket on first use, slots refilled between replays."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda().eval()
    hf, fast = engines(model, tokenizer, stop_ids, 2)
    assert fast._decoder.cuda_graphs
    for params in (SamplingParams(n=2, temperature=0, max_new_tokens=MAX_NEW),
                   SamplingParams(n=3, temperature=1.0, top_p=0.95, max_new_tokens=MAX_NEW, seed=5)):
        assert ids(fast, prompts, params) == ids(hf, prompts, params)


def test_schedule_admits_in_order_and_syncs_at_length_ends():
    schedule = SlotSchedule([5, 9, 3, 4], [4, 10, 2, 6], 2, refill=True, sync_every=8, bucket=4, cache_len=20)
    wave = schedule.admit()
    assert (wave.slots, wave.rows, wave.width) == ([0, 1], [0, 1], 9)
    assert schedule.admit() is None  # no free slot
    assert schedule.next_sync() == 3  # row 0: limit 4 -> its 4th token is emitted by decode step 3
    assert schedule.length() == 12  # width 9 + 1, rounded up to the bucket
    schedule.step = 3
    assert schedule.length() == 16  # cursor 9 + 3 -> attends over 13 entries
    assert schedule.retire(0) == 0
    wave = schedule.admit()
    assert (wave.slots, wave.rows, wave.width) == ([0], [2], 3)
    assert schedule.next_sync() == 4  # row 2: prefilled at step 3, limit 2
    static = SlotSchedule([5, 9, 3], [4, 10, 2], 2, refill=False, sync_every=8, bucket=4, cache_len=20)
    static.admit()
    static.retire(0)
    assert static.admit() is None  # refill off: waits until every slot is free
    static.retire(1)
    assert static.admit().rows == [2] and not static.done()
