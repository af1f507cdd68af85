"""The README's promise: every command in its ```bash blocks is run by a test (verbatim, as a string
or an argv list) or by CI (.ci/run, Makefile). The commands no other test runs are run here."""
from __future__ import annotations

import json
import re
import shlex
import subprocess

from tests.conftest import ROOT
from tests.pipeline.project import copy_project, run

# Not run anywhere, with the reason (`make repro` and `make test` are lines of .ci/run).
NOT_RUN: dict[str, str] = {
    "python -m grpo.tune --budget-gib 8": "tunes SENT too, whose vLLM trials take minutes on a CPU; tests/test_tune.py "
                                          "runs the README's train,evaluate form of the same command",
    "GRPO_RDZV_ENDPOINT=node0:29500 dvc repro train": "needs two hosts; tests/distributed/"
    "test_data_parallel_train.py rendezvous two launchers on localhost with the command grpo/launch.py builds",
    "GRPO_RDZV_ENDPOINT=node0:29500 python -m stages.train": "needs two hosts (as above)",
}


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            command = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
            if command:
                commands.append(command)
    return commands


def python_sources() -> str:
    text = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("*.py"))
    return text + "\n" + text.replace("\\\\", "\\")  # a command in a Python literal has its backslashes doubled


def ci_lines() -> set[str]:
    return {line.strip() for name in (".ci/run", "Makefile") for line in (ROOT / name).read_text().splitlines()}


def is_run(command: str, sources: str, ci: set[str]) -> bool:
    """A whole string literal (either quote) or argv list in a test, or a whole line of a CI script."""
    literals = [f'"{command}"', f"'{command}'", json.dumps(shlex.split(command))]
    return command in ci or any(literal in sources for literal in literals)


def test_every_readme_command_is_run_by_a_test_or_ci():
    commands = readme_commands()
    assert len(commands) > 20
    sources, ci = python_sources(), ci_lines()
    missing = [c for c in commands if c not in NOT_RUN and not is_run(c, sources, ci)]
    assert not missing, "README commands that no test or CI script runs:\n" + "\n".join(missing)
    assert not is_run("dvc exp run -S train.lr=" + "9", sources, ci)  # the check can fail (built so it is no literal)


def test_make_targets():
    dry = subprocess.run(["make", "-n", "repro"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "scripts/setup.sh" in dry and "dvc repro" in dry
    dry = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "scripts/setup.sh test" in dry and "python -m pytest" in dry


REMOTES = {
    "dvc remote add -d storage /mnt/shared/dvc-storage": "/mnt/shared/dvc-storage",
    "dvc remote add -d storage ssh://user@host.example.com/srv/dvc": "ssh://user@host.example.com/srv/dvc",
    "dvc remote add -d storage s3://my-bucket/grpo-dvc": "s3://my-bucket/grpo-dvc",
    "dvc remote add -d storage gs://my-bucket/grpo-dvc": "gs://my-bucket/grpo-dvc",
}


def test_readme_remote_configuration(tmp_path):
    """Configuration only: pushes through S3/GCS need their plugins and a cloud (the local-folder and SSH
    remotes are pushed to for real in tests/pipeline/test_remote.py)."""
    for i, (command, url) in enumerate(REMOTES.items()):
        repo = tmp_path / f"repo{i}"
        repo.mkdir()
        run("git init -q && dvc init -q", repo)
        run(command, repo)
        listed = run("dvc remote list", repo).stdout
        assert url in listed and "(default)" in listed
        if "ssh://" in command:
            run("dvc remote modify --local storage keyfile ~/.ssh/id_ed25519", repo)
            assert "keyfile" in (repo / ".dvc/config.local").read_text()
            assert "keyfile" not in (repo / ".dvc/config").read_text()  # credentials stay out of git


def test_readme_presets_and_check(tmp_path):
    project = copy_project(tmp_path / "project")
    default = (project / "params.yaml").read_text()
    listed = run("python -m grpo.preset --list", project).stdout.split()
    assert "rtx3060ti-8gb" in listed
    run("python -m grpo.preset rtx3060ti-8gb", project)
    assert (project / "params.yaml").read_text() == (project / "presets/rtx3060ti-8gb.yaml").read_text()
    # whether the preset fits is tests/test_presets.py's question; here the README's command runs and plans
    checked = run("python -m grpo.check --budget-gib 8", project, check=False)
    assert checked.returncode in (0, 1) and "evaluate final,best/aime24" in checked.stdout, checked.stderr
    run("git checkout params.yaml", project)
    assert (project / "params.yaml").read_text() == default
    assert "fits: peak" in run("python -m grpo.check", project).stdout


def test_readme_one_area_alone():
    proc = run("python -m pytest -q tests/report", ROOT)
    assert re.search(r"\d+ passed", proc.stdout)
