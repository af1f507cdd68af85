"""DVC stage base_model: resolve model.source into models/base/ (a plain HF folder + MODEL_INFO.json).

Run from the project root: python -m stages.base_model [--params params.yaml]
"""
from pathlib import Path

from grpo.cli import run_stage
from grpo.model.base_model import write_base

OUT = Path("models/base")


def main(params, args) -> None:
    m = params["model"]
    write_base(m.source, m.revision, m.dtype, OUT)


if __name__ == "__main__":
    run_stage("base_model", ["model"], main)
