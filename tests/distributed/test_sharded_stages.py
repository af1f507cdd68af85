"""SENT and evaluate across 2 processes (torchrun, gloo on CPU) write the files 1 process writes, byte
for byte: the stages relaunch themselves under torchrun when their params ask for 2 processes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo.io import write_jsonl

ROOT = Path(__file__).resolve().parents[2]
TRAIN_ROWS = [{"id": f"q{i}", "source": "test", "question": f"What is {i} + 3?", "answer": str(i + 3),
               "answer_type": "integer", "meta": {}} for i in range(7)]
EVAL_ROWS = [{"id": f"e{i}", "source": "toy", "question": "What is " + " + ".join(["2"] * (i % 4 + 1)) + "?",
              "answer": str(2 * (i % 4 + 1)), "answer_type": "integer", "meta": {}} for i in range(7)]
# 7 questions in batches of 2: the last batch is short, and 2 processes split the batches unevenly
SENT = {"enabled": True, "engine": "native", "M": 3, "max_new_tokens": 6, "batch_size": 2, "save_every": 2,
        "num_stages": 2, "no_answer_cluster": False}
EVALUATE = {"engine": "native", "batch_size": 4, "seed": 3,
            "benchmarks": {"toy": {"n": 2, "temperature": 1.0, "max_new_tokens": 6}}}
SENT_OUTPUTS = ("data/sent/scores.jsonl", "data/sent/curriculum.json", "data/sent/entropy_hist.png",
                "metrics/sent.json", "data/sent_progress/progress.json")
EVAL_OUTPUTS = ("eval/base/toy.jsonl", "metrics/eval/base/toy.json")


def make_project(root: Path, tiny_model_dir: Path) -> Path:
    shutil.copytree(tiny_model_dir, root / "models" / "base")
    write_jsonl(root / "data" / "prepared" / "train.jsonl", TRAIN_ROWS)
    write_jsonl(root / "data" / "prepared" / "eval" / "toy.jsonl", EVAL_ROWS)
    return root


def run(project: Path, params: dict, *args: str) -> subprocess.CompletedProcess:
    (project / "params.yaml").write_text(yaml.safe_dump({**params, "prompt": {"style": "tagged"}}))
    # one thread a process in both runs: the 1-process run computes with the threads torchrun gives each worker
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", *args, "--params", "params.yaml"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def projects(tiny_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    return (make_project(tmp_path_factory.mktemp("one"), tiny_model_dir),
            make_project(tmp_path_factory.mktemp("two"), tiny_model_dir))


def outputs(project: Path, names: tuple[str, ...]) -> dict[str, bytes]:
    return {name: (project / name).read_bytes() for name in names}


def test_sent_on_two_processes_writes_the_one_process_files(projects):
    one, two = projects
    run(one, {"sent": SENT}, "stages.sent")
    proc = run(two, {"sent": {**SENT, "num_processes": 2}}, "stages.sent")
    assert "relaunching" in proc.stderr and "rank 1" in proc.stderr  # torchrun ran two workers
    assert outputs(two, SENT_OUTPUTS) == outputs(one, SENT_OUTPUTS)


def test_evaluate_on_two_processes_writes_the_one_process_files(projects):
    one, two = projects
    run(one, {"evaluate": EVALUATE}, "stages.evaluate", "--model", "base", "--benchmark", "toy")
    proc = run(two, {"evaluate": {**EVALUATE, "num_processes": 2}}, "stages.evaluate", "--model", "base",
               "--benchmark", "toy")
    assert "rank 1" in proc.stderr
    assert outputs(two, EVAL_OUTPUTS) == outputs(one, EVAL_OUTPUTS)
    # sampled at temperature 1 from distinct keys, so the comparison covers the per-shard sampling keys:
    # the two samples of a question differ somewhere
    records = [json.loads(line) for line in (one / "eval/base/toy.jsonl").read_text().splitlines()]
    assert len(records) == 2 * len(EVAL_ROWS)
    assert any(a["completion"] != b["completion"] for a, b in zip(records[::2], records[1::2]))
