"""The GRPO loop end to end on a tiny random Qwen2 in real bitsandbytes 4-bit on CPU: it learns only
LoRA weights, writes resumable checkpoints, resumes to the same adapter, and an OOM storm does not
change the result."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from grpo.config import parse_section
from grpo.prompts import PromptStyle
from grpo.train import loop as loop_module
from grpo.train.checkpoint import list_checkpoints
from grpo.train.loop import Trainer, TrainPaths, fingerprint
from grpo.verify import rewards as rewards_module
from grpo.verify.rewards import RewardResult

STYLE = PromptStyle("tagged")
ROWS = [{"id": f"q{i}", "source": "t", "question": f"What is {i} + {i}?", "answer": str(2 * i),
         "answer_type": "integer", "meta": {}} for i in range(8)]


def digit_share(completion: str, sample: dict, **_) -> RewardResult:
    """A test reward that varies between random completions, so groups have non-zero advantages."""
    return RewardResult(sum(ch.isdigit() for ch in completion) / max(1, len(completion)), "digit share")


@pytest.fixture(autouse=True)
def varied_reward(monkeypatch):
    monkeypatch.setitem(rewards_module.REWARD_FUNCTIONS, "digit_share", digit_share)


def params(**overrides):
    base = parse_section("train", {
        "max_steps": 3, "prompts_per_step": 2, "group_size": 3, "max_response_length": 8,
        "save_every": 1, "val_every": 2, "val_max_new_tokens": 4, "train_batch_size": 6,
        "generation_batch_size": 6, "keep_last": 1, "num_iterations": 2, "beta": 0.05, "lr": 1e-2,
    })
    return dataclasses.replace(base, rewards={"digit_share": 1.0}, **overrides)


def run(tmp_path, tiny_model_dir, p, name: str) -> Trainer:
    paths = TrainPaths(tiny_model_dir, tmp_path / name / "checkpoints", tmp_path / name / "final",
                       tmp_path / name / "metrics", tmp_path / name / "train.json")
    trainer = Trainer(p, STYLE, paths, ROWS, ROWS[:2], None, fingerprint(p, STYLE, []))
    trainer.run()
    return trainer


def kill_at_step(monkeypatch, step: int) -> None:
    """Make the loop's ``step``-th call of grpo_step raise, like a kill after the previous checkpoint."""
    real_step = loop_module.grpo_step
    calls = {"n": 0}

    def crashing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == step:
            raise KeyboardInterrupt(f"simulated kill at step {step}")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(loop_module, "grpo_step", crashing)


def final_weights(tmp_path, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(tmp_path / name / "final" / "adapter_model.safetensors"))


def test_trains_only_lora_and_writes_outputs(tmp_path, tiny_model_dir):
    trainer = run(tmp_path, tiny_model_dir, params(), "plain")
    lora = {id(p) for p in trainer.lora_params}
    assert all(not p.requires_grad for p in trainer.model.parameters() if id(p) not in lora)
    assert all(p.dtype == torch.float32 for p in trainer.lora_params)
    weights = final_weights(tmp_path, "plain")
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in weights.items())
    summary = json.loads((tmp_path / "plain/train.json").read_text())
    assert summary["steps"] == 3
    steps = (tmp_path / "plain/metrics/steps.csv").read_text().splitlines()
    assert len(steps) == 4 and "reward/digit_share" in steps[0] and "kl_mean" in steps[0]
    assert all(f"peak_memory_gib/{phase}" in steps[0] for phase in ("generate", "score", "train"))
    validation = (tmp_path / "plain/metrics/validation.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in validation[1:]] == ["2", "3"]
    # last checkpoint (keep_last 1) plus the validated steps, which keep only their adapter
    kept = {c.name: sorted(p.name for p in c.iterdir()) for c in list_checkpoints(tmp_path / "plain/checkpoints")}
    assert kept["step-000003"] == ["adapter", "state.json", "trainer_state.pt"]
    assert kept["step-000002"] == ["adapter", "state.json"]
    assert "step-000001" not in kept


def test_resume_after_crash_gives_the_same_adapter(tmp_path, tiny_model_dir, monkeypatch):
    run(tmp_path, tiny_model_dir, params(), "uninterrupted")
    with monkeypatch.context() as patch:
        kill_at_step(patch, 3)  # after the step-2 checkpoint
        with pytest.raises(KeyboardInterrupt):
            run(tmp_path, tiny_model_dir, params(), "resumed")
    trainer = run(tmp_path, tiny_model_dir, params(), "resumed")
    assert len(trainer.history) == 3
    expected, got = final_weights(tmp_path, "uninterrupted"), final_weights(tmp_path, "resumed")
    assert expected.keys() == got.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)


def test_other_run_checkpoints_are_not_resumed(tmp_path, tiny_model_dir):
    run(tmp_path, tiny_model_dir, params(), "run")
    trainer = run(tmp_path, tiny_model_dir, params(lr=5e-3), "run")  # same folder, new params
    assert len(trainer.history) == 3 and trainer.history[0]["step"] == 1


def test_oom_storm_gives_the_same_adapter(tmp_path, tiny_model_dir, monkeypatch):
    clean = run(tmp_path, tiny_model_dir, params(), "clean")
    monkeypatch.setenv("GRPO_FAULT_OOM", "train:size>1,score:size>2")
    storm = run(tmp_path, tiny_model_dir, params(), "storm")
    assert storm.sizes["train"].oom_events >= 3
    # Same rows, same step-wide normaliser: from identical weights the gradient differs only by float
    # summation order (step 1). Adam's per-element normalisation magnifies those last bits for
    # near-zero gradient entries, so later steps start from weights equal to ~1e-6, not bit for bit.
    first_clean, first_storm = clean.history[0]["grad_norm"], storm.history[0]["grad_norm"]
    assert first_storm == pytest.approx(first_clean, rel=1e-5)
    for a, b in zip(clean.history, storm.history):
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
        assert b["reward_mean"] == a["reward_mean"]
    expected, got = final_weights(tmp_path, "clean"), final_weights(tmp_path, "storm")
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-3, atol=2e-5)


def test_oom_at_size_one_fails_clearly_and_keeps_the_last_checkpoint(tmp_path, tiny_model_dir, monkeypatch):
    with monkeypatch.context() as patch:
        kill_at_step(patch, 2)  # after the step-1 checkpoint
        with pytest.raises(KeyboardInterrupt):
            run(tmp_path, tiny_model_dir, params(), "first")
    monkeypatch.setenv("GRPO_FAULT_OOM", "train:all")
    with pytest.raises(torch.OutOfMemoryError, match="micro-batch size 1"):
        run(tmp_path, tiny_model_dir, params(), "first")  # resumes at step 2, then OOMs at size 1
    assert [c.name for c in list_checkpoints(tmp_path / "first/checkpoints")] == ["step-000001"]
