"""What every stage script shares: argument parsing, logging set-up and a clean failure exit."""
from __future__ import annotations

import argparse
import logging
import os
import random
import sys
from typing import Any, Callable

import numpy as np
import torch

from grpo.config import ConfigError, load_params


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_stage(name: str, sections: list[str], main: Callable[[dict[str, Any], argparse.Namespace], None],
              add_args: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """Parse ``--params``, validate the stage's sections, run ``main``; exit 2 with one clear message
    on bad params, bad input or out-of-memory at micro-batch size 1, so DVC marks the stage failed and
    nothing half-written is left."""
    parser = argparse.ArgumentParser(prog=f"stages/{name}.py", description=f"DVC stage: {name}")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    if add_args:
        add_args(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    try:
        params = load_params(args.params, sections)
        main(params, args)
    except (ConfigError, ValueError, FileNotFoundError, OSError, torch.OutOfMemoryError) as exc:
        if os.environ.get("GRPO_DEBUG"):
            raise
        print(f"error: stage {name} failed: {exc}\n(set GRPO_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(2)
