"""Real dvc, the real dvc.yaml (all benchmarks), the tiny model: what git sees after a `dvc repro` that
fails in a later stage, and what a forced rerun changes.

1. A new user's crash-and-resume: `dvc repro` killed inside sent, then `dvc repro` again. DVC removes
   the .gitignore entries it added during a failed repro (treeverse/dvc#11091) and skips the stages
   that had succeeded, so without the committed .gitignore `git status` would list models/base/ and
   data/prepared/ and the README's `git add -A` would commit them. After each run, git sees exactly
   dvc.lock and the `cache: false` outputs, the files the README says to commit.
2. `dvc repro --force` of every stage, the report included, with the persist outputs (SENT's progress,
   the checkpoints) deleted so nothing is resumed: dvc.lock (so reports/ too) and every metrics and
   `cache: false` file are byte-identical, and `git status` is clean. The measured figures changed, in
   logs/ only (the report's among them, logs/report_measured.md).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.pipeline.project import copy_project, dvc_outputs, ran_stages, run, tiny_params

pytestmark = pytest.mark.slow


def git_status(project: Path) -> list[str]:
    """Every path git reports as changed or untracked, folders expanded to their files."""
    out = run(["git", "status", "--porcelain", "--untracked-files=all"], project).stdout
    return sorted(line[3:] for line in out.splitlines())


def files_under(project: Path, paths: list[str]) -> list[str]:
    found = []
    for path in paths:
        target = project / path
        found += [str(p.relative_to(project)) for p in target.rglob("*") if p.is_file()] if target.is_dir() else \
            [path] if target.is_file() else []
    return sorted(found)


def is_under(path: str, outs: list[str]) -> bool:
    return any(path == out or path.startswith(f"{out}/") for out in outs)


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir) -> dict:
    """The project after a killed `dvc repro` and a successful one; git's view after each."""
    project = copy_project(tmp_path_factory.mktemp("hygiene") / "project")
    tiny_params(project, tiny_model_dir)
    run('git add -A && git commit -qm "tiny params"', project)
    failed = run(["dvc", "repro"], project, check=False, GRPO_FAULT_KILL="sent.batch")
    after_failure = git_status(project)
    done = run(["dvc", "repro"], project)
    return {"root": project, "failed": failed, "after_failure": after_failure, "done": done,
            "after_success": git_status(project)}


def test_a_failed_repro_leaves_no_stage_output_for_git(project):
    root, failed = project["root"], project["failed"]
    assert failed.returncode != 0 and "GRPO_FAULT_KILL: SIGKILL at sent.batch" in failed.stderr
    assert ran_stages(failed.stdout)[:3] == ["base_model", "prepare", "sent"]
    assert (root / "models/base/config.json").is_file() and (root / "data/prepared/train.jsonl").is_file()
    cached, uncached = dvc_outputs(root)
    # after the failure: the succeeded stages' lock entries and metrics, no output DVC caches
    assert project["after_failure"] == ["dvc.lock", "metrics/prepare.json"]

    assert "report" in ran_stages(project["done"].stdout) and "base_model" not in ran_stages(project["done"].stdout)
    status = project["after_success"]
    assert not [path for path in status if is_under(path, cached)], status
    assert status == sorted(["dvc.lock", *files_under(root, uncached)])  # what the README says to commit
    assert not [path for path in status if path.endswith(".gitignore")]  # DVC needed to add no entry
    run('git add -A && git commit -qm "dvc repro"', root)  # the README's commit
    assert git_status(root) == []


def tracked_bytes(root: Path) -> dict[str, bytes]:
    _, uncached = dvc_outputs(root)
    return {path: (root / path).read_bytes() for path in ["dvc.lock", *files_under(root, uncached)]}


def test_forced_rerun_changes_neither_dvc_lock_nor_metrics(project):
    root = project["root"]
    assert git_status(root) == []  # committed by the test above
    before = tracked_bytes(root)
    measured = json.loads((root / "logs/train.json").read_text())
    companion = (root / "logs/report_measured.md").read_text()
    for persist in ("data/sent_progress", "models/checkpoints"):  # recompute, do not resume
        shutil.rmtree(root / persist)
    forced = ran_stages(run(["dvc", "repro", "--force"], root).stdout)
    assert {"base_model", "prepare", "sent", "train", "select", "eval_summary", "report"} <= set(forced)
    assert sum(s.startswith("evaluate") for s in forced) == 15  # 5 benchmarks x (base, final, best)
    assert tracked_bytes(root) == before
    assert git_status(root) == []
    assert "up to date" in run(["dvc", "status"], root).stdout
    assert json.loads((root / "logs/train.json").read_text()) != measured  # timings went to logs/ only
    assert (root / "logs/report_measured.md").read_text() != companion
