"""DVC stage select: pick the best checkpoint from the in-training validation log (never from benchmarks).

Reads the validation log (metrics/train/plots/metrics/eval/, DVCLive's files) and
models/checkpoints/<checkpoint>/adapter/; writes models/best/
(the chosen adapter plus SELECTION.json). The rule is params select.metric, select.mode (max|min) and
select.tie (earliest|latest).
Run from the project root: python -m stages.select [--params params.yaml]
"""
from pathlib import Path

from grpo.cli import run_stage
from grpo.select import select_checkpoint, write_best
from grpo.trainlog import LIVE_DIR, validation_dir

VALIDATION_LOG = validation_dir(LIVE_DIR)
CHECKPOINTS = Path("models/checkpoints")
OUT = Path("models/best")


def main(params, args) -> None:
    p = params["select"]
    selection = select_checkpoint(VALIDATION_LOG, CHECKPOINTS, metric=p.metric, mode=p.mode, tie=p.tie)
    write_best(selection, CHECKPOINTS, OUT)


if __name__ == "__main__":
    run_stage("select", ["select"], main)
