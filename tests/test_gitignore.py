"""The committed .gitignore ignores exactly the outputs DVC caches (matrix items expanded), so a failed
`dvc repro`, which removes the .gitignore entries DVC added during it (treeverse/dvc#11091), can never
leave one as an untracked file; the `cache: false` outputs, which git holds, stay visible to git.
tests/pipeline/test_repro_hygiene.py runs that failure for real."""
from __future__ import annotations

import subprocess

from tests.conftest import ROOT
from tests.pipeline.project import dvc_outputs

MARKER = "# Stage outputs that DVC caches."


def listed() -> list[str]:
    """The entries of .gitignore's block of cached stage outputs (from its comment to the end)."""
    lines = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    block = lines[lines.index(next(line for line in lines if line.startswith(MARKER))):]
    return [line for line in block if line and not line.startswith("#")]


def ignored(paths: list[str]) -> set[str]:
    proc = subprocess.run(["git", "check-ignore", "--stdin"], cwd=ROOT, input="\n".join(paths), text=True,
                          capture_output=True)
    assert proc.returncode in (0, 1), proc.stderr  # 1: none of them is ignored
    return set(proc.stdout.split())


def test_gitignore_lists_exactly_the_cached_outputs():
    cached, _ = dvc_outputs(ROOT)
    expected = [f"/{path}" for path in cached]
    assert listed() == expected, (
        "the cached outputs block of .gitignore is out of step with dvc.yaml:\n"
        f"  missing: {sorted(set(expected) - set(listed()))}\n  not an output: {sorted(set(listed()) - set(expected))}\n"
        f"fix: make the lines after '{MARKER}' in .gitignore exactly these, in this order:\n" + "\n".join(expected))


def test_git_ignores_every_cached_output_and_none_that_git_holds():
    cached, uncached = dvc_outputs(ROOT)
    inside = [f"{path}/any/file.bin" for path in cached]  # a folder output's contents are ignored too
    assert ignored(cached + inside) == set(cached + inside)
    committed = uncached + ["metrics/train/plots/metrics/reward.tsv", "dvc.lock", "params.yaml", "dvc.yaml"]
    assert ignored(committed) == set()
    assert ignored(["logs/train.json", "logs/wandb/latest-run"]) == {"logs/train.json", "logs/wandb/latest-run"}
