"""The train stage's tracker (grpo/train/tracking.py) against a real DVC project: a run leaves no open
descriptors behind (DVCLive opens the project's DVC repo and does not close it)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from grpo.train.tracking import Tracker


def _open_descriptors() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return found


def test_a_finished_run_releases_the_dvc_repo_dvclive_opened(tmp_path, monkeypatch):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"], cwd=tmp_path,
                   check=True)  # DVCLive reads the head commit
    monkeypatch.chdir(tmp_path)  # DVCLive finds the project from the working directory
    before = _open_descriptors()
    tracker = Tracker(tmp_path / "metrics/train", tmp_path / "logs/train.json", [], {}, tmp_path / "logs/wandb")
    tracker.start([], [])
    opened = _open_descriptors() - before
    assert any(str(tmp_path) in path or "/dvc/" in path for path in opened)  # the repo's caches, held open
    tracker.log_step({"step": 1, "reward_mean": 0.5}, None, {})
    tracker.finish({"steps": 1}, [])
    assert (tmp_path / "metrics/train/metrics.json").exists()
    assert not {path for path in _open_descriptors() - before if str(tmp_path) in path or "/dvc/" in path}
