"""grpo.profile and grpo.tune on one GPU under a memory cap, at the 8 GB preset's shape (issue 17).

    python3 bench/gpu_tune.py [--cap-gib 7.5] [--tune-s 420] [--stages train]

Sets up the project folder of bench/gpu_stages.py (the R1-Distill-Qwen-1.5B-shape random model of
bench/r1_model.py, presets/rtx3060ti-8gb.yaml, its data caps) by running its base_model and prepare stages,
then in that folder a profiled training run (`python -m grpo.profile --steps 1 --budget-gib CAP`) and the
tuner (`python -m grpo.tune --budget-gib CAP --stages train --steps 1`), the latter cut at ``--tune-s``
(its trials are cached one by one, so a cut run still leaves every finished trial). Copies the profile's
phase table, plot and trace, and the tuner's table and cache to $OUT (default bench/results/gpu_tune/).
Random weights: times and memory are real, answers are not.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = Path("/tmp/gpu_stages_work")


def run(cmd: list[str], timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=WORK, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr[-3000:]
    except subprocess.TimeoutExpired as exc:
        rc, out = "timeout", (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    print(f"$ {' '.join(cmd)}  -> rc {rc} in {time.perf_counter() - t0:.0f} s\n{out[-6000:]}", flush=True)
    return {"cmd": " ".join(cmd), "rc": rc, "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-gib", type=float, default=7.5, help="8 GiB less a real card's CUDA context")
    parser.add_argument("--tune-s", type=float, default=420.0)
    parser.add_argument("--stages", default="train")
    parser.add_argument("--profile-steps", type=int, default=1)
    parser.add_argument("--profile-s", type=float, default=300.0)
    args = parser.parse_args()
    out = Path(os.environ.get("OUT") or ROOT / "bench" / "results") / "gpu_tune"
    out.mkdir(parents=True, exist_ok=True)
    setup = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_stages.py"), "--stages", "base_model,prepare",
                            "--name", "gpu_tune_setup"], capture_output=True, text=True,
                           env={**os.environ, "OUT": "/tmp/gpu_tune_setup"})  # its JSON and logs stay there
    print(setup.stdout[-2000:], setup.stderr[-2000:], flush=True)
    cap = str(args.cap_gib)
    runs = [run([sys.executable, "-m", "grpo.profile", "--steps", str(args.profile_steps), "--budget-gib", cap,
                 "--out", str(WORK / "logs" / "profile")], args.profile_s),
            run([sys.executable, "-m", "grpo.tune", "--budget-gib", cap, "--stages", args.stages, "--steps", "1",
                 "--trials-s", "120"], args.tune_s)]
    for name in ("phases.txt", "phases.json", "memory.png", "trace.json.gz"):
        if (WORK / "logs" / "profile" / name).exists():
            shutil.copy(WORK / "logs" / "profile" / name, out / name)
    for found in (WORK / "logs" / "tune").glob("*"):
        shutil.copy(found, out / ("tune" + found.suffix))
    (out / "runs.json").write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
