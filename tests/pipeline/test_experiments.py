"""Habit 2 with real dvc: `dvc exp run -S` on a training param, a queued experiment run by
`dvc queue start` (it runs in a temp copy of the repo, so this also checks the params' paths hold
there), then `dvc exp show --json` lists both experiments with their params and DVCLive's metrics, and
`dvc plots diff` draws the training curves from DVCLive's files."""
from __future__ import annotations

import json
import time

import pytest

from tests.pipeline.project import QUEUE_S, run

pytestmark = pytest.mark.slow


def wait_for_queue(project, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = run("dvc queue status", project, timeout=QUEUE_S).stdout
        if not any(word in status for word in ("Queued", "Running")):
            return
        time.sleep(5)
    pytest.fail(f"queued experiment still running after {timeout_s} s:\n{status}")


def experiments(project) -> dict[str, dict]:
    """name → {"params": params.yaml's values, "metrics": {file: values}} from `dvc exp show --json`."""
    shown = json.loads(run("dvc exp show --json", project).stdout)
    found = {}
    for commit in shown:
        for exp in commit.get("experiments") or []:
            for rev in exp["revs"]:
                data = rev.get("data") or {}
                if rev.get("error") or not data:
                    continue
                found[rev["name"]] = {
                    "params": data["params"]["params.yaml"]["data"],
                    "metrics": {path: m["data"] for path, m in data["metrics"].items()},
                }
    return found


SWEEP = "dvc exp run --queue -S 'train.loss_type=grpo,dr_grpo,dapo' -S 'train.lr=1e-4,5e-4'"
COMPARE = "dvc exp show --drop '.*' --keep 'Experiment|State|train\\.(lr|loss_type)$|reward_mean_last5|val_accuracy_best|(final|best)\\..*pass@1$'"


def queued_params(project) -> list[tuple[str, float]]:
    shown = json.loads(run("dvc exp show --json", project).stdout)
    return [(rev["data"]["params"]["params.yaml"]["data"]["train"]["loss_type"],
             rev["data"]["params"]["params.yaml"]["data"]["train"]["lr"])
            for commit in shown for exp in commit.get("experiments") or [] for rev in exp["revs"]
            if (exp.get("executor") or {}).get("state") == "queued"]


def test_exp_run_set_param_queue_and_sweep(project_copy):
    try:
        run("dvc exp run -n lr-1e-3 -S train.lr=1e-3", project_copy)

        # The README's sweep queues the full grid; running it is the same as the one queued run below.
        run(SWEEP, project_copy)
        grid = {(loss, lr) for loss in ("grpo", "dr_grpo", "dapo") for lr in (1e-4, 5e-4)}
        assert sorted(queued_params(project_copy)) == sorted(grid)
        run("dvc queue remove --queued", project_copy, timeout=QUEUE_S)

        run("dvc exp run --queue -n lr-2e-3 -S train.lr=2e-3", project_copy)
        run("dvc queue start", project_copy, timeout=QUEUE_S)
        wait_for_queue(project_copy)
        status = run("dvc queue status", project_copy, timeout=QUEUE_S).stdout
        assert "Failed" not in status, \
            status + run("dvc queue logs lr-2e-3", project_copy, check=False, timeout=QUEUE_S).stdout
    finally:
        run("dvc queue stop", project_copy, check=False, timeout=QUEUE_S)  # no worker outlives the test

    # the workspace holds the last `dvc exp run` (lr 1e-3): compare it with the commit
    assert "train.lr" in run("dvc params diff", project_copy).stdout
    run("dvc plots diff", project_copy)
    html = (project_copy / "dvc_plots/index.html").read_text()
    # one chart per DVCLive file, each with the workspace's and HEAD's curve
    for name in ("reward", "completions/mean_length", "eval/accuracy"):
        assert f"metrics/train/plots/metrics/{name}.tsv" in html, name
    assert '"rev": "workspace"' in html and '"rev": "HEAD"' in html
    run("dvc plots show", project_copy)  # the live view: the workspace's DVCLive files
    assert "metrics/train/plots/metrics/reward.tsv" in (project_copy / "dvc_plots/index.html").read_text()

    found = experiments(project_copy)
    assert {"lr-1e-3", "lr-2e-3"} <= set(found), sorted(found)
    for name, lr in (("lr-1e-3", 1e-3), ("lr-2e-3", 2e-3)):
        exp = found[name]
        assert exp["params"]["train"]["lr"] == lr
        train = exp["metrics"]["metrics/train/metrics.json"]  # DVCLive's summary, with TRL's names
        assert train["steps"] == train["step"] == 2
        assert {"reward", "reward_std", "completions", "clip_ratio", "entropy", "rewards", "eval"} <= set(train)
        assert {"mean_length", "clipped_ratio"} <= set(train["completions"]) and "accuracy" in train["eval"]
        assert set(exp["metrics"]["metrics/eval.json"]) == {"base", "final", "best"}

    table = run(f"COLUMNS=200 {COMPARE}", project_copy).stdout
    header = next(line for line in table.splitlines() if "Experiment" in line).split()
    assert header == ["Experiment", "State", "reward_mean_last5", "val_accuracy_best", "best.gsm8k.pass@1",
                      "final.gsm8k.pass@1", "train.lr", "train.loss_type"]
    assert "[lr-1e-3]" in table and "[lr-2e-3]" in table
