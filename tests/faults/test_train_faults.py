"""Training faults in-process on the tiny 4-bit model: OOM storms through the fault hook
(``GRPO_FAULT_OOM``), a checkpoint write that fails half-way with OSError, and a truncated newest
checkpoint. Each run ends with the adapter of an uninterrupted run, or a clear error that leaves the
last good checkpoint in place."""
from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import torch

from grpo.train import checkpoint as checkpoint_module
from grpo.train.checkpoint import list_checkpoints
from tests.train.harness import RecordingTrainer, final_weights, killed_at, params, run


@pytest.fixture(scope="module")
def clean(tmp_path_factory, tiny_model_dir):
    """One uninterrupted run: (its trainer, its final adapter weights, its rollouts' token ids)."""
    root = tmp_path_factory.mktemp("clean")
    trainer = run(root, tiny_model_dir, params(), "clean", RecordingTrainer)
    return trainer, final_weights(root, "clean"), trainer.rollouts


def assert_same_adapter(got: dict, expected: dict, **tolerance) -> None:
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], **(tolerance or {"rtol": 0, "atol": 0}))


def test_oom_storm_every_micro_batch_until_size_one_gives_the_same_adapter(tmp_path, tiny_model_dir,
                                                                           monkeypatch, clean):
    reference, expected, reference_rollouts = clean
    monkeypatch.setenv("GRPO_FAULT_OOM", "train:size>1,score:size>1,generate:size>2")
    storm = run(tmp_path, tiny_model_dir, params(), "storm", RecordingTrainer)
    assert storm.rollouts == reference_rollouts  # generation redid the failed rows and drew the same tokens
    # 6 -> 3 -> 1 rows (generate: sequences in flight, redrawing nothing); a regrowth after 4 clean
    # calls fails again
    for phase in ("train", "score", "generate"):
        size = storm.sizes[phase]
        assert size.oom_events >= 2 and [h["new_size"] for h in size.history][:2] == [3, 1]
    # Same rows, same step-wide normaliser: from identical weights the gradient differs only by float
    # summation order (step 1). Adam's per-element normalisation magnifies those last bits for
    # near-zero gradient entries, so later steps start from weights equal to ~1e-6, not bit for bit.
    assert storm.history[0]["grad_norm"] == pytest.approx(reference.history[0]["grad_norm"], rel=1e-5)
    for a, b in zip(reference.history, storm.history, strict=True):
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
        assert b["reward_mean"] == a["reward_mean"]
    # Six Adam updates of ~lr (1e-2) each on the same rollouts: one element of 2048 ends 3.6e-4 apart
    # and every other within 2e-5; a lost or doubled micro-batch would move most elements by a good
    # part of lr.
    assert_same_adapter(final_weights(tmp_path, "storm"), expected, rtol=1e-3, atol=1e-3)


def test_oom_at_size_one_fails_clearly_and_keeps_the_last_checkpoint(tmp_path, tiny_model_dir, monkeypatch):
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, tiny_model_dir, params(), "first", killed_at(2))  # after the step-1 checkpoint
    monkeypatch.setenv("GRPO_FAULT_OOM", "train:all")
    with pytest.raises(torch.OutOfMemoryError, match="micro-batch size 1"):
        run(tmp_path, tiny_model_dir, params(), "first")  # resumes at step 2, then OOMs at size 1
    assert [c.name for c in list_checkpoints(tmp_path / "first/checkpoints")] == ["step-000001"]


def test_checkpoint_write_failing_half_way_keeps_the_previous_one(tmp_path, tiny_model_dir, monkeypatch,
                                                                  caplog, clean):
    real_save, calls = torch.save, {"n": 0}

    def disk_full_on_second_save(obj, path, *args, **kwargs):
        calls["n"] += 1
        real_save(obj, path, *args, **kwargs)
        if calls["n"] == 2:  # step 2's optimiser state: half of it reaches the disk
            Path(path).write_bytes(Path(path).read_bytes()[: Path(path).stat().st_size // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint_module.torch, "save", disk_full_on_second_save)
        with pytest.raises(OSError, match="No space left on device"):
            run(tmp_path, tiny_model_dir, params(), "disk")
    root = tmp_path / "disk/checkpoints"
    assert [c.name for c in list_checkpoints(root)] == ["step-000001"]
    assert [p.name for p in root.iterdir()] == ["step-000001"]  # the half-written temp folder is gone
    assert checkpoint_module.load_latest(root)[1]["step"] == 1
    with caplog.at_level(logging.INFO, logger="grpo.train.loop"):
        run(tmp_path, tiny_model_dir, params(), "disk")
    assert "resumed from" in caplog.text and "step-000001 (step 1 of 3)" in caplog.text
    assert_same_adapter(final_weights(tmp_path, "disk"), clean[1])


@pytest.mark.parametrize("damaged", ["adapter/adapter_model.safetensors", "trainer_state.pt", "state.json"])
def test_truncated_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path, tiny_model_dir, caplog, clean,
                                                                    damaged):
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, tiny_model_dir, params(keep_last=2), "trunc", killed_at(3))  # after checkpoints 1 and 2
    root = tmp_path / "trunc/checkpoints"
    assert [c.name for c in list_checkpoints(root)] == ["step-000001", "step-000002"]
    path = root / "step-000002" / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with caplog.at_level(logging.INFO):
        run(tmp_path, tiny_model_dir, params(keep_last=2), "trunc")
    assert f"skipping unreadable checkpoint {root / 'step-000002'}" in caplog.text
    assert "step-000001 (step 1 of 3)" in caplog.text
    assert_same_adapter(final_weights(tmp_path, "trunc"), clean[1])
