"""Seconds per GRPO step on this CPU for the choices the CPU default makes: quantisation, compute dtype,
gradient checkpointing and the training micro-batch, each with the default's step shape otherwise.

Real SmolLM2-135M-Instruct weights from models/base (`python -m stages.base_model` first) and the
prepared GSM8K training split (`python -m stages.prepare`); the real Trainer (grpo/train/loop.py) runs
``--steps`` steps per case in a temp folder, without validation or curriculum. The first step of each
case includes the dense-copy build and warm-up, so the table reports the mean of the later steps.

Run from the project root:
    .venv/bin/python bench/train_step_cpu.py [--steps 3] [--cases nf4-fp32 none-fp32 ...]
Prints a markdown table and writes bench/results/train_step_cpu.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo.config import load_params  # noqa: E402
from grpo.hardware import describe_cpu  # noqa: E402
from grpo.io import read_jsonl  # noqa: E402
from grpo.prompts import PromptStyle  # noqa: E402
from grpo.train.loop import Trainer, TrainPaths  # noqa: E402
from grpo.train.parts import build_parts  # noqa: E402

# name -> train params changed from params.yaml
CASES = {
    "nf4-bf16": {"quantization": "nf4", "compute_dtype": "bfloat16"},
    "nf4-fp32": {"quantization": "nf4", "compute_dtype": "float32"},
    "nf4-bf16-dense": {"quantization": "nf4", "compute_dtype": "bfloat16", "dense_training": True},
    "nf4-fp32-dense": {"quantization": "nf4", "compute_dtype": "float32", "dense_training": True},
    "nf4-bf16-compiled": {"quantization": "nf4", "compute_dtype": "bfloat16", "compile_layers": True},
    "nf4-fp32-compiled": {"quantization": "nf4", "compute_dtype": "float32", "compile_layers": True},
    "nf4-fp32-nockpt": {"quantization": "nf4", "compute_dtype": "float32", "gradient_checkpointing": False},
    "nf4-fp32-nockpt-mb16": {"quantization": "nf4", "compute_dtype": "float32", "gradient_checkpointing": False,
                             "train_batch_size": 16},
    "none-fp32": {"quantization": "none", "compute_dtype": "float32"},
    "none-fp32-nockpt-mb16": {"quantization": "none", "compute_dtype": "float32", "gradient_checkpointing": False,
                              "train_batch_size": 16},
}


def run_case(name: str, steps: int, params, style: PromptStyle, rows: list[dict]) -> dict:
    p = dataclasses.replace(params, max_steps=steps, val_every=10**6, save_every=10**6, log_completions_every=10**6,
                            **CASES[name])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths = TrainPaths(base_model=ROOT / "models" / "base", checkpoints=tmp / "ckpt", final=tmp / "final",
                           live=tmp / "metrics", measured=tmp / "logs" / "train.json")
        t0 = time.perf_counter()
        parts = build_parts(p, style, paths.base_model, paths.live, paths.measured, [r["id"] for r in rows], None)
        trainer = Trainer(p, style, paths, rows, rows[:1], parts, f"bench-{name}")
        trainer.run()
        total = time.perf_counter() - t0
        # each step's results with its timings (measured figures, which the history does not hold)
        steps = [{**h, **m} for h, m in zip(trainer.history, trainer.tracker.measured)]
        later = steps[1:] or steps
    mean = lambda key: sum(s[key] for s in later) / len(later)  # noqa: E731
    return {"case": name, **CASES[name], "steps": steps, "total_s": round(total, 1),
            "step_s": round(mean("time_generate_s") + mean("time_train_s"), 1),
            "generate_s": round(mean("time_generate_s"), 1), "train_s": round(mean("time_train_s"), 1),
            "response_length_mean": round(mean("response_length_mean"), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "train_step_cpu.json")
    args = parser.parse_args()
    params = load_params(ROOT / "params.yaml", ["train", "prompt"])
    pr = params["prompt"]
    style = PromptStyle.from_params(pr)
    rows = read_jsonl(ROOT / "data" / "prepared" / "train.jsonl")
    results = [run_case(name, args.steps, params["train"], style, rows) for name in args.cases]
    record = {"machine": describe_cpu(), "command": "python " + " ".join(sys.argv), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(record["machine"])
    cols = ["case", "step_s", "generate_s", "train_s", "response_length_mean", "total_s"]
    print("| " + " | ".join(cols) + " |\n|" + " --- |" * len(cols))
    for r in results:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
