"""One real `dvc repro` of the project on the tiny model, shared by the workflow tests (remotes,
experiments, inference on the trained adapter), which each copy it before changing anything."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.pipeline.project import copy_project, ran_stages, restrict_benchmarks, run, tiny_params

WORKFLOW_BENCHMARKS = ["gsm8k"]


@pytest.fixture(scope="session")
def trained_project(tmp_path_factory, tiny_model_dir) -> Path:
    """The project after `dvc repro` and a commit of everything git should hold (dvc.lock, the
    cache: false metrics and logs). Read-only for tests: copy it with ``copy_trained``."""
    project = copy_project(tmp_path_factory.mktemp("trained") / "project")
    tiny_params(project, tiny_model_dir, WORKFLOW_BENCHMARKS)
    restrict_benchmarks(project, WORKFLOW_BENCHMARKS)
    stages = ran_stages(run(["dvc", "repro"], project).stdout)
    assert "train" in stages and "report" in stages
    run('git add -A && git commit -m "dvc repro"', project)  # the README's commit after a run
    return project


@pytest.fixture
def project_copy(trained_project, tmp_path) -> Path:
    """A private copy of the trained project (git history, DVC cache and workspace)."""
    return Path(shutil.copytree(trained_project, tmp_path / "project", symlinks=True))
