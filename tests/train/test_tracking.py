"""The train stage's tracker (grpo/train/tracking.py) against a real DVC project: a run leaves no open
descriptors behind (DVCLive opens the project's DVC repo and does not close it), finished or stopped by an
error."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.train.tracking import Tracker
from tests.train import harness


def _open_descriptors() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return found


def _dvc_project(root: Path, monkeypatch) -> None:
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"], cwd=root,
                   check=True)  # DVCLive reads the head commit
    monkeypatch.chdir(root)  # DVCLive finds the project from the working directory


def _held(root: Path, before: set[str]) -> set[str]:
    return {path for path in _open_descriptors() - before if str(root) in path or "/dvc/" in path}


def test_a_finished_run_releases_the_dvc_repo_dvclive_opened(tmp_path, monkeypatch):
    _dvc_project(tmp_path, monkeypatch)
    before = _open_descriptors()
    tracker = Tracker(tmp_path / "metrics/train", tmp_path / "logs/train.json", [], {}, tmp_path / "logs/wandb")
    tracker.start([], [])
    opened = _open_descriptors() - before
    assert any(str(tmp_path) in path or "/dvc/" in path for path in opened)  # the repo's caches, held open
    tracker.log_step({"step": 1, "reward_mean": 0.5}, None, {})
    tracker.finish({"steps": 1}, [])
    assert (tmp_path / "metrics/train/metrics.json").exists()
    assert not _held(tmp_path, before)


def test_a_run_stopped_by_an_error_releases_it_too(tmp_path, tiny_model_dir, monkeypatch):
    _dvc_project(tmp_path, monkeypatch)
    before = _open_descriptors()
    with pytest.raises(KeyboardInterrupt, match="simulated kill at step 2"):
        harness.run(tmp_path, tiny_model_dir, harness.params(), "killed", harness.killed_at(2))
    assert (tmp_path / "killed/metrics/metrics.json").exists()  # DVCLive did log the first step
    assert not _held(tmp_path, before)
