"""Real dvc on the real dvc.yaml: editing a project module marks exactly the stages that run it as
changed in `dvc status`, for every module of every package (one `dvc status` each), and none for a
module no stage runs.

No stage runs here: every output is a placeholder that `dvc commit` records, so dvc.lock holds the
hashes of the code as it is, and each edit shows up as a changed dep of the stages that list it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo.lineage import closure, is_trivial, stages
from tests.pipeline.project import copy_project, run

pytestmark = pytest.mark.slow


def resolved_stages(project: Path) -> list[tuple[str, list[str], list[str]]]:
    """(name, deps, outs) of every stage, matrix items expanded, as dvc itself reads dvc.yaml."""
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        return [(s.name, [d.def_path for d in s.deps], [o.def_path for o in s.outs]) for s in repo.index.stages]


def placeholder_outputs(project: Path, resolved: list[tuple[str, list[str], list[str]]]) -> None:
    """Create each output, as a folder when a dep points inside it or its name has no suffix."""
    deps = {d for _, stage_deps, _ in resolved for d in stage_deps}
    for _, _, outs in resolved:
        for out in outs:
            inside = [d for d in deps if d.startswith(out + "/")]
            if inside or not Path(out).suffix:
                for rel in inside or [f"{out}/placeholder"]:
                    (project / rel).parent.mkdir(parents=True, exist_ok=True)
                    (project / rel).write_text("{}\n")
            else:
                (project / out).parent.mkdir(parents=True, exist_ok=True)
                (project / out).write_text("{}\n")


def project_modules(project: Path) -> list[Path]:
    """Every non-trivial module under grpo/ and stages/."""
    files = sorted(p.relative_to(project) for top in ("grpo", "stages") for p in (project / top).rglob("*.py"))
    return [f for f in files if not is_trivial(project, f)]


def test_editing_a_module_changes_exactly_the_stages_that_run_it(tmp_path):
    project = copy_project(tmp_path / "project")
    resolved = resolved_stages(project)
    placeholder_outputs(project, resolved)
    run(["dvc", "commit", "-f", "-q"], project)
    assert "up to date" in run(["dvc", "status"], project).stdout

    runs = {s.name: set(closure(project, s.module)) for s in stages(project)}
    # a matrix stage's items (evaluate@final-gsm8k) run what the stage's cmd runs
    expected_of = {name: runs[name.split("@")[0]] for name, _, _ in resolved}
    modules = project_modules(project)
    assert len({m.parent for m in modules}) >= 12, modules  # grpo, its 10 packages, stages
    assert any(not any(m in r for r in runs.values()) for m in modules), "no module that no stage runs"
    wrong = []
    for module in modules:
        original = (project / module).read_bytes()
        (project / module).write_bytes(original + b"\n# an edit\n")
        changed = set(json.loads(run(["dvc", "status", "--json"], project).stdout))
        (project / module).write_bytes(original)
        expected = {name for name, files in expected_of.items() if module in files}
        if changed != expected:
            wrong.append(f"editing {module}: dvc status marks {sorted(changed - expected)} that do not run it, "
                         f"and misses {sorted(expected - changed)} that do")
    assert not wrong, "\n".join(wrong) + "\nfix: put each stage's list from `python -m grpo.lineage` into dvc.yaml"
