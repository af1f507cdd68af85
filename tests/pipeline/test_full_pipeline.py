"""The whole DAG with real dvc in a temp git repo, on a tiny random Qwen2 (fast, CPU):
base_model → prepare → sent → train → select → evaluate (base/final/best) → eval_summary → report.
Then: a second repro runs nothing; a training param reruns train and what follows but not the base
evaluations; one benchmark's protocol reruns only that benchmark's evaluations."""
from __future__ import annotations

import json

import pytest

from tests.pipeline.project import BENCHMARKS, copy_project, edit_params, ran_stages, run, tiny_params

pytestmark = pytest.mark.slow


def test_full_dag_and_selective_reruns(tmp_path, tiny_model_dir):
    project = copy_project(tmp_path / "project")
    tiny_params(project, tiny_model_dir)
    first = run(["dvc", "repro"], project)
    stages = ran_stages(first.stdout)
    for name in ["base_model", "prepare", "sent", "train", "select", "eval_summary", "report"]:
        assert name in stages
    assert sum(s.startswith("evaluate_base@") for s in stages) == len(BENCHMARKS)
    assert sum(s.startswith("evaluate@") for s in stages) == 2 * len(BENCHMARKS)  # final and best
    assert (project / "data/sent/curriculum.json").exists()
    assert (project / "metrics/train/plots/metrics/curriculum_stage.tsv").is_file()  # DVCLive's per-step file
    assert json.loads((project / "models/best/SELECTION.json").read_text())["checkpoint"].startswith("step-")
    eval_metrics = json.loads((project / "metrics/eval.json").read_text())
    assert sorted(eval_metrics) == ["base", "best", "final"]
    assert sorted(eval_metrics["final"]) == sorted(BENCHMARKS)
    report = (project / "reports/report.md").read_text()
    assert "base" in report and "final" in report and "best" in report
    assert (project / "reports/report.html").exists() and (project / "reports/MODEL_CARD.md").exists()
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "run"], project)

    assert ran_stages(run(["dvc", "repro"], project).stdout) == []

    edit_params(project, train={"lr": 1e-3})
    retrain = ran_stages(run(["dvc", "repro"], project).stdout)
    assert "train" in retrain and "report" in retrain
    assert not any(s.startswith("evaluate_base@") for s in retrain)
    assert "sent" not in retrain and "prepare" not in retrain
    diff = run(["dvc", "metrics", "diff"], project)
    assert "metrics/train/metrics.json" in diff.stdout or "metrics/eval.json" in diff.stdout
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "lr"], project)

    edit_params(project, evaluate={"benchmarks": {**{b: {"max_new_tokens": 4} for b in BENCHMARKS},
                                                  "aime24": {"max_new_tokens": 5}}})
    rerun = ran_stages(run(["dvc", "repro"], project).stdout)
    evaluations = sorted(s for s in rerun if s.startswith("evaluate"))
    assert evaluations == ["evaluate@best-aime24", "evaluate@final-aime24", "evaluate_base@aime24"]
    plots = run(["dvc", "plots", "show", "--json"], project)
    assert "reward" in plots.stdout
