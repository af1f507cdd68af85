"""DVC stage eval_summary: merge every metrics/eval/<model>/<benchmark>.json into metrics/eval.json
(nested model -> benchmark -> metric, for ``dvc metrics show/diff``) and eval/summary.csv (one row per
model x benchmark, for the report).
Run from the project root: python -m stages.eval_summary [--params params.yaml]
"""
from pathlib import Path

from grpo.cli import run_stage
from grpo.eval.summary import collect_metrics, write_summary

METRICS_DIR = Path("metrics/eval")


def main(params, args) -> None:
    write_summary(collect_metrics(METRICS_DIR), Path("metrics/eval.json"), Path("eval/summary.csv"))


if __name__ == "__main__":
    run_stage("eval_summary", [], main)
