"""One measured trial: a stage script run for real on a few items, in a scratch project, in its own process.

A trial is the user's own stage (``python -m stages.<name>``) on the user's model and data, so what it
measures is what a run will see; its own process gives each trial a fresh allocator and turns a crash or an
out-of-memory error into a recorded outcome instead of the tuner's end. The scratch project links the
project's ``models/base`` and copies a few rows of ``data/prepared``; its params are the user's with the
trial's settings and small workload caps (``trial_params``).

``python -m grpo.tuning.trial --result R.json [--cap-gib G] [--profile DIR] -- <stage> [stage args]`` is the
child: it caps the CUDA allocator at G GiB (as a smaller card would), counts every out-of-memory event the
engines absorb (their ``OOM in ...`` warnings, grpo/microbatch.py), profiles the run into DIR if asked
(grpo/profile.py) and writes the stage's return code, those counts and its peaks to R.json, whatever happens.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import resource
import runpy
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpo.io import read_jsonl, write_jsonl
from grpo.measured import SENT, TRAIN, eval_log, read_log

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30
VAL_TOKENS = 8  # a trial's closing validation: tokens a response
TQDM_BAR = re.compile(r"\d+%\|.*\|")  # a tqdm progress bar: "train:   0%|          | 0/3 [...]"
OOM_PREFIX = "OOM in "  # AdaptiveBatchSize.shrink's warning: an out-of-memory error the engine absorbed


@dataclass
class Outcome:
    """What one trial gave: ``status`` ok | oom (an OOM was absorbed or ended it) | failed | timeout."""

    status: str
    speed: float | None = None  # train: steady seconds a step (lower wins); sent, evaluate: tokens/s (higher)
    peak_gib: float | None = None
    wall_s: float = 0.0
    detail: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
    """How much a trial runs: measured training steps after one warm-up step, and rows of data."""

    steps: int = 2
    questions: int = 0  # sent/evaluate rows; 0: two generate calls' worth (2 x the batch size)


def trial_params(raw: dict, stage: str, settings: dict[str, Any], workload: Workload) -> dict:
    """The user's raw params with the trial's settings and a trial's workload: no checkpoints, a validation
    of a few tokens, no curriculum (the scratch project has no SENT output)."""
    out = json.loads(json.dumps(raw))
    for key, value in settings.items():
        section, name = key.split(".")
        out[section][name] = value
    if stage == "train":
        # the run's closing validation still runs (on one question: make_scratch); a few tokens keep its
        # seconds, which no step figure counts, off every trial's wall time
        out["train"].update(max_steps=workload.steps + 1, save_every=10**6, val_every=10**6,
                            log_completions_every=10**6, report_to=[], val_max_new_tokens=VAL_TOKENS)
        out["train"]["curriculum"] = {**out["train"].get("curriculum", {}), "use_sent": False}
    if stage == "sent":
        out["sent"]["save_every"] = 10**6
    return out


def rows_for(stage: str, params: dict, workload: Workload) -> int:
    if workload.questions:
        return workload.questions
    if stage == "train":
        return params["train"]["prompts_per_step"] * (workload.steps + 1)
    return 2 * params[stage]["batch_size"]


def make_scratch(project: Path, scratch: Path, params: dict, stage: str, benchmark: str | None,
                 workload: Workload) -> None:
    """A project folder that runs the stage: params.yaml, models/base linked, a few prepared rows (and one
    validation question)."""
    prepared = project / "data" / "prepared"
    for need in (project / "models" / "base", prepared / "train.jsonl"):
        if not need.exists():
            raise FileNotFoundError(f"{need} not found: run `dvc repro prepare base_model` first (the tuner "
                                    "measures your model on your data)")
    (scratch / "models").mkdir(parents=True, exist_ok=True)
    (scratch / "data" / "prepared" / "eval").mkdir(parents=True, exist_ok=True)
    (scratch / "models" / "base").symlink_to((project / "models" / "base").resolve())
    n = rows_for(stage, params, workload)
    # one validation question: the train stage's end-of-run validation is not what a trial measures, and
    # a profiled run's allocator history (a ring of its last events) should end with its training steps
    files = {"train.jsonl": n, "val.jsonl": 1} | ({f"eval/{benchmark}.jsonl": n} if benchmark else {})
    for rel, k in files.items():
        rows = read_jsonl(prepared / rel)
        write_jsonl(scratch / "data" / "prepared" / rel, (rows * (1 + k // max(len(rows), 1)))[:k] if rows else [])
    (scratch / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def stage_args(stage: str, benchmark: str | None) -> list[str]:
    return [stage] + (["--model", "base", "--benchmark", benchmark] if stage == "evaluate" else [])


def run_seconds_a_step(warm_up_s: float, steady_s: float, run_steps: int) -> float:
    """Seconds a step over a whole run of ``run_steps``: the first step's one-off costs (compiles, plans,
    caches) spread over the run, the steady step time for the rest. A setting that compiles for 25 s to
    save 1 s a step wins a 500-step run and loses an 8-step one, and this figure says so."""
    return (warm_up_s + (run_steps - 1) * steady_s) / run_steps


def measure(scratch: Path, stage: str, benchmark: str | None) -> tuple[float | None, dict[str, Any]]:
    """(speed, figures) from the stage's measured log. Train: the median step time after the warm-up step
    (the median keeps a one-off, such as a new prompt length's recompile, out of the steady figure), with
    the warm-up step's time among the figures (``run_seconds_a_step`` weighs the two for a run). Sent and
    evaluate: generated tokens per second."""
    if stage == "train":
        steps = (read_log(scratch / TRAIN) or {}).get("steps", [])
        if len(steps) < 2:
            return None, {}
        times = [s["time_generate_s"] + s["time_train_s"] for s in steps]
        steady = statistics.median(times[1:])
        return steady, {
            "warm_up_s": times[0], "steady_s": steady, "step_s": times[1:],
            "generate_s": [round(s["time_generate_s"], 3) for s in steps[1:]],
            "train_s": [round(s["time_train_s"], 3) for s in steps[1:]], "peak_gib": phase_peaks(steps)}
    log = read_log(scratch / SENT if stage == "sent" else eval_log(scratch, "base", benchmark or "")) or {}
    return log.get("tokens_per_s"), {k: v for k, v in log.items() if k.endswith("_s")}


def phase_peaks(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Each phase's peak over a run's steps (GiB: ``peak_memory_gib/<phase>`` of the step log)."""
    peaks: dict[str, float] = {}
    for step in steps:
        for key, value in step.items():
            if key.startswith("peak_memory_gib/"):
                phase = key.split("/", 1)[1]
                peaks[phase] = round(max(peaks.get(phase, 0.0), value), 3)
    return peaks


def run_peak(end_peak: float | None, figures: dict[str, Any]) -> float | None:
    """A trial's peak (GiB). The allocator's peak read at the end of the run is only the peak since the last
    phase began (each phase resets it to measure its own: grpo.microbatch.phase_peak_memory), so the run's
    peak is the larger of it and every phase's (``figures["peak_gib"]``, from ``measure``)."""
    peaks = [end_peak, *figures.get("peak_gib", {}).values()]
    return max((p for p in peaks if p is not None), default=None)


def failure_line(stderr: str, rc: int) -> str:
    """Why a trial's process failed, in one line: its last ``error:`` line (grpo.cli's report), else its last
    line that is not a progress bar (tqdm redraws its bar on stderr as the stage dies, after the error)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    others = [line for line in lines if not TQDM_BAR.search(line)]
    return ((errors or others)[-1:] or [f"exit {rc}"])[0][:200]


def run_trial(project: Path, scratch: Path, raw: dict, stage: str, settings: dict[str, Any], *,
              benchmark: str | None = None, workload: Workload = Workload(), cap_gib: float | None = None,
              timeout_s: float = 600.0, profile_dir: Path | None = None) -> Outcome:
    """Run one trial of ``stage`` with ``settings``; never raises for what the stage does. With
    ``profile_dir`` the run is profiled into it (grpo/profile.py)."""
    make_scratch(project, scratch, trial_params(raw, stage, settings, workload), stage, benchmark, workload)
    result = scratch / "trial_result.json"
    cmd = [sys.executable, "-m", "grpo.tuning.trial", "--result", str(result)]
    cmd += ["--cap-gib", str(cap_gib)] if cap_gib else []
    cmd += ["--profile", str(profile_dir), "--profile-steps", str(workload.steps)] if profile_dir else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd + ["--"] + stage_args(stage, benchmark), cwd=scratch, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Outcome("timeout", wall_s=time.perf_counter() - t0, detail=f"killed after {timeout_s:g} s")
    wall = time.perf_counter() - t0
    (scratch / "trial.log").write_text(proc.stdout + proc.stderr)
    child = json.loads(result.read_text()) if result.exists() else {"rc": proc.returncode}
    speed, figures = measure(scratch, stage, benchmark)
    peak = run_peak(child.get("peak_allocated_gib"), figures)
    ooms = child.get("oom_events", 0) + child.get("cuda_ooms", 0)
    if child["rc"] != 0 or ooms:
        status = "oom" if ooms or "out of memory" in proc.stderr.lower() else "failed"
        detail = f"{ooms} out-of-memory event(s) absorbed" if child["rc"] == 0 else \
            failure_line(proc.stderr, child["rc"])
        return Outcome(status, speed, peak, wall, detail, figures)
    return Outcome("ok", speed, peak, wall, "", figures)


class _OOMCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += record.getMessage().startswith(OOM_PREFIX)


def _run_stage(name: str) -> None:
    runpy.run_module(f"stages.{name}", run_name="__main__")


def _child(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo.tuning.trial")
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--cap-gib", type=float)
    parser.add_argument("--profile", type=Path, help="profile the stage into this folder (grpo/profile.py)")
    parser.add_argument("--profile-steps", type=int, default=1, help="training steps to trace after the warm-up")
    parser.add_argument("stage", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    stage = [a for a in args.stage if a != "--"]
    import torch

    cuda = torch.cuda.is_available()
    if cuda and args.cap_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * GIB / total))
    counter = _OOMCounter()
    logging.getLogger("grpo").addHandler(counter)
    rc = 0
    sys.argv = [f"stages/{stage[0]}.py"] + stage[1:]
    try:
        if args.profile:
            from grpo.profile import memory_history_safe, profiled

            memory = memory_history_safe(yaml.safe_load(Path("params.yaml").read_text()))  # the scratch project's
            with profiled(args.profile, cuda, args.profile_steps, memory):
                _run_stage(stage[0])
        else:
            _run_stage(stage[0])
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - a trial reports every failure as its outcome
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        rc = 1
    stats = torch.cuda.memory_stats() if cuda else {}
    args.result.write_text(json.dumps({
        "rc": rc, "oom_events": counter.count, "cuda_ooms": stats.get("num_ooms", 0),
        "peak_allocated_gib": (stats.get("allocated_bytes.all.peak", 0) / GIB if cuda
                               else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)}))
    return rc


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
