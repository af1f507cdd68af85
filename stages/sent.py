"""DVC stage sent: semantic-entropy scoring of the training questions and the curriculum it orders.

Reads models/base/ and data/prepared/train.jsonl. Writes data/sent/ (scores.jsonl, curriculum.json,
entropy_hist.png) and metrics/sent.json (its timings: logs/sent.json, untracked); with sent.enabled false, an empty scores.jsonl, no
curriculum.json (the train stage then trains without a curriculum) and {"enabled": false}.
data/sent_progress/progress.json (a persist out) lets a rerun after a kill continue where it stopped.
With sent.num_processes (and nnodes) above 1 the stage runs under torchrun (grpo/launch.py): each
process scores its share of the question batches, and rank 0 writes the same files one process writes.
Run from the project root: python -m stages.sent [--params params.yaml]
"""
from pathlib import Path

from grpo import distributed
from grpo.cli import run_stage
from grpo.io import read_jsonl
from grpo.measured import SENT as MEASURED
from grpo.measured import write_log
from grpo.model.loading import load_tokenizer
from grpo.prompts import PromptStyle
from grpo.rollout.base import SamplingParams
from grpo.rollout.engines import make_engine, resolve_dtype_name, resolve_engine_kind
from grpo.sent.curriculum import build_curriculum
from grpo.sent.outputs import measured_figures, write_disabled, write_outputs
from grpo.sent.scoring import max_sequence_length, scorer_fingerprint, score_questions

BASE = Path("models/base")
TRAIN = Path("data/prepared/train.jsonl")
OUT = Path("data/sent")
PROGRESS = Path("data/sent_progress/progress.json")
METRICS = Path("metrics/sent.json")


def main(params, args) -> None:
    s, pr = params["sent"], params["prompt"]
    PROGRESS.parent.mkdir(parents=True, exist_ok=True)  # a declared out, even before the first save
    if not s.enabled:
        if distributed.is_main():
            write_disabled(OUT, METRICS)
        return
    rows = read_jsonl(TRAIN)
    if not rows:
        raise ValueError(f"{TRAIN} has no questions to score")
    style = PromptStyle.from_params(pr)
    sampling = SamplingParams(n=s.M, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                              max_new_tokens=s.max_new_tokens, seed=s.seed)
    kind, dtype = resolve_engine_kind(s.engine), resolve_dtype_name(s.dtype)
    tokenizer = load_tokenizer(BASE)
    # native: one question batch (batch_size questions × M samples) is one generate() batch
    engine = make_engine(kind, model_dir=BASE, dtype=dtype, batch_size=s.batch_size * s.M, seed=s.seed,
                         max_model_len=max_sequence_length(tokenizer, rows, style, s.max_new_tokens))
    try:
        run = score_questions(engine, tokenizer, rows, style, sampling, batch_size=s.batch_size,
                              progress_path=PROGRESS, save_every=s.save_every,
                              fingerprint=scorer_fingerprint(BASE, f"{kind}/{dtype}"), no_answer_cluster=s.no_answer_cluster)
    finally:
        engine.close()
    if not distributed.is_main():
        return  # every rank holds the gathered scores; rank 0 writes them
    curriculum = build_curriculum(run.scores, s.num_stages, drop_all_correct=s.drop_all_correct,
                                  drop_all_wrong=s.drop_all_wrong, seed=s.seed, order=s.order)
    write_outputs(OUT, METRICS, run, curriculum, engine=kind, M=s.M)
    write_log(MEASURED, measured_figures(run))


if __name__ == "__main__":
    run_stage("sent", ["sent", "prompt"], main)
