"""Every GPU stage of the pipeline run as a user runs it, under an 8 GiB cap, in one call (issue 13).

    python bench/gpu_stages.py            # one GPU: R1-shape random model, presets/rtx3060ti-8gb.yaml
    python bench/gpu_stages.py --smoke    # a CPU: tiny random model, tiny sizes, no cap (checks the script)

It builds the model folder (bench/r1_model.py: random weights at the DeepSeek-R1-Distill-Qwen-1.5B
config, a GSM8K byte-level BPE of 151,936 ids), writes a project folder (``--work``) whose params.yaml is
the preset with ``model.source`` pointing at that folder, small data caps (``DEVICE_SETTINGS``; ``--set
key=value`` adds more) and the evaluate protocols of the issue, links the bundled data, and runs the
stage scripts there one after another (``python -m stages.<name>``): base_model, prepare, sent, train,
and evaluate of base and final on each benchmark. bench/gpu_stages_site/sitecustomize.py caps each GPU
stage's allocator at ``--cap-gib`` less ``--context-gib`` (a real card's CUDA context) and records its
peaks at exit. For each stage it writes the wall time, return code, log tail, measured peaks, the memory
plan of the same params (grpo/stage_plans.py, at the longest prompt really in the data; the plan counts
the 0.75 GiB runtime allowance, the measurement does not) and the tokens/s of the stage's metrics into
``$OUT/<name>.json`` (``--name``, default gpu_stages; $OUT default bench/results/), rewritten after
every stage, and each stage's output into ``$OUT/<name>_logs/``. A failing stage is recorded and the run goes on; a stage not started
before ``--deadline-s`` is recorded as skipped, and one still running then is killed and recorded.
``--stages`` runs some stages in the project folder of an earlier call (a warm machine keeps /tmp).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.r1_model import build_model_dir  # noqa: E402

SITE = Path(__file__).resolve().parent / "gpu_stages_site"
PRESET = ROOT / "presets" / "rtx3060ti-8gb.yaml"
BENCHMARKS = ("aime24", "math500", "gsm8k")  # the longest first: the memory test that matters most runs early
# the protocols: gsm8k 2,048 new tokens, math500 4,096, aime24 n 8 and 8,192
PROTOCOLS = {"gsm8k": {"n": 1, "max_new_tokens": 2048}, "math500": {"n": 1, "max_new_tokens": 4096},
             "aime24": {"n": 8, "max_new_tokens": 8192}}
# data caps that fit the device time: 3 training steps of 16 prompts over 48 questions (SENT scores them
# in 3 calls of 16 x M 8), and a few questions per benchmark (aime24: 2 x n 8 = 16 sequences)
DEVICE_SETTINGS = {"prepare.max_train": 48, "prepare.max_val": 8, "train.max_steps": 3,
                   "prepare.max_eval": {"gsm8k": 16, "math500": 8, "aime24": 2}}
SMOKE_SETTINGS = {"prepare.max_train": 8, "prepare.max_val": 2, "train.max_steps": 2, "train.device": "cpu",
                  "prepare.max_eval": {b: 2 for b in BENCHMARKS}, "sent.engine": "native", "evaluate.engine": "native",
                  "sent.max_new_tokens": 8, "train.max_response_length": 8, "train.val_max_new_tokens": 8,
                  "train.prompts_per_step": 4, "train.generation_batch_size": 16, "train.train_batch_size": 8,
                  **{f"evaluate.benchmarks.{b}.max_new_tokens": 8 for b in BENCHMARKS}}
GIB = 2**30
# what the stages import beyond torch, transformers, bitsandbytes and triton (sent draws a histogram;
# math500/aime24 answers are checked with math-verify): a missing one fails its stages, so it is named first
NEEDED_MODULES = ("yaml", "tqdm", "numpy", "safetensors", "tokenizers", "bitsandbytes", "matplotlib",
                  "math_verify", "latex2sympy2_extended.latex2sympy2",
                  "dvclive")


def unimportable() -> list[str]:
    """NEEDED_MODULES that fail to import (found is not enough: a copied package may lack its metadata)."""
    failed = []
    for name in NEEDED_MODULES:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - any failure means the stages that need it fail
            failed.append(f"{name} ({type(err).__name__}: {err})")
    return failed


def set_key(raw: dict, key: str, value) -> None:
    *path, last = key.split(".")
    for part in path:
        raw = raw.setdefault(part, {})
    raw[last] = value


def write_params(work: Path, model_dir: Path, smoke: bool, extra: list[str]) -> tuple[dict, list[str]]:
    """params.yaml of the run; returns (raw params, the protocol settings that differ from the preset)."""
    raw = yaml.safe_load(PRESET.read_text())
    changed = [f"evaluate.benchmarks.{b}.{k}: {raw['evaluate']['benchmarks'][b][k]} -> {v}"
               for b, protocol in PROTOCOLS.items() for k, v in protocol.items()
               if raw["evaluate"]["benchmarks"][b][k] != v]
    settings = {**{f"evaluate.benchmarks.{b}.{k}": v for b, p in PROTOCOLS.items() for k, v in p.items()},
                **DEVICE_SETTINGS, **(SMOKE_SETTINGS if smoke else {}), "model.source": str(model_dir)}
    for item in extra:
        key, _, value = item.partition("=")
        settings[key] = yaml.safe_load(value)
    for key, value in settings.items():
        set_key(raw, key, value)
    (work / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return raw, changed


def stage_list() -> list[tuple[str, list[str]]]:
    """(name, the module and arguments after ``python -m``) in pipeline order."""
    stages = [(name, [f"stages.{name}"]) for name in ("base_model", "prepare", "sent", "train")]
    return stages + [(f"evaluate {m}/{b}", ["stages.evaluate", "--model", m, "--benchmark", b])
                     for b in BENCHMARKS for m in ("base", "final")]


def run_stage(name: str, module: list[str], work: Path, logs: Path, *, cap_gib: float | None,
              timeout: float) -> dict:
    """One stage as a subprocess of its own session (killed whole at the timeout), capped and recorded."""
    slug = re.sub(r"\W+", "_", name)
    record = work / "records" / f"{slug}.json"
    record.parent.mkdir(exist_ok=True)
    record.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "GPU_STAGES_RECORD": str(record), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if cap_gib is not None:
        env["GPU_STAGES_CAP_GIB"] = str(cap_gib)
    log = logs / f"{slug}.log"
    start = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", *module], cwd=work, env=env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | str = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the stage and its compile workers
            proc.wait()
            rc = "killed at the deadline"
    text = log.read_text(errors="replace")
    result = {"stage": name, "command": f"python -m {' '.join(module)}", "rc": rc,
              "wall_s": round(time.perf_counter() - start, 1), "log": str(log.relative_to(logs.parent)),
              "oom_lines": sum(1 for line in text.splitlines() if re.search(r"out of memory|OutOfMemory", line, re.I)),
              "log_tail": text.splitlines()[-25:]}
    if record.is_file():
        result["measured"] = json.loads(record.read_text())
    return result


def plans(work: Path, raw: dict, *, cuda: bool, budget: int) -> dict[str, dict]:
    """The memory plan of each stage's phases for the run's params, keyed by stage name."""
    from grpo.config import load_params
    from grpo.memory_plan import resolve_arch
    from grpo.stage_plans import SECTIONS, data_prompt_tokens, largest_fitting, plan_stages

    params = load_params(work / "params.yaml", SECTIONS)
    arch = resolve_arch(params["model"].source, base_dir=work / "models" / "base")
    by = data_prompt_tokens(work, raw)
    kwargs = {"cuda": cuda, "prompt_tokens": max(by.values()), "prompt_tokens_by": by, "budget": budget}
    planned: dict[str, dict] = {}
    for phase in plan_stages(params, arch, **kwargs):
        stage = phase.stage.replace("final,best", "final")
        entry = planned.setdefault(stage, {"prompt_tokens": by.get(stage.split("/")[-1], by.get(stage)),
                                           "peak_GiB": 0.0, "phases": []})
        entry["phases"].append({
            "phase": phase.name, "sequences": phase.sequences, "requested": phase.requested or phase.sequences,
            "tokens": phase.tokens,
            "peak_GiB": round(phase.peak / GIB, 3),
            "peak_without_runtime_GiB": round((phase.peak - phase.row("runtime")) / GIB, 3),
            "rows_GiB": {k: round(v / GIB, 3) for k, v in phase.rows if v},
            "knob": phase.knob, "largest_knob_value_that_fits": largest_fitting(params, phase, arch, **kwargs)})
        entry["peak_GiB"] = max(entry["peak_GiB"], round(phase.peak / GIB, 3))
    return planned


def stage_metrics(work: Path, name: str) -> dict:
    """Throughput (and train's per-step peaks) from the files the stage wrote."""
    metrics = work / "metrics"
    logs = work / "logs"  # measured figures (grpo/measured.py); metrics/ holds results only
    if name == "sent" and (logs / "sent.json").is_file():
        return {k: v for k, v in json.loads((logs / "sent.json").read_text()).items()
                if "token" in k or k.endswith("_s")}
    if name == "train" and (logs / "train.json").is_file():
        keep = re.compile(r"tokens_per_s|^time_|peak|micro_batch|oom")
        rows = json.loads((logs / "train.json").read_text())["steps"]
        return {"steps": [{k: v for k, v in row.items() if keep.search(k) or k == "step"} for row in rows]}
    if name.startswith("evaluate "):
        model, benchmark = name.split()[1].split("/")
        found = {}
        for path in (metrics / "eval" / model / f"{benchmark}.json", logs / "eval" / model / f"{benchmark}.json"):
            if path.is_file():
                found.update(json.loads(path.read_text()))
        return {k: found[k] for k in ("tokens_per_s", "generate_s", "mean_length", "truncation_rate", "pass@1")
                if k in found}
    return {}


def environment(smoke: bool, cap: float | None) -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "smoke": smoke, "cap_GiB": cap,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"}
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                        check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        info["commit"] = None  # a copy of the tree without .git
    return info


def run_peak_gib(result: dict) -> float | None:
    """A stage's allocator peak over its run. The peak recorded at exit is the process's since its last
    reset, and the train stage resets it at each phase of each step to measure that phase
    (grpo.microbatch.phase_peak_memory): its run peak is the larger of that and its phases' peaks."""
    from grpo.tuning.trial import phase_peaks, run_peak

    steps = result.get("metrics", {}).get("steps", [])
    return run_peak(result.get("measured", {}).get("peak_allocated_GiB"), {"peak_gib": phase_peaks(steps)})


def summary_line(r: dict) -> str:
    m, plan = r.get("measured", {}), r.get("plan", {})
    speed = r.get("metrics", {}).get("tokens_per_s")
    if speed is None and r.get("metrics", {}).get("steps"):
        speed = r["metrics"]["steps"][-1].get("rollout_tokens_per_s")
    cells = [r["stage"], r["rc"], r.get("wall_s", ""), r.get("peak_allocated_run_GiB") or "",
             m.get("peak_reserved_GiB", ""),
             plan.get("peak_GiB", ""), "" if speed is None else round(speed)]
    return "  ".join(f"{c!s:>{w}}" for c, w in zip(cells, (24, 6, 7, 10, 9, 9, 8)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model and sizes on the CPU, no cap")
    parser.add_argument("--cap-gib", type=float, default=8.0, help="the card's memory (default 8)")
    parser.add_argument("--context-gib", type=float, default=0.5, help="its CUDA context, outside the cap")
    parser.add_argument("--deadline-s", type=float, default=560.0, help="start no stage after this (default 560)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_stages_work"))
    parser.add_argument("--model-dir", type=Path, help="default /tmp/gpu_stages_model (smoke: ..._smoke)")
    parser.add_argument("--stages", help="comma-separated names or prefixes to run (default: all)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a params override")
    parser.add_argument("--name", default="gpu_stages", help="of the JSON and log folder under $OUT")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    out = Path(os.environ.get("OUT") or ROOT / "bench" / "results")
    logs = out / f"{args.name}_logs"
    logs.mkdir(parents=True, exist_ok=True)
    cap = None if args.smoke else args.cap_gib
    results: dict = {"environment": environment(args.smoke, cap), "stages": [], "missing_modules": unimportable()}
    if results["missing_modules"]:
        print(f"warning: cannot import here: {', '.join(results['missing_modules'])}; stages that need them fail")
    model_dir = args.model_dir or Path("/tmp/gpu_stages_model" + ("_smoke" if args.smoke else ""))
    build_model_dir(model_dir, smoke=args.smoke, device="cpu" if args.smoke else "cuda")
    results["build_model_s"] = round(time.perf_counter() - t0, 1)
    if not args.stages and args.work.exists():
        shutil.rmtree(args.work)  # a fresh run: no checkpoint to resume, no output left from before
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "data").mkdir(exist_ok=True)
    if not (args.work / "data" / "bundled").exists():
        (args.work / "data" / "bundled").symlink_to(ROOT / "data" / "bundled")
    raw, changed = write_params(args.work, model_dir, args.smoke, args.set)
    results.update(params=raw, protocol_changes_from_preset=changed)
    wanted = None if not args.stages else [s.strip() for s in args.stages.split(",")]
    planned: dict[str, dict] = {}
    print(f"{'stage':>24}  {'rc':>6}  {'wall_s':>7}  {'alloc_GiB':>10}  {'rsrv_GiB':>9}  {'plan_GiB':>9}  {'tok/s':>8}")
    for name, module in stage_list():
        if wanted and not any(name == w or name.startswith(w) for w in wanted):
            continue
        left = args.deadline_s - (time.perf_counter() - t0)
        if left <= 0:
            results["stages"].append({"stage": name, "rc": "skipped: deadline"})
            continue
        gpu_stage = name not in ("base_model", "prepare")
        result = run_stage(name, module, args.work, logs, timeout=left,
                           cap_gib=cap - args.context_gib if cap is not None and gpu_stage else None)
        if not planned and (args.work / "data" / "prepared" / "train.jsonl").is_file():
            try:
                planned = plans(args.work, raw, cuda=not args.smoke, budget=int((cap or 1e6) * GIB))
            except (OSError, ValueError, KeyError) as exc:  # recorded; the stages still run
                results["plan_error"] = f"{type(exc).__name__}: {exc}"
        result["plan"] = planned.get(name, {})
        result["metrics"] = stage_metrics(args.work, name)
        result["peak_allocated_run_GiB"] = run_peak_gib(result)
        results["stages"].append(result)
        print(summary_line(result), flush=True)
        (out / f"{args.name}.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    results["total_s"] = round(time.perf_counter() - t0, 1)
    (out / f"{args.name}.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    failed = [r["stage"] for r in results["stages"] if r["rc"] != 0]
    print(f"done in {results['total_s']} s; {out / f'{args.name}.json'}; not completed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
