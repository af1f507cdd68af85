"""The trainer in-process on a tiny random Qwen2 in real bitsandbytes 4-bit on CPU, with a reward that
varies between random completions: shared by the trainer tests and the fault suite."""
from __future__ import annotations

import dataclasses

import torch
from safetensors.torch import load_file

from grpo.config import parse_section
from grpo.prompts import PromptStyle
from grpo.train.loop import Trainer, TrainPaths, fingerprint
from grpo.train.parts import build_parts
from grpo.verify.rewards import REWARD_FUNCTIONS, RewardResult

STYLE = PromptStyle("tagged")
ROWS = [{"id": f"q{i}", "source": "t", "question": f"What is {i} + {i}?", "answer": str(2 * i),
         "answer_type": "integer", "meta": {}} for i in range(8)]


def digit_share(completion: str, sample: dict, **_) -> RewardResult:
    """A test reward that varies between random completions, so groups have non-zero advantages; the
    harness passes it to ``build_parts`` with the registered ones."""
    return RewardResult(sum(ch.isdigit() for ch in completion) / max(1, len(completion)), "digit share")


def params(**overrides):
    base = parse_section("train", {
        "max_steps": 3, "prompts_per_step": 2, "group_size": 3, "max_response_length": 8,
        "save_every": 1, "val_every": 2, "val_max_new_tokens": 4, "train_batch_size": 6,
        "generation_batch_size": 6, "keep_last": 1, "num_iterations": 2, "beta": 0.05, "lr": 1e-2,
        "compute_dtype": "float32",  # the tests compare runs to 1e-5: fp32 on every CPU kind
    })
    return dataclasses.replace(base, rewards={"digit_share": 1.0}, **overrides)


def run(tmp_path, tiny_model_dir, p, name: str, trainer_class: type[Trainer] = Trainer) -> Trainer:
    paths = TrainPaths(tiny_model_dir, tmp_path / name / "checkpoints", tmp_path / name / "final",
                       tmp_path / name / "metrics", tmp_path / name / "logs" / "train.json")
    parts = build_parts(p, STYLE, paths.base_model, paths.live, paths.measured, [row["id"] for row in ROWS], None,
                        reward_functions={**REWARD_FUNCTIONS, "digit_share": digit_share})
    trainer = trainer_class(p, STYLE, paths, ROWS, ROWS[:2], parts, fingerprint(p, STYLE, []))
    trainer.run()
    return trainer


def killed_at(step: int) -> type[Trainer]:
    """A Trainer whose ``step``-th step (counted in this run) raises, like a kill after the previous
    checkpoint."""

    class Killed(Trainer):
        calls = 0

        def train_step(self, prompts):
            self.calls += 1
            if self.calls == step:
                raise KeyboardInterrupt(f"simulated kill at step {step}")
            return super().train_step(prompts)

    return Killed


class RecordingTrainer(Trainer):
    """Records the sampled token ids of every step's rollouts in ``rollouts`` (one list per step)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rollouts: list[list[list[int]]] = []

    def train_step(self, prompts):
        metrics, rollouts, reasons = super().train_step(prompts)
        self.rollouts.append([c.token_ids for c in rollouts.completions])
        return metrics, rollouts, reasons


def final_weights(tmp_path, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(tmp_path / name / "final" / "adapter_model.safetensors"))
