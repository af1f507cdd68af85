"""DVC stage prepare: load, normalise, dedupe, decontaminate and split the datasets.

Outputs data/prepared/{train,val}.jsonl, data/prepared/eval/<benchmark>.jsonl and metrics/prepare.json.
Run from the project root: python -m stages.prepare [--params params.yaml]
"""
from pathlib import Path

from grpo.cli import run_stage
from grpo.data.prepare import prepare_datasets, write_prepared

OUT = Path("data/prepared")
METRICS = Path("metrics/prepare.json")
BUNDLED = Path("data/bundled")


def main(params, args) -> None:
    p = params["prepare"]
    prepared = prepare_datasets(
        train_sources=p.train_sources,
        eval_benchmarks=p.benchmarks,
        val_fraction=p.val_fraction,
        max_train=p.max_train,
        max_val=p.max_val,
        max_eval=p.max_eval,
        seed=p.seed,
        source=p.source,
        data_dir=BUNDLED,
        max_unparsable_fraction=p.max_unparsable_fraction,
        arith_levels=p.arith_levels,
    )
    write_prepared(prepared, OUT, METRICS)


if __name__ == "__main__":
    run_stage("prepare", ["prepare"], main)
