"""bench/gpu_tune.py's bookkeeping around the device's limits: which tune result the steady job compares,
and what comes back within the device's 8 files. The jobs themselves need a GPU (bench/RESULTS.md)."""
from __future__ import annotations

import json
import tarfile

import pytest

from bench import gpu_tune


@pytest.fixture
def cache_dirs(tmp_path, monkeypatch):
    tune, carried = tmp_path / "tune", tmp_path / "carried"
    tune.mkdir()
    carried.mkdir()
    monkeypatch.setattr(gpu_tune, "TUNE_CACHE", tune)
    monkeypatch.setattr(gpu_tune, "CARRIED", carried)
    return tune, carried


def test_the_steady_job_takes_this_budgets_tuned_winner(cache_dirs):
    tune, _ = cache_dirs
    (tune / "model-gpu-7.5gib.winners.json").write_text(json.dumps({"train.train_batch_size": 8}))
    (tune / "model-gpu-15.5gib.winners.json").write_text(json.dumps({"train.compile_layers": True}))
    assert json.loads(gpu_tune.winner("tuned", "7.5")) == {"train.train_batch_size": 8}
    assert json.loads(gpu_tune.winner("tuned", "15.5")) == {"train.compile_layers": True}
    explicit = '{"train.generation_batch_size": 32}'
    assert gpu_tune.winner(explicit, "7.5") == explicit  # given settings pass through
    with pytest.raises(SystemExit, match="no tune:23.5 result"):
        gpu_tune.winner("tuned", "23.5")


def test_tuner_output_returns_new_caches_as_files_and_the_rest_in_one_archive(cache_dirs, tmp_path):
    tune, carried = cache_dirs
    (carried / "model-gpu-7.5gib.json").write_text("{}")
    (tune / "model-gpu-7.5gib.json").write_text("{}")  # as carried: nothing new to bring back
    (tune / "model-gpu-15.5gib.json").write_text('{"k": 1}')  # measured in this call
    (tune / "model-gpu-15.5gib.winners.json").write_text("{}")
    (tune / "model-gpu-15.5gib.txt").write_text("table")
    (tune / "model-gpu-15.5gib").mkdir()
    (tune / "model-gpu-15.5gib" / "train-as-shipped.log").write_text("log")
    out = tmp_path / "out"
    out.mkdir()
    gpu_tune.save_tuner_output(out)
    assert sorted(p.name for p in out.iterdir()) == ["model-gpu-15.5gib.json", "trial_logs.tar.gz"]
    with tarfile.open(out / "trial_logs.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["model-gpu-15.5gib.txt", "model-gpu-15.5gib.winners.json",
                                          "model-gpu-15.5gib/train-as-shipped.log"]


def test_a_profile_file_over_the_devices_limit_comes_back_in_parts_that_rejoin(tmp_path, monkeypatch):
    profile, out = tmp_path / "profile", tmp_path / "out"
    profile.mkdir()
    out.mkdir()
    monkeypatch.setattr(gpu_tune, "PROFILE", profile)
    trace = bytes(range(256)) * 40  # 10,240 bytes: three parts of at most 4,096
    (profile / "trace.json.gz").write_bytes(trace)
    (profile / "memory_snapshot.pickle").write_bytes(b"small")
    (profile / "phases.txt").write_text("table")
    gpu_tune.save_profile_output(out, part_bytes=4096)
    parts = sorted(out.glob("trace.json.gz.part*"), key=lambda p: int(p.name.rsplit("part", 1)[1]))
    assert [p.stat().st_size for p in parts] == [4096, 4096, 2048]
    assert b"".join(p.read_bytes() for p in parts) == trace
    assert (out / "memory_snapshot.pickle").read_bytes() == b"small"
    with tarfile.open(out / "profile.tar.gz") as tar:
        assert tar.getnames() == ["phases.txt"]


def test_the_steady_job_runs_the_shipped_settings_once_then_each_candidate():
    from bench import steady_step

    assert steady_step.runs({}) == [("shipped", {})]  # no changes: the shipped run measures both
    dense = {"train.dense_training": True}
    assert steady_step.runs(dense) == [("shipped", {}), ("winner", dense)]
    two = [{"train.train_batch_size": 32}, {}, dense]
    assert steady_step.runs(two) == [("shipped", {}), ("winner", {"train.train_batch_size": 32}),
                                     ("winner2", dense)]
