"""grpo.tune, grpo.profile and TRL's step on one GPU, at the 8 GB preset's shape (issue 17).

    python3 bench/gpu_tune.py [--jobs trl,tune:7.5,tune:15.5,tune:23.5,profile:7.5] [--deadline-s 560]

Sets up the project folder of bench/gpu_stages.py (the R1-Distill-Qwen-1.5B-shape random model of
bench/r1_model.py, presets/rtx3060ti-8gb.yaml, its data caps) by running its base_model and prepare stages,
then runs the jobs in order, each cut at the call's deadline:
- ``tune:CAP``: ``python -m grpo.tune --budget-gib CAP --stages train --run-steps 500`` (each trial the train
  stage in its own process with its allocator capped to CAP; 8/16/24 GiB cards less a CUDA context:
  7.5/15.5/23.5; ranked over the preset's 500 steps, not the set-up's 3);
- ``profile:CAP``: ``python -m grpo.profile --steps N --budget-gib CAP`` (N: ``--profile-steps``; trace, CUDA
  memory snapshot, phase table, live memory by owner);
- ``steady:CAP``: bench/steady_step.py, the shipped settings and ``--winner`` (default: the winner of this
  call's or a carried ``tune:CAP``), each over ``--steady-steps`` steps;
- ``trl``: TRL's GRPOTrainer at the same shape (``--trl-script``, the reference bench carried in ``.gpu/``;
  needs the trl/datasets/dill/multiprocess wheels installed on the device).
The tuner caches each finished trial and writes its table and winners beside the cache; caches found in
``bench/results/gpu_tune/`` (carried in the tree) seed the run, so a call cut by its deadline is continued
by the next (as long as the project's code is unchanged: it is part of each trial's key). Results go to
$OUT/gpu_tune/, within the device's 8 files: the caches this call added to, runs.json, the trials' logs,
tables and winners in trial_logs.tar.gz, the profile's trace and snapshot (in parts when over 15 MiB), its
table, plot and live-memory record in profile.tar.gz, and the steady and TRL jobs' JSON and logs in
steady.tar.gz.
Random weights: times and memory are real, answers are not.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PRESET = ROOT / "presets" / "rtx3060ti-8gb.yaml"  # bench/gpu_stages.py's project: this preset, data capped
WORK = Path("/tmp/gpu_stages_work")
CARRIED = ROOT / "bench" / "results" / "gpu_tune"
TUNE_CACHE = WORK / "logs" / "tune"
PROFILE, STEADY = WORK / "logs" / "profile", WORK / "logs" / "steady"


def run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           **(env or {})}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=WORK, env=env, capture_output=True, text=True, timeout=max(timeout, 1))
        rc, out = proc.returncode, proc.stdout + proc.stderr[-3000:]
    except subprocess.TimeoutExpired as exc:
        rc = "timeout"
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    print(f"$ {' '.join(cmd)}  -> rc {rc} in {time.perf_counter() - t0:.0f} s\n{out[-8000:]}", flush=True)
    return {"cmd": " ".join(cmd), "rc": rc, "wall_s": round(time.perf_counter() - t0, 1)}


def job_command(job: str, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    kind, _, cap = job.partition(":")
    if kind == "tune":
        # ranked over the preset's run, not the set-up's three steps: a compile is paid once in 500 steps
        run_steps = yaml.safe_load(PRESET.read_text())["train"]["max_steps"]
        return [sys.executable, "-m", "grpo.tune", "--budget-gib", cap, "--stages", "train", "--run-steps",
                str(run_steps), "--steps", str(args.steps), "--trials-s", str(args.trial_s)], {}
    if kind == "profile":
        return [sys.executable, "-m", "grpo.profile", "--steps", str(args.profile_steps), "--budget-gib", cap,
                "--out", str(PROFILE)], {}
    if kind == "steady":  # the shipped settings and the tuner's winner, each over more steps
        return [sys.executable, str(ROOT / "bench" / "steady_step.py"), "--project", str(WORK), "--out", str(STEADY),
                "--steps", str(args.steady_steps), "--cap-gib", cap, "--winner", winner(args.winner, cap)], {}
    if kind == "trl":
        env = {"CAP_GIB": "8", "COMP": "768", "ACC": "4", "STEPS": "2", "OUT": str(STEADY)}
        return [sys.executable, str(Path(args.trl_script).resolve())], env
    raise SystemExit(f"--jobs: unknown job {job!r} (tune:CAP, profile:CAP, trl)")


def winner(setting: str, cap: str) -> str:
    """``--winner``'s JSON settings; ``tuned``: what this call's (or a carried) ``tune:CAP`` found."""
    if setting != "tuned":
        return setting
    found = sorted(TUNE_CACHE.glob(f"*-{float(cap):.1f}gib.winners.json"))
    if not found:
        raise SystemExit(f"--winner tuned: no tune:{cap} result in {TUNE_CACHE}; run tune:{cap} first")
    return found[-1].read_text()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="trl,tune:7.5,tune:15.5,tune:23.5,profile:7.5")
    parser.add_argument("--deadline-s", type=float, default=560.0, help="the whole call, set-up included")
    parser.add_argument("--steps", type=int, default=2, help="measured training steps a trial (after a warm-up)")
    parser.add_argument("--steady-steps", type=int, default=5, help="measured steps of each steady run")
    parser.add_argument("--trial-s", type=float, default=150.0)
    parser.add_argument("--profile-steps", type=int, default=2,
                        help="traced steps (2: three step starts in the live-memory table)")
    parser.add_argument("--trl-script", default=".gpu/reference-bench/trl_anchor.py")
    parser.add_argument("--winner", default="tuned",
                        help="steady job: JSON settings, or `tuned`: the winner of this budget's tune job")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT") or ROOT / "bench" / "results") / "gpu_tune"
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    setup = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_stages.py"), "--stages", "base_model,prepare",
                            "--name", "gpu_tune_setup"], capture_output=True, text=True,
                           env={**os.environ, "OUT": "/tmp/gpu_tune_setup"})  # its JSON and logs stay there
    print(setup.stdout[-2000:], setup.stderr[-2000:], flush=True)
    TUNE_CACHE.mkdir(parents=True, exist_ok=True)
    STEADY.mkdir(parents=True, exist_ok=True)
    for cache in [*CARRIED.glob("*gib.json"), *CARRIED.glob("*gib.winners.json")]:
        shutil.copy(cache, TUNE_CACHE / cache.name)
    runs = []
    for job in filter(None, (j.strip() for j in args.jobs.split(","))):
        left = args.deadline_s - (time.perf_counter() - start)
        if left < 30:
            runs.append({"cmd": job, "rc": "skipped: deadline"})
            continue
        cmd, env = job_command(job, args)
        runs.append({"job": job, **run(cmd, left, env)})
        if job.startswith("tune"):
            save_tuner_output(out)  # after every tune job, so a later timeout loses nothing
    save_profile_output(out)
    archive(sorted(STEADY.glob("*")), out / "steady.tar.gz", STEADY)  # steady.json, its runs' logs, TRL's JSON
    (out / "runs.json").write_text(json.dumps(runs, indent=1))
    return 0


def archive(paths: list[Path], dest: Path, root: Path) -> None:
    """Small files in one archive: the device returns at most 8 files."""
    if paths:
        with tarfile.open(dest, "w:gz") as tar:
            for path in paths:
                tar.add(path, arcname=str(path.relative_to(root)))


def save_profile_output(out: Path, part_bytes: int = 15 * 2**20) -> None:
    """The trace and the snapshot as files (the large ones, cut into ``.partN`` files under the device's
    16 MiB a file: ``cat trace.json.gz.part* > trace.json.gz`` rejoins them), the table, plot and
    live-memory record in profile.tar.gz."""
    for name in ("memory_snapshot.pickle", "trace.json.gz"):
        if (PROFILE / name).exists():
            data = (PROFILE / name).read_bytes()
            if len(data) <= part_bytes:
                (out / name).write_bytes(data)
                continue
            for i in range(0, len(data), part_bytes):
                (out / f"{name}.part{i // part_bytes}").write_bytes(data[i:i + part_bytes])
    small = ("phases.txt", "phases.json", "memory.png", "live_memory.json")
    archive([PROFILE / name for name in small if (PROFILE / name).exists()], out / "profile.tar.gz", PROFILE)


def save_tuner_output(out: Path) -> None:
    """The caches this call added to (one JSON a budget) as files, every trial's log in one archive."""
    for cache in TUNE_CACHE.glob("*gib.json"):
        carried = CARRIED / cache.name
        if not carried.exists() or carried.read_bytes() != cache.read_bytes():
            shutil.copy(cache, out / cache.name)
    small = [*TUNE_CACHE.rglob("*.log"), *TUNE_CACHE.glob("*.txt"), *TUNE_CACHE.glob("*.winners.json")]
    archive(sorted(small), out / "trial_logs.tar.gz", TUNE_CACHE)


if __name__ == "__main__":
    sys.exit(main())
