"""The shipped settings' training step against a tuner pick's, over more steps than a tuner trial.

    python bench/steady_step.py [--project .] [--steps 6] [--cap-gib N] --winner '{"train.train_batch_size": 4}'
    python bench/steady_step.py ... --winner '[{"train.train_batch_size": 32}, {"train.dense_training": true}]'

A tuner trial measures a few steps after one warm-up step, and on both a CPU and a GPU the first steps of
a run are slower than the rest (kernels compiled and tuned for new shapes), so a small win in the tuner's
table is checked here: each setting runs the train stage as a tuner trial does (grpo/tuning/trial.py, its
own process, a scratch copy of the project), one after the other, and prints every step's time; a JSON list
of settings runs each after the shipped ones (``winner``, ``winner2``, ...), so one device call ranks them. Needs
``models/base`` and ``data/prepared`` in the project. Writes steady.json and each run's log to --out.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from grpo.tuning.trial import Workload, run_trial  # noqa: E402


def runs(winner: dict | list[dict]) -> list[tuple[str, dict]]:
    """(name, settings) of each run: the shipped settings, then each candidate (an empty one is the shipped
    settings again, so it is not run twice)."""
    candidates = [c for c in (winner if isinstance(winner, list) else [winner]) if c]
    return [("shipped", {})] + [("winner" if i == 0 else f"winner{i + 1}", c) for i, c in enumerate(candidates)]


def steady(project: Path, out: Path, winner: dict | list[dict], steps: int, cap_gib: float | None) -> dict:
    raw = yaml.safe_load((project / "params.yaml").read_text())
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, settings in runs(winner):
        scratch = Path(f"/tmp/steady-{name}")
        shutil.rmtree(scratch, ignore_errors=True)
        outcome = run_trial(project.resolve(), scratch, raw, "train", settings, workload=Workload(steps=steps),
                            cap_gib=cap_gib, timeout_s=1200)
        step_s = outcome.figures.get("step_s", [])
        last3 = statistics.median(step_s[-3:]) if len(step_s) >= 3 else None
        results[name] = {"settings": settings, "last3_median_s": last3, **outcome.__dict__}
        print(f"{name:8s} {outcome.status}: steps {', '.join(f'{s:.2f}' for s in step_s)} s; "
              f"median of the last three {last3 if last3 is None else f'{last3:.2f}'} s", flush=True)
        if (scratch / "trial.log").exists():
            shutil.copy(scratch / "trial.log", out / f"steady_{name}.log")
        (out / "steady.json").write_text(json.dumps(results, indent=1))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, default=Path("."))
    parser.add_argument("--out", type=Path, default=Path("logs/steady"))
    parser.add_argument("--winner", required=True,
                        help="JSON: the settings to compare with the shipped ones, or a list of them")
    parser.add_argument("--steps", type=int, default=6, help="measured steps after the warm-up step")
    parser.add_argument("--cap-gib", type=float, help="on a GPU, cap each run's allocator")
    args = parser.parse_args()
    steady(args.project, args.out, json.loads(args.winner), args.steps, args.cap_gib)


if __name__ == "__main__":
    main()
