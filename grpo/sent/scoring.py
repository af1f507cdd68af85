"""The SENT scoring run: sample M answers per training question with the exact training prompt, score
each question (grpo.sent.entropy), and survive a kill.

Resume contract: a rerun after a kill continues from the progress file and ends with the same scores
as an uninterrupted run. That holds because nothing a question's samples depend on moves with the
restart point: batch k is always questions [k*B, (k+1)*B), its sampling seed derives from (seed, k*B),
and the progress file only ever holds whole batches. The file carries a fingerprint of everything
that shapes the scores (the caller's model/engine identity, the questions, prompt style, sampling,
batch size), so progress left by other params or data is discarded, never mixed in. Under torchrun the
processes take the batches in turns and gather each round's scores, so the scores and the progress file
are the single-process ones, and a run may resume on another number of processes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from grpo import distributed
from grpo.fault_injection import kill_point
from grpo.io import atomic_write_json, round_floats
from grpo.prompts import PromptStyle, build_prompt, full_response
from grpo.rollout.base import GenerationEngine, SamplingParams, encode_prompts
from grpo.sent.entropy import Sample, score_question

log = logging.getLogger(__name__)

PROGRESS_VERSION = 1
PACKAGE = Path(__file__).resolve().parents[1]
# The code that turns a prompt into a score: a change here must not reuse scores made before it.
SCORING_CODE = ("prompts.py", "rollout", "verify", "sent/entropy.py", "sent/scoring.py")


@dataclass(frozen=True)
class ScoringRun:
    """The scores in question order. ``generated_tokens`` counts the whole run, resumed pieces included;
    the timings count this process only: they are measured figures (grpo/measured.py), kept out of the
    progress file, which is a DVC output and must not change when a rerun is slower."""

    scores: list[dict]
    time_s: float  # generation + answer verification, in this process
    generate_s: float  # generation alone, in this process: the denominator of tokens/s
    generated_tokens: int
    resumed: int  # questions taken from the progress file rather than sampled in this process

    generated_here: int = 0  # tokens generated in this process: the numerator of tokens/s

    @property
    def tokens_per_s(self) -> float:
        return self.generated_here / self.generate_s if self.generate_s > 0 else 0.0


def _hash_files(digest, root: Path, paths: list[Path]) -> None:
    for path in paths:
        digest.update(str(path.relative_to(root)).encode())
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)


def scorer_fingerprint(model_dir: Path, engine_kind: str) -> str:
    """Identity of what samples and scores: every file of the model folder (weights included: a local
    model rewritten in place keeps its path), the engine kind (vLLM and native draw different
    samples) and the scoring code."""
    digest = hashlib.sha256(engine_kind.encode())
    _hash_files(digest, model_dir, sorted(p for p in Path(model_dir).rglob("*") if p.is_file()))
    code = [PACKAGE / name for name in SCORING_CODE]
    _hash_files(digest, PACKAGE, sorted(f for p in code for f in ([p] if p.is_file() else p.rglob("*.py"))))
    return digest.hexdigest()[:16]


def max_sequence_length(tokenizer, rows: Sequence[dict], style: PromptStyle, max_new_tokens: int) -> int:
    """Longest prompt plus the response budget: what vLLM must be able to hold (its default context
    may exceed a small model's position embeddings, which vLLM rejects)."""
    prompts = [build_prompt(tokenizer, row["question"], style) for row in rows]
    return max(len(ids) for ids in encode_prompts(tokenizer, prompts)) + max_new_tokens


def run_fingerprint(fingerprint: str, rows: Sequence[dict], style: PromptStyle, sampling: SamplingParams,
                    batch_size: int, no_answer_cluster: bool) -> str:
    """The caller's fingerprint (model and engine) folded with every argument that shapes the scores."""
    questions = [[r["id"], r["question"], r["answer"], r["answer_type"]] for r in rows]
    payload = [PROGRESS_VERSION, fingerprint, questions, dataclasses.asdict(style),
               dataclasses.asdict(sampling), batch_size, no_answer_cluster]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def batch_seed(seed: int, first_question: int) -> int:
    """The sampling seed of the batch that starts at ``first_question``: a function of the run's seed
    and the batch's position only, so a resumed run draws exactly what an uninterrupted one would."""
    digest = hashlib.sha256(f"sent-{seed}-{first_question}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _load_progress(path: Path, key: str) -> dict:
    empty = {"scores": [], "generated_tokens": 0}
    if not path.is_file():
        return empty
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        # writes are atomic, so a broken file was edited by hand or by something else: start over
        log.warning("%s is not valid JSON; ignoring it and scoring from the start", path)
        return empty
    if saved.get("fingerprint") != key:
        log.info("%s was written with other params or inputs; scoring from the start", path)
        return empty
    return {k: saved[k] for k in empty}


def score_questions(engine: GenerationEngine, tokenizer, rows: Sequence[dict], style: PromptStyle, sampling: SamplingParams, *,
                    batch_size: int, progress_path: Path, save_every: int, fingerprint: str,
                    no_answer_cluster: bool) -> ScoringRun:
    """Score ``rows`` (prepared dataset rows) with ``sampling.n`` samples each, ``batch_size`` questions
    per ``engine.generate`` call, saving progress atomically at the first batch end after every
    ``save_every`` questions and at the end. ``fingerprint`` identifies the model and engine."""
    key = run_fingerprint(fingerprint, rows, style, sampling, batch_size, no_answer_cluster)
    state = _load_progress(progress_path, key)
    resumed = saved = len(state["scores"])
    clock = {"time_s": 0.0, "generate_s": 0.0, "generated_tokens": 0}  # this process's figures
    if resumed:
        log.info("resuming from %s: %d of %d questions already scored", progress_path, resumed, len(rows))
    starts = list(range(resumed, len(rows), batch_size))
    world = distributed.world_size()
    # Processes take consecutive batches in rounds (batch seeds follow the batch's position, never
    # the process), then every process appends the round's scores in batch order: the same scores, the
    # same progress file, as one process makes; only rank 0 writes it.
    for first in range(0, len(starts), world):
        round_starts = starts[first:first + world]
        mine = round_starts[distributed.rank()] if distributed.rank() < len(round_starts) else None
        scored: list[dict] = []
        tokens = 0
        if mine is not None:
            batch = rows[mine : mine + batch_size]
            t0 = time.perf_counter()
            prompts = [build_prompt(tokenizer, row["question"], style) for row in batch]
            outputs = engine.generate(prompts, dataclasses.replace(sampling, seed=batch_seed(sampling.seed, mine)))
            t1 = time.perf_counter()
            for row, completions in zip(batch, outputs, strict=True):
                samples = [Sample(full_response(style, c.text), c.finish_reason, len(c.token_ids)) for c in completions]
                scored.append(score_question(row, samples, no_answer_cluster=no_answer_cluster))
                tokens += sum(s.num_tokens for s in samples)
            clock["generated_tokens"] += tokens
            clock["generate_s"] += t1 - t0
            clock["time_s"] += time.perf_counter() - t0
        for part_scores, part_tokens in distributed.gather((scored, tokens)):
            state["scores"].extend(part_scores)
            state["generated_tokens"] += part_tokens
        done = min(len(rows), round_starts[-1] + batch_size)
        if done - saved >= save_every or done == len(rows):
            # The file stores floats rounded; rounding the state too keeps a resumed run's scores
            # identical to an uninterrupted run's (the last batch always saves).
            state = round_floats(state)
            if distributed.is_main():
                atomic_write_json(progress_path, {"version": PROGRESS_VERSION, "fingerprint": key, **state})
            saved = done
        kill_point("sent.batch")
        log.info("scored %d/%d questions (%.0f generated tokens/s)", done, len(rows),
                 clock["generated_tokens"] / max(clock["generate_s"], 1e-9))
    return ScoringRun(state["scores"], clock["time_s"], clock["generate_s"], state["generated_tokens"], resumed,
                      clock["generated_tokens"])
