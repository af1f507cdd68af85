"""A checkpoint is resumed only by the same run, and the code is part of the run: after an edit to code
the train stage runs, DVC reruns the stage, and the stage must start over rather than resume the old
code's checkpoints (the arith-cpu sweep of 2026-12-05 resumed a finished run after a reward fix, so its
"new" adapter was the old one, recorded in dvc.lock against the new code)."""
from __future__ import annotations

from grpo.config import parse_section
from grpo.prompts import PromptStyle
from grpo.train.loop import fingerprint
from stages.train import code_files
from tests.pipeline.project import copy_project


def test_the_fingerprint_changes_with_the_code_the_stage_runs_and_only_that(tmp_path):
    project = copy_project(tmp_path / "project")
    params, style = parse_section("train", None), PromptStyle("tagged")
    files = code_files(project)
    names = {f.relative_to(project).as_posix() for f in files}
    assert {"stages/train.py", "grpo/train/step.py", "grpo/verify/rewards.py", "grpo/algo/objective.py"} <= names
    assert not any(n.startswith(("bench/", "tests/", "stages/evaluate")) for n in names)

    before = fingerprint(params, style, files)
    (project / "README.md").write_text("edited\n")  # not code the stage runs
    assert fingerprint(params, style, code_files(project)) == before
    rewards = project / "grpo" / "verify" / "rewards.py"
    rewards.write_text(rewards.read_text() + "\n# an edit\n")
    assert fingerprint(params, style, code_files(project)) != before
