"""DVC stage eval_summary: merge every metrics/eval/<model>/<benchmark>.json into metrics/eval.json
(nested model -> benchmark -> metric, for ``dvc metrics show/diff``) and eval/summary.csv (one row per
model x benchmark, for the report), adding each trained model's paired lift over the base, computed
per question from eval/<model>/<benchmark>.jsonl (grpo/eval/summary.py).
Run from the project root: python -m stages.eval_summary [--params params.yaml]
"""
from pathlib import Path

from grpo.cli import run_stage
from grpo.eval.summary import add_lifts, collect_metrics, write_summary

METRICS_DIR = Path("metrics/eval")
SAMPLES_DIR = Path("eval")  # eval/<model>/<benchmark>.jsonl


def main(params, args) -> None:
    nested = add_lifts(collect_metrics(METRICS_DIR), SAMPLES_DIR)
    write_summary(nested, Path("metrics/eval.json"), Path("eval/summary.csv"))


if __name__ == "__main__":
    run_stage("eval_summary", [], main)
