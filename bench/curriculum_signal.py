"""How much learning signal each curriculum stage carries, under each SENT order, from one SENT run.

Reads a SENT scores file (``data/sent/scores.jsonl``), builds the curriculum under every order of
``grpo.config.SENT_ORDERS`` with the same stages and seed, and prints per stage: the questions' mean
pass rate, how many are all-wrong or all-correct (zero correctness variance in SENT's M samples), and
the expected fraction of training groups of ``--group-size`` whose correctness is uniform,
``p**G + (1 - p)**G`` per question (the correctness part of ``frac_reward_zero_std``; format rewards
can still differ inside such a group). The measured ``frac_reward_zero_std`` by stage is in each
training run's summary (``metrics/train/metrics.json``).

    .venv/bin/python bench/curriculum_signal.py [--scores data/sent/scores.jsonl] [--stages 3] [--group-size 4]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo.config import SENT_ORDERS  # noqa: E402
from grpo.io import read_jsonl  # noqa: E402
from grpo.sent.curriculum import build_curriculum  # noqa: E402


def stage_table(scores: list[dict], stages: int, group_size: int, seed: int) -> list[dict]:
    by_id = {s["id"]: s for s in scores}
    rows = []
    for order in SENT_ORDERS:
        cur = build_curriculum(scores, stages, drop_all_correct=False, drop_all_wrong=False, seed=seed, order=order)
        for k, ids in enumerate(cur["stages"]):
            p = [by_id[i]["pass_rate"] for i in ids]
            rows.append({"order": order, "stage": k, "questions": len(ids), "mean_pass_rate": sum(p) / len(p),
                         "all_wrong": sum(x == 0 for x in p), "all_correct": sum(x == 1 for x in p),
                         "expected_uniform_groups": sum(x ** group_size + (1 - x) ** group_size for x in p) / len(p)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scores", type=Path, default=ROOT / "data/sent/scores.jsonl")
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = stage_table(read_jsonl(args.scores), args.stages, args.group_size, args.seed)
    print("| order | stage | questions | mean pass rate | all wrong | all correct | expected uniform groups |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['order']} | {r['stage']} | {r['questions']} | {r['mean_pass_rate']:.3f} | {r['all_wrong']} | "
              f"{r['all_correct']} | {r['expected_uniform_groups']:.2f} |")


if __name__ == "__main__":
    main()
