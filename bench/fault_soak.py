"""Fault soak: many random kill -9s of the train and sent stages under real `dvc repro`, on the tiny model.

Each cycle starts from no checkpoints (or no SENT progress), then reruns `dvc repro <stage>` with a
random fault (a GRPO_FAULT_KILL point with a random hit number, or for train an OOM storm at size 1)
until a run completes; then it compares the outputs with an uninterrupted run's. After every fault it
checks that nothing visible is half-written. The counts (tried, fired, cycles, mismatches) go to
bench/results/fault_soak.json and bench/RELIABILITY.md.

    nice -n 19 python -m bench.fault_soak --faults 30 --seed 0

It reuses the fault suite's checks (tests/faults/test_kill_stages.py), so it runs from a checkout with
the test dependencies installed.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from grpo.io import atomic_write_json
from tests.faults.test_kill_stages import (
    TRAIN,
    assert_nothing_half_written,
    assert_same_train_outputs,
    leftovers,
    sent_outputs,
    train_outputs,
)
from tests.pipeline.project import copy_project, edit_params, run
from tests.tiny_model import make_varied_length_model_dir

TRAIN_POINTS = ["train.step", "checkpoint.write", "checkpoint.prune", "replace:step", "train.finish",
                "replace:final", "train.summary", "oom"]
SENT_POINTS = ["sent.batch", "replace:sent"]


def fault_env(point: str, rng: random.Random) -> tuple[dict[str, str], str]:
    """The environment for one faulty run, and its label."""
    if point == "oom":
        return {"GRPO_FAULT_OOM": "train:all"}, "oom train:all"
    if point == "replace:step":
        spec = f"replace:step-{rng.randint(1, TRAIN['max_steps']):06d}"
    elif point in ("train.step", "checkpoint.write", "checkpoint.prune"):
        spec = f"{point}@{rng.randint(1, 3)}"
    elif point == "sent.batch":
        spec = f"{point}@{rng.randint(1, 3)}"
    else:
        spec = point
    return {"GRPO_FAULT_KILL": spec}, spec


def soak(project: Path, stage: str, points: list[str], faults: int, rng: random.Random, expected, outputs,
         reset, compare) -> dict:
    tried, fired, cycles, mismatches = Counter(), Counter(), 0, 0
    reset()
    for _ in range(faults):
        point = rng.choice(points)
        env, label = fault_env(point, rng)
        proc = run(["dvc", "repro", stage], project, check=False, **env)
        tried[point] += 1
        if proc.returncode != 0:
            assert "SIGKILL at" in proc.stderr or "out of memory" in proc.stderr, proc.stderr[-3000:]
            fired[point] += 1
            assert_nothing_half_written(project)
            print(f"{stage}: {label}: killed", flush=True)
            continue
        print(f"{stage}: {label}: not reached; run completed", flush=True)  # the point lay behind the resume
        try:
            compare(outputs(project), expected)
        except AssertionError:
            mismatches += 1
        cycles += 1
        reset()
    run(["dvc", "repro", stage], project)  # finish the last cycle
    try:
        compare(outputs(project), expected)
    except AssertionError:
        mismatches += 1
    assert leftovers(project) == [], leftovers(project)
    return {"tried": dict(tried), "fired": dict(fired), "cycles_completed": cycles + 1, "mismatches": mismatches}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=30, help="faulty runs per stage")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/results/fault_soak.json")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = make_varied_length_model_dir(tmp / "model")
        project = copy_project(tmp / "project")
        edit_params(project, model={"source": str(model)},
                    prepare={"benchmarks": ["gsm8k"], "max_train": 12, "max_val": 2, "max_eval": {"gsm8k": 2}},
                    sent={"engine": "native", "M": 2, "max_new_tokens": 6, "batch_size": 4, "save_every": 4,
                          "num_stages": 2}, train=TRAIN)
        run(["dvc", "repro", "train"], project)
        sent_expected, train_expected = sent_outputs(project), train_outputs(project)

        def reset_sent() -> None:
            shutil.rmtree(project / "data/sent_progress", ignore_errors=True)
            shutil.rmtree(project / "data/sent", ignore_errors=True)

        def reset_train() -> None:
            shutil.rmtree(project / "models/checkpoints", ignore_errors=True)

        def same(got, expected) -> None:
            assert got == expected

        results = {
            "sent": soak(project, "sent", SENT_POINTS, args.faults // 3, rng, sent_expected, sent_outputs,
                         reset_sent, same),
            "train": soak(project, "train", TRAIN_POINTS, args.faults, rng, train_expected, train_outputs,
                          reset_train, assert_same_train_outputs),
        }
    results.update(seed=args.seed, wall_s=round(time.time() - start, 1), date=time.strftime("%Y-%m-%d"))
    atomic_write_json(args.out, results)
    print(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
