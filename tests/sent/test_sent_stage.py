"""The sent stage end to end on the tiny model, run as DVC runs it: `python -m stages.sent` in a project
folder holding models/base/ and data/prepared/train.jsonl."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo.io import read_jsonl, write_jsonl
from grpo.measured import is_measured
from grpo.sent.curriculum import load_curriculum

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"id": f"q{i}", "source": "test", "question": f"What is {i} + 3?", "answer": str(i + 3),
         "answer_type": "integer", "meta": {}} for i in range(6)]
SENT = {"enabled": True, "engine": "native", "M": 3, "max_new_tokens": 8, "batch_size": 2, "save_every": 2,
        "num_stages": 2, "no_answer_cluster": False}


def run_stage(project: Path, sent: dict) -> subprocess.CompletedProcess:
    (project / "params.yaml").write_text(yaml.safe_dump({"sent": sent, "prompt": {"style": "tagged"}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "stages.sent", "--params", "params.yaml"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture
def project(tiny_model_dir, tmp_path) -> Path:
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "base")
    write_jsonl(tmp_path / "data" / "prepared" / "train.jsonl", ROWS)
    return tmp_path


def test_stage_writes_scores_curriculum_histogram_metrics_and_resumes(project):
    run_stage(project, SENT)
    scores = read_jsonl(project / "data/sent/scores.jsonl")
    assert [s["id"] for s in scores] == [r["id"] for r in ROWS]
    stages = load_curriculum(project / "data/sent/curriculum.json", {r["id"] for r in ROWS})
    assert len(stages) == 2 and sorted(i for s in stages for i in s) == sorted(r["id"] for r in ROWS)
    assert (project / "data/sent/entropy_hist.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (project / "metrics/sent.json").read_text()
    metrics = json.loads(text)
    assert list(metrics) == sorted(metrics)
    assert metrics["enabled"] is True and metrics["engine"] == "native" and metrics["M"] == 3
    assert metrics["questions"] == 6 and metrics["generated_tokens"] > 0
    for key in ("entropy_mean", "entropy_std", "entropy_min", "entropy_max", "entropy_p50",
                "entropy_distinct_fraction", "pass_rate_mean", "truncated_fraction", "mean_length",
                "dropped_all_correct", "dropped_all_wrong"):
        assert key in metrics, key
    # timings are measured, not results: they go to the untracked log
    assert not any(is_measured(key) for key in metrics), metrics
    measured = json.loads((project / "logs/sent.json").read_text())
    assert measured["tokens_per_s"] > 0 and measured["time_s"] >= measured["generate_s"] > 0
    assert measured["questions_resumed"] == 0
    progress = json.loads((project / "data/sent_progress/progress.json").read_text())
    assert len(progress["scores"]) == 6

    # a rerun with the same params (dvc repro -f) takes every score from the progress file
    first = {name: (project / name).read_bytes() for name in ("data/sent/scores.jsonl", "metrics/sent.json",
                                                                "data/sent_progress/progress.json")}
    proc = run_stage(project, SENT)
    assert "6 of 6 questions already scored" in proc.stderr
    assert first == {name: (project / name).read_bytes() for name in first}
    assert json.loads((project / "logs/sent.json").read_text())["questions_resumed"] == 6


def test_disabled_stage_writes_no_curriculum(project):
    run_stage(project, {**SENT, "enabled": False})
    assert (project / "data/sent/scores.jsonl").read_text() == ""
    assert not (project / "data/sent/curriculum.json").exists()
    assert (project / "data/sent_progress").is_dir()
    assert json.loads((project / "metrics/sent.json").read_text()) == {"enabled": False}
