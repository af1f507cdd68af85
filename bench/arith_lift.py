"""Lift of a trained model over the base on one benchmark, with its paired standard error.

Both models answered the same questions, so the lift's standard error is the paired one:
SE = std(ddof=1) of the per-question difference (trained correct - base correct) / sqrt(n), where a
question's correctness is the mean over its samples. Inputs are evaluate's per-sample files
(eval/<model>/<benchmark>.jsonl: ``id``, ``correct``, ``finish_reason``, ``length``), read from the work
tree or, with ``--rev``, from a git revision's dvc.lock and the DVC cache (a `dvc exp run` experiment's
ref, say). The held-out level-0 questions repeat 64 additions under other names, so the script also
prints the standard error clustered by the question's numbers (a second opinion, not issue 19's
measure). Issue 19's bar for arith-cpu: a lift of at least 10 points and at least 3 paired SE.

    python bench/arith_lift.py                           # eval/base vs eval/final and eval/best, arith
    python bench/arith_lift.py --rev refs/exps/..../name # the same, from an experiment's outputs
"""
from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from grpo.eval.metrics import paired_lift  # noqa: E402
from grpo.eval.summary import question_scores  # noqa: E402
from grpo.io import read_jsonl  # noqa: E402

CACHE = Path(".dvc/cache/files/md5")


def samples_path(model: str, benchmark: str, rev: str | None) -> Path:
    """eval/<model>/<benchmark>.jsonl: in the work tree, or (``rev``) the DVC cache file that revision's
    dvc.lock names for it."""
    path = f"eval/{model}/{benchmark}.jsonl"
    if rev is None:
        return Path(path)
    lock = yaml.safe_load(subprocess.run(["git", "show", f"{rev}:dvc.lock"], check=True, capture_output=True,
                                         text=True).stdout)
    for stage in lock["stages"].values():
        for out in stage.get("outs", []):
            if out["path"] == path:
                md5 = out["md5"]
                return CACHE / md5[:2] / md5[2:]
    raise KeyError(f"{path} is not an output in {rev}:dvc.lock")


def questions(benchmark: str) -> dict[str, str]:
    """Question text by id, from data/prepared/eval/<benchmark>.jsonl (the work tree's; where it lacks an id,
    that question is its own cluster)."""
    path = Path(f"data/prepared/eval/{benchmark}.jsonl")
    return {str(r["id"]): r["question"] for r in read_jsonl(path)} if path.exists() else {}


def clustered_se(diffs: dict[str, float], keys: dict[str, str]) -> float:
    """Cluster-robust SE of the mean difference, a cluster being the questions with the same numbers."""
    mean, n = sum(diffs.values()) / len(diffs), len(diffs)
    sums: dict[tuple[str, ...], float] = {}
    for k, d in diffs.items():
        cluster = tuple(re.findall(r"\d+", keys.get(k, k)))
        sums[cluster] = sums.get(cluster, 0.0) + d - mean
    g = len(sums)
    return math.sqrt(g / (g - 1) * sum(s * s for s in sums.values())) / n if g > 1 else float("nan")


def lift(base: Path, trained: Path, keys: dict[str, str]) -> dict[str, float]:
    """pass@1 of both samples files, the lift in points, its paired SE in points (per question and paired
    as eval_summary computes them: question_scores, paired_lift), the lift in SE units and the SE
    clustered by the numbers in the question (``keys``: question text by id)."""
    b, t = question_scores(base), question_scores(trained)
    paired = paired_lift(b, t)
    return {"n": paired.n, "base": sum(b.values()) / paired.n, "trained": sum(t.values()) / paired.n,
            "lift_pts": 100 * paired.lift, "se_pts": 100 * paired.stderr,
            "lift_se": paired.z if paired.z is not None else float("nan"),
            "cluster_se_pts": 100 * clustered_se({k: t[k] - b[k] for k in b}, keys)}


def shape(path: Path) -> str:
    """Answer rate, truncation rate and mean length in tokens of a samples file."""
    records = read_jsonl(path)
    n = len(records)
    answered = sum(r.get("answer") is not None for r in records) / n
    cut = sum(r.get("finish_reason") == "length" for r in records) / n
    return f"answer rate {answered:.2f}, truncated {cut:.2f}, mean length {sum(r['length'] for r in records) / n:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rev", help="a git revision (experiment ref) whose dvc.lock names the files")
    parser.add_argument("--benchmark", default="arith")
    parser.add_argument("--models", nargs="+", default=["final", "best"])
    args = parser.parse_args()
    base, keys = samples_path("base", args.benchmark, args.rev), questions(args.benchmark)
    print(f"base: {shape(base)}")
    for model in args.models:
        trained = samples_path(model, args.benchmark, args.rev)
        r = lift(base, trained, keys)
        print(f"{model}: n {r['n']}, base {r['base']:.3f}, {model} {r['trained']:.3f}, lift {r['lift_pts']:+.1f} pts, "
              f"paired SE {r['se_pts']:.2f} pts ({r['lift_se']:+.2f} SE; clustered by numbers: "
              f"{r['cluster_se_pts']:.2f} pts); {shape(trained)}")


if __name__ == "__main__":
    main()
