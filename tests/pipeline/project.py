"""Run the real project with real dvc in a temp git repo: copy the tracked tree, commit, run commands."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


# What a run of the pipeline writes; a developer's checkout may hold these untracked, a clean clone not.
RUN_OUTPUTS = ("dvc.lock", "models/", "metrics/", "eval/", "reports/", "data/prepared/", "data/sent", "bench/results/")


def project_files() -> list[str]:
    """The project as a clean clone has it: tracked files and new source files, no run outputs."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return [f for f in out.splitlines() if (ROOT / f).is_file() and not f.startswith(RUN_OUTPUTS)]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = f"{VENV_BIN}{os.pathsep}{e.get('PATH', '')}"
    e.update(GIT_AUTHOR_NAME="test", GIT_AUTHOR_EMAIL="test@example.invalid", GIT_COMMITTER_NAME="test",
             GIT_COMMITTER_EMAIL="test@example.invalid", DVC_NO_ANALYTICS="1", PYTHONPATH="")
    return e


QUEUE_S = 120  # a `dvc queue` command returns in seconds; one that hangs (a stuck worker, seen once) fails instead


def run(args: list[str] | str, cwd: Path, check: bool = True, timeout: float | None = None,
        **extra_env: str) -> subprocess.CompletedProcess:
    """Run a command (a string goes through the shell, as a user types it) with the venv on PATH; one that
    outlives ``timeout`` seconds is killed and fails the test (a hang would stall the whole suite)."""
    try:
        proc = subprocess.run(args, cwd=cwd, env={**env(), **extra_env}, capture_output=True, text=True,
                              shell=isinstance(args, str), timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{args} did not finish in {timeout} s (killed)") from exc
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def copy_project(dst: Path) -> Path:
    for rel in project_files():
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    run(["git", "init", "-q"], dst)
    run(["git", "add", "-A"], dst)
    run(["git", "commit", "-qm", "project copy"], dst)
    return dst


def edit_params(project: Path, **sections: dict) -> None:
    """Merge ``sections`` (section → {key: value}) into the project's params.yaml."""
    path = project / "params.yaml"
    params = yaml.safe_load(path.read_text())
    for name, values in sections.items():
        params.setdefault(name, {}).update(values)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


BENCHMARKS = ["gsm8k", "gsm_plus", "math500", "aime24", "arith"]


def tiny_params(project: Path, tiny_model_dir: Path, benchmarks: list[str] = BENCHMARKS) -> None:
    """The smallest settings that still run every stage for real on the tiny random model."""
    edit_params(
        project,
        model={"source": str(tiny_model_dir)},
        prepare={"benchmarks": benchmarks, "max_train": 12, "max_val": 2, "max_eval": {b: 2 for b in benchmarks}},
        sent={"engine": "native", "M": 2, "max_new_tokens": 6, "batch_size": 4, "save_every": 4, "num_stages": 2},
        train={"max_steps": 2, "prompts_per_step": 2, "group_size": 2, "max_response_length": 6,
               "save_every": 1, "val_every": 1, "val_max_new_tokens": 4, "compute_dtype": "float32",
               "log_completions_every": 1},
        evaluate={"engine": "native", "benchmarks": {b: {"max_new_tokens": 4} for b in benchmarks}},
    )


def restrict_benchmarks(project: Path, benchmarks: list[str]) -> None:
    """Cut the evaluation matrix in dvc.yaml to ``benchmarks``: same DAG shape, fewer evaluate stages.
    For tests of DVC workflows (remotes, experiments); the full matrix has its own test."""
    path = project / "dvc.yaml"
    dvc = yaml.safe_load(path.read_text())
    for name in ("evaluate_base", "evaluate"):
        dvc["stages"][name]["matrix"]["benchmark"] = list(benchmarks)
    path.write_text(yaml.safe_dump(dvc, sort_keys=False))


def dvc_outputs(project: Path) -> tuple[list[str], list[str]]:
    """(cached, not cached) outputs of the project's dvc.yaml, in its order, matrix items expanded, as
    dvc itself reads them."""
    from dvc.repo import Repo

    cached, uncached = [], []
    with Repo(str(project)) as repo:
        for stage in repo.index.stages:
            for out in stage.outs:
                (cached if out.use_cache else uncached).append(out.def_path)
    return cached, uncached


def ran_stages(output: str) -> list[str]:
    return [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")]
