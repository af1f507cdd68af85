"""The GRPO loop end to end on a tiny random Qwen2 in real bitsandbytes 4-bit on CPU: it learns only
LoRA weights, writes resumable checkpoints, resumes to the same adapter, and does not resume another
run's checkpoints. Faults (OOM storms, failed or truncated checkpoint writes) are in tests/faults/."""
from __future__ import annotations

import json

import pytest
import torch

from grpo.train.checkpoint import list_checkpoints
from tests.train.harness import final_weights, kill_at_step, params, run
from tests.train.harness import varied_reward as varied_reward  # noqa: F401 - a fixture, used below

pytestmark = pytest.mark.usefixtures("varied_reward")


def test_trains_only_lora_and_writes_outputs(tmp_path, tiny_model_dir):
    trainer = run(tmp_path, tiny_model_dir, params(), "plain")
    lora = {id(p) for p in trainer.lora_params}
    assert all(not p.requires_grad for p in trainer.model.parameters() if id(p) not in lora)
    assert all(p.dtype == torch.float32 for p in trainer.lora_params)
    weights = final_weights(tmp_path, "plain")
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in weights.items())
    summary = json.loads((tmp_path / "plain/train.json").read_text())
    assert summary["steps"] == 3 and summary["verify_timeouts"] == 0
    steps = (tmp_path / "plain/metrics/steps.csv").read_text().splitlines()
    assert len(steps) == 4 and "reward/digit_share" in steps[0] and "kl_mean" in steps[0]
    assert "verify_timeouts" in steps[0].split(",")
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
