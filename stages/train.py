"""DVC stage train: the native GRPO loop (4-bit base, LoRA) with checkpoints, resume and validation.

Reads models/base/, data/prepared/{train,val}.jsonl and, when SENT ran and train.curriculum.use_sent
is on, data/sent/curriculum.json. Writes models/checkpoints/ (persist), models/final/ and the DVCLive
log metrics/train/ (grpo/trainlog.py); timings go to logs/train.json (untracked). Rerunning after a
crash resumes from the newest complete checkpoint. With train.num_processes (and nnodes) above 1 the
stage runs under torchrun as data-parallel ranks (grpo/train/data_parallel.py); rank 0 writes.
Run from the project root: python -m stages.train [--params params.yaml]
"""
from pathlib import Path

from grpo.cli import run_stage
from grpo.io import read_jsonl
from grpo.lineage import ROOT, closure
from grpo.measured import TRAIN as MEASURED
from grpo.prompts import PromptStyle
from grpo.sent.curriculum import load_curriculum
from grpo.train.loop import Trainer, TrainPaths, fingerprint
from grpo.train.parts import build_parts
from grpo.trainlog import LIVE_DIR

PREPARED = Path("data/prepared")
CURRICULUM = Path("data/sent/curriculum.json")
PATHS = TrainPaths(base_model=Path("models/base"), checkpoints=Path("models/checkpoints"),
                   final=Path("models/final"), live=LIVE_DIR, measured=MEASURED)


def code_files(root: Path = ROOT) -> list[Path]:
    """The code this stage runs (its import closure: the files dvc.yaml lists as its code deps). They are
    part of the run's fingerprint: after a code change DVC reruns the stage, and resuming the old code's
    checkpoints would record their adapter against the new code in dvc.lock."""
    return sorted(root / path for path in closure(root, "stages.train"))


def main(params, args) -> None:
    p, pr = params["train"], params["prompt"]
    style = PromptStyle.from_params(pr)
    train_rows = read_jsonl(PREPARED / "train.jsonl")
    val_rows = read_jsonl(PREPARED / "val.jsonl")
    stages = None
    if p.curriculum.use_sent and CURRICULUM.exists():
        stages = load_curriculum(CURRICULUM, {row["id"] for row in train_rows})
    inputs = [PREPARED / "train.jsonl", PREPARED / "val.jsonl", PATHS.base_model / "MODEL_INFO.json"]
    if stages is not None:
        inputs.append(CURRICULUM)
    parts = build_parts(p, style, PATHS.base_model, PATHS.live, PATHS.measured, [row["id"] for row in train_rows], stages)
    trainer = Trainer(p, style, PATHS, train_rows, val_rows, parts, fingerprint(p, style, inputs + code_files()))
    trainer.run()


if __name__ == "__main__":
    run_stage("train", ["train", "prompt"], main)
