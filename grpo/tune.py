"""Find the fastest settings that fit: ``python -m grpo.tune [--budget-gib N] [--stages train,sent,evaluate]
[--trials-s S] [--write]``.

For each stage it searches the knobs that trade memory for speed (grpo/tuning/knobs.py) one at a time,
starting from the params as they are: every candidate value of a knob is first planned (grpo/stage_plans.py,
against the budget) and pruned if it cannot fit, in which case it is planned again with the batch of its phase
that is over the budget cut to what fits (checkpointing off or a dense copy may win at a smaller micro-batch);
what fits is measured by a short real run of the stage on your model and data (grpo/tuning/trial.py: for train
the seconds a step over a run of train.max_steps, the warm-up step's one-off costs spread over it; tokens/s
over two generate calls for sent and evaluate); the best value found is kept before the next knob. On a GPU a
value that only saves memory (a smaller batch, checkpointing on, the 4-bit base for a dense copy) is measured
only once the current setting fails (``leaner``), and a knob with a one-off cost (a compile) is searched last,
the others with it off. A trial that runs out of memory (even one the engine absorbed by shrinking its batch)
or fails is recorded and passed over, never fatal. Prints a table of every trial and the winner against the
shipped settings; ``--write`` puts the winners into params.yaml, keeping its comments and order (they are also
written beside the cache as ``<cache>.winners.json``, and the table as ``<cache>.txt``). Trials are cached in
``logs/tune/<model>-<device>-<budget>.json``, each under its settings and what else it depends on (the model,
prompt and stage params, the project's code and torch's version: ``trial_inputs``), so a rerun measures
nothing again, even after ``--write``, while a changed param or an updated project re-measures.
Needs ``models/base`` and ``data/prepared`` (``dvc repro prepare base_model``).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import yaml

from grpo.check import device_memory
from grpo.cli import positive_number, whole_number
from grpo.config import ConfigError, load_params
from grpo.io import atomic_write_json, atomic_write_text
from grpo.memory_plan import GIB, Phase, resolve_arch
from grpo.stage_plans import SECTIONS, data_prompt_tokens, largest_fitting, plan_stages, with_param
from grpo.tuning.knobs import ONE_OFF_COSTS, SPEED, STAGES, current_settings, faster, knob_values, leaner
from grpo.tuning.params_edit import update_params
from grpo.tuning.trial import Outcome, Workload, run_seconds_a_step, run_trial

CACHE = Path("logs/tune")


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text).strip("-").lower()


@functools.cache
def code_fingerprint(root: Path = Path(__file__).resolve().parent.parent) -> str:
    """A hash of the project's code under ``root`` (grpo/ and stages/ sources) and torch's version."""
    digest = hashlib.sha256(torch.__version__.encode())
    for path in sorted([*root.glob("grpo/**/*.py"), *root.glob("stages/*.py")]):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def trial_inputs(raw: dict, stage: str, settings: dict[str, Any], code: str) -> str:
    """What a trial measures besides its knob ``settings``: the model, prompt and stage sections of the
    params (the knobs' own values left out: ``settings`` holds them) and the ``code`` fingerprint."""
    sections = {name: dict(raw.get(name) or {}) for name in ("model", "prompt", stage)}
    # a run's length changes how a training trial's figures are combined (Tuner.rank), not what it measures
    sections[stage].pop("max_steps", None)
    for key in settings:
        section, _, name = key.partition(".")
        sections.get(section, {}).pop(name, None)
    text = json.dumps(sections, sort_keys=True, default=str) + code
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Tuner:
    """Plans, runs and caches the trials of one (model, device, budget)."""

    def __init__(self, project: Path, raw: dict, budget: int, gpu: bool, cache: Path, *, workload: Workload,
                 trial_s: float, prompt_tokens: int | None = None, run_steps: int | None = None) -> None:
        self.project, self.raw, self.budget, self.gpu = project, raw, budget, gpu
        self.params = load_params(project / "params.yaml", SECTIONS + ["prompt"])
        self.run_steps = run_steps or self.params["train"].max_steps
        self.arch = resolve_arch(self.params["model"].source)
        self.cache_path, self.workload, self.trial_s = cache, workload, trial_s
        # the plan prunes with the longest prompt of your data, unless told a length
        self.prompts_by = {} if prompt_tokens else data_prompt_tokens(project, raw)
        self.prompt_tokens = prompt_tokens or max(self.prompts_by.values())
        self.cache: dict[str, dict] = json.loads(cache.read_text()) if cache.exists() else {}
        self.rows: list[dict] = []

    def plan(self, stage: str, benchmark: str | None,
             settings: dict[str, Any]) -> tuple[dict[str, Any], list[Phase]]:
        """(the params with ``settings`` applied, the planned phases of the stage a trial runs)."""
        params = self.params
        for key, value in settings.items():
            params = with_param(params, key, value)
        name = {"train": "train", "sent": "sent", "evaluate": f"evaluate base/{benchmark}"}[stage]
        phases = plan_stages(params, self.arch, **self.plan_kwargs())
        return params, [p for p in phases if p.stage == name]

    def plan_kwargs(self) -> dict[str, Any]:
        return {"cuda": self.gpu, "prompt_tokens": self.prompt_tokens, "prompt_tokens_by": self.prompts_by,
                "budget": self.budget}

    def planned_peak(self, stage: str, benchmark: str | None, settings: dict[str, Any]) -> float:
        return max((p.peak for p in self.plan(stage, benchmark, settings)[1]), default=0) / GIB

    def shrunk_to_fit(self, stage: str, benchmark: str | None, settings: dict[str, Any],
                      changed: str) -> dict[str, Any] | None:
        """``settings``, which the plan prunes, with the batch knob of its largest phase over the budget
        cut to the largest value that fits (grpo.stage_plans.largest_fitting), so that a knob that costs
        memory (checkpointing off, a dense copy) is still measured where a smaller micro-batch makes room
        for it. None when the phase's knob is the one that ``changed``, is not searched, or not even 1 fits."""
        params, phases = self.plan(stage, benchmark, settings)
        over = [p for p in phases if p.peak > self.budget]
        if not over:
            return None
        phase = max(over, key=lambda p: p.peak)
        if phase.knob == changed or phase.knob not in settings:
            return None
        value = largest_fitting(params, phase, self.arch, **self.plan_kwargs())
        shrunk = {**settings, phase.knob: value}
        return shrunk if value >= 1 and self.planned_peak(stage, benchmark, shrunk) <= self.budget / GIB else None

    def trial(self, stage: str, benchmark: str | None, settings: dict[str, Any], skip: str = "") -> Outcome:
        """Measure (or read from the cache, or prune by the plan) one setting; ``skip``: record it
        unmeasured, for that reason."""
        inputs = trial_inputs(self.raw, stage, settings, code_fingerprint())
        key = json.dumps([stage, benchmark, settings, self.workload.__dict__, inputs], sort_keys=True)
        plan = self.planned_peak(stage, benchmark, settings)
        if key in self.cache:
            outcome, source = Outcome(**self.cache[key]), "cached"
        elif skip:
            outcome, source = Outcome("skipped", detail=skip), "search"
        elif plan > self.budget / GIB:
            outcome, source = Outcome("pruned", detail=f"plan {plan:.2f} GiB > budget"), "plan"
        else:
            with tempfile.TemporaryDirectory(prefix="grpo-tune-") as scratch:
                outcome = run_trial(self.project, Path(scratch), self.raw, stage, settings, benchmark=benchmark,
                                    workload=self.workload, cap_gib=self.budget / GIB if self.gpu else None,
                                    timeout_s=self.trial_s)
                self.keep_log(Path(scratch) / "trial.log", stage, settings)
            self.cache[key] = outcome.__dict__
            atomic_write_json(self.cache_path, self.cache)
            source = "measured"
        outcome = self.rank(stage, outcome)
        self.rows.append({"stage": stage, "settings": settings, "plan_gib": round(plan, 2), "source": source,
                          **outcome.__dict__})
        print(f"  {stage:<8} {describe(settings, self.params)}: {outcome.status}"
              + (f", {outcome.speed:.3g} {SPEED[stage]}" if outcome.speed else "") + f" ({source})", flush=True)
        return outcome

    def rank(self, stage: str, outcome: Outcome) -> Outcome:
        """The outcome as the search compares it: a training trial's seconds a step over this run's length
        (its warm-up step's one-off costs spread over ``run_steps``; the cache keeps what was measured)."""
        figures = outcome.figures
        if stage != "train" or "steady_s" not in figures:
            return outcome
        return dataclasses.replace(outcome, speed=run_seconds_a_step(figures["warm_up_s"], figures["steady_s"],
                                                                     self.run_steps))

    def keep_log(self, log: Path, stage: str, settings: dict[str, Any]) -> None:
        """The trial's output beside the cache (logs/tune/<cache>/<stage>-<settings>.log): why a trial
        was slow or failed is in it."""
        if log.exists():
            folder = self.cache_path.with_suffix("")
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(log, folder / f"{stage}-{slug(describe(settings, self.params))}.log")

    def search(self, stage: str) -> tuple[dict[str, Any], Outcome, Outcome]:
        """Coordinate search from the current params: (winning settings, its outcome, the shipped one's)."""
        benchmark = hardest_benchmark(self.raw) if stage == "evaluate" else None
        knobs = knob_values(stage, self.raw, self.gpu)
        current = best = current_settings(self.params, list(knobs))
        shipped = best_outcome = self.trial(stage, benchmark, best)
        eager = {**best, **{key: False for key in ONE_OFF_COSTS if best.get(key)}}
        if eager != best:  # shipped with a compile: the other knobs are searched without paying it each trial
            best, best_outcome = eager, self.trial(stage, benchmark, eager)
        for key, values in knobs.items():
            for value in values:
                if value == best[key]:
                    continue
                candidate = {**best, key: value}
                if candidate == current:  # back at the shipped settings (a shipped compile): tried first
                    outcome = shipped
                else:
                    skip = ("only saves memory, and a setting that needs more ran cleanly"
                            if self.gpu and best_outcome.status == "ok" and leaner(key, value, best[key]) else "")
                    outcome = self.trial(stage, benchmark, candidate, skip)
                if outcome.status == "pruned":
                    shrunk = self.shrunk_to_fit(stage, benchmark, candidate, key)
                    if shrunk is not None:
                        candidate, outcome = shrunk, self.trial(stage, benchmark, shrunk)
                if outcome.status == "ok" and outcome.speed is not None and (
                        best_outcome.status != "ok" or faster(stage, outcome.speed, best_outcome.speed)):
                    best, best_outcome = candidate, outcome
        if shipped.status == "ok" and best != current and (
                best_outcome.status != "ok" or not faster(stage, best_outcome.speed, shipped.speed)):
            return current, shipped, shipped  # a change must beat the shipped settings by the margin
        return best, best_outcome, shipped


def hardest_benchmark(raw: dict) -> str:
    """The benchmark whose protocol generates the most tokens a question: the one batch size must suit."""
    protocols = raw["evaluate"]["benchmarks"]
    return max(raw["prepare"]["benchmarks"], key=lambda b: protocols[b].get("n", 1) * protocols[b]["max_new_tokens"])


def describe(settings: dict[str, Any], params: dict[str, Any]) -> str:
    """The settings that differ from the params file, or 'as shipped'."""
    changed = [f"{k.split('.')[1]}={v}" for k, v in settings.items() if current_settings(params, [k])[k] != v]
    return ", ".join(changed) or "as shipped"


def table(rows: list[dict], params: dict[str, Any]) -> list[str]:
    lines = [f"{'stage':<9}{'settings (changed from params.yaml)':<58}{'outcome':<9}{'speed':>12}{'peak GiB':>9}"
             f"{'plan GiB':>9}{'wall s':>8}"]
    for r in rows:
        speed = f"{r['speed']:.3g} {SPEED[r['stage']]}" if r["speed"] else "-"
        peak = f"{r['peak_gib']:.2f}" if r["peak_gib"] else "-"
        lines.append(f"{r['stage']:<9}{describe(r['settings'], params)[:57]:<58}{r['status']:<9}{speed:>12}{peak:>9}"
                     f"{r['plan_gib']:>9.2f}{r['wall_s']:>8.1f}" + (f"  {r['detail']}" if r["detail"] else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo.tune", description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--budget-gib", type=positive_number, help="memory to fit (default: the device's; on a GPU "
                        "each trial's allocator is capped to it)")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--trials-s", type=positive_number, default=600.0, help="a trial's time limit (default 600 s)")
    parser.add_argument("--steps", type=whole_number(1), default=2, help="training steps measured after one warm-up step")
    parser.add_argument("--questions", type=whole_number(0), default=0, help="sent/evaluate rows a trial (default 2 batches)")
    parser.add_argument("--run-steps", type=whole_number(1), help="rank training settings over a run of this many steps "
                        "(default: train.max_steps; one-off costs such as a compile are spread over it)")
    parser.add_argument("--prompt-tokens", type=whole_number(1), help="longest prompt the plan assumes (default: the "
                        "longest in data/prepared, for each stage)")
    parser.add_argument("--write", action="store_true", help="write the winners into --params")
    args = parser.parse_args(argv)
    try:
        stages = [s.strip() for s in args.stages.split(",") if s.strip()]
        bad = [s for s in stages if s not in STAGES]
        if bad:
            raise ValueError(f"--stages: unknown stage {bad[0]!r}; choose from {', '.join(STAGES)}")
        raw = yaml.safe_load(args.params.read_text())
        params = load_params(args.params, SECTIONS)
        name, total, gpu = device_memory(params["train"].device)
        gpu = gpu and torch.cuda.is_available()
        budget = int(args.budget_gib * GIB) if args.budget_gib else total
        project = args.params.resolve().parent
        cache = project / CACHE / f"{slug(params['model'].source.split('/')[-1])}-{slug(name)}-{budget / GIB:.1f}gib.json"
        tuner = Tuner(project, raw, budget, gpu, cache, workload=Workload(args.steps, args.questions),
                      trial_s=args.trials_s, prompt_tokens=args.prompt_tokens, run_steps=args.run_steps)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"tuning {', '.join(stages)} on {name} within {budget / GIB:.2f} GiB (cache {cache})")
    winners: dict[str, Any] = {}
    summary = []
    for stage in stages:
        try:
            best, outcome, shipped = tuner.search(stage)
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if outcome.status != "ok":
            summary.append(f"{stage}: no setting ran cleanly within {budget / GIB:.2f} GiB (see the table)")
            continue
        gain = (f"{shipped.speed / outcome.speed:.2f}x" if stage == "train" else f"{outcome.speed / shipped.speed:.2f}x"
                ) if shipped.status == "ok" and shipped.speed else "the shipped settings did not run cleanly"
        summary.append(f"{stage}: {describe(best, tuner.params)} -> {outcome.speed:.3g} {SPEED[stage]} ({gain} the shipped)")
        winners.update({k: v for k, v in best.items() if current_settings(tuner.params, [k])[k] != v})
    lines = table(tuner.rows, tuner.params) + ["", "winner:"] + ["  " + s for s in summary]
    print("\n" + "\n".join(lines))
    atomic_write_text(cache.with_suffix(".txt"), "\n".join(lines) + "\n")
    atomic_write_json(cache.with_suffix(".winners.json"), winners)  # for scripts: what --write would change
    if args.write:
        for change in update_params(args.params, winners) or ["nothing to change: the shipped settings won"]:
            print(f"params: {change}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
