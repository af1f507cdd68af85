"""The trainer on the tiny model as a script, for torchrun: ``python -m tests.distributed.train_driver
MODEL_DIR OUT_DIR`` (alone, or as torchrun's workers). It trains tests/train/harness.py's run with the
overrides in $DRIVER_PARAMS (JSON) under OUT_DIR/run/; rank 0 records each step's rollouts (token ids and
rewards, the whole step's) in OUT_DIR/rollouts/step-N.json, and every rank writes its LoRA weights to
OUT_DIR/weights-rank-R.pt at the end, so a test can see that the ranks hold the same model."""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import torch

from grpo import distributed
from grpo.model.lora import lora_parameters
from grpo.train.loop import Trainer, TrainPaths, fingerprint
from grpo.train.parts import build_parts
from grpo.verify.rewards import REWARD_FUNCTIONS
from tests.train.harness import ROWS, STYLE, digit_share, params


class RecordingTrainer(Trainer):
    """Rank 0 writes each step's rollouts (the whole step's token ids and rewards) to ``out``/rollouts."""

    out: Path

    def train_step(self, prompts):
        metrics, rollouts, reasons = super().train_step(prompts)
        if distributed.is_main():
            record = {"ids": [r["id"] for r in rollouts.samples], "tokens": [c.token_ids for c in rollouts.completions],
                      "rewards": [digit_share(text, row).value for text, row in zip(rollouts.responses, rollouts.samples)], "reward_mean": metrics["reward_mean"]}
            (self.out / "rollouts").mkdir(parents=True, exist_ok=True)
            (self.out / "rollouts" / f"step-{self.step}.json").write_text(json.dumps(record))
        return metrics, rollouts, reasons


def main(model_dir: Path, out: Path) -> None:
    logging.basicConfig(level=logging.INFO)  # the test reads "resumed from" in the log
    distributed.init_from_env()
    p = params(**json.loads(os.environ.get("DRIVER_PARAMS", "{}")))
    paths = TrainPaths(model_dir, out / "run" / "checkpoints", out / "run" / "final", out / "run" / "metrics",
                       out / "run" / "logs" / "train.json")
    parts = build_parts(p, STYLE, paths.base_model, paths.live, paths.measured, [row["id"] for row in ROWS], None,
                        reward_functions={**REWARD_FUNCTIONS, "digit_share": digit_share})
    trainer = RecordingTrainer(p, STYLE, paths, ROWS, ROWS[:3], parts, fingerprint(p, STYLE, []))
    trainer.out = out
    trainer.run()
    weights = {f"{i}": t.detach().clone() for i, t in enumerate(lora_parameters(trainer.model))}
    torch.save(weights, out / f"weights-rank-{distributed.rank()}.pt")
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
