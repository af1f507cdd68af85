"""Foundation stages with real dvc in a temp git repo: repro, param edits rerun only their stage."""
from __future__ import annotations

import json

import pytest

from tests.pipeline.project import copy_project, edit_params, ran_stages, run

pytestmark = pytest.mark.slow


def test_repro_reruns_only_what_changed(tmp_path, tiny_model_dir):
    project = copy_project(tmp_path / "project")
    edit_params(project, model={"source": str(tiny_model_dir)},
                prepare={"max_train": 40, "max_val": 8, "max_eval": {"gsm8k": 4, "gsm_plus": 4, "math500": 4, "aime24": 4}})
    first = run(["dvc", "repro", "base_model", "prepare"], project)
    assert sorted(ran_stages(first.stdout)) == ["base_model", "prepare"]
    info = json.loads((project / "models/base/MODEL_INFO.json").read_text())
    assert info["source_kind"] == "local" and info["chat_template"] is True
    assert len((project / "data/prepared/train.jsonl").read_text().splitlines()) == 40
    assert (project / "metrics/prepare.json").exists()
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "first run"], project)

    again = run(["dvc", "repro", "base_model", "prepare"], project)
    assert ran_stages(again.stdout) == []

    edit_params(project, prepare={"max_train": 30})
    changed = run(["dvc", "repro", "base_model", "prepare"], project)
    assert ran_stages(changed.stdout) == ["prepare"]
    assert len((project / "data/prepared/train.jsonl").read_text().splitlines()) == 30
    diff = run(["dvc", "params", "diff"], project)
    assert "prepare.max_train" in diff.stdout

    dag = run(["dvc", "dag"], project)
    assert "base_model" in dag.stdout and "prepare" in dag.stdout
