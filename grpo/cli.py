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

from grpo import distributed
from grpo.config import ConfigError, load_params
from grpo.launch import relaunch_if_asked
from grpo.slots import take_slot


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for a count: a whole number of at least ``minimum`` (argparse names the flag
    in its error and exits 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number of at least {minimum}, got {text!r}")
        return value
    return parse


def positive_number(text: str) -> float:
    """An argparse ``type`` for a size or a time: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return value


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
    where = f" rank {os.environ['RANK']}" if distributed.launched() else ""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name}{where} %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    try:
        params = load_params(args.params, sections)
        section = params.get(name)
        if hasattr(section, "num_processes") and not distributed.launched():  # a device stage (grpo/slots.py)
            take_slot(section.num_processes)
        relaunch_if_asked(name, section)  # returns only when this process is to do the work
        distributed.init_from_env()
        main(params, args)
        distributed.shutdown()
    except (ConfigError, ValueError, FileNotFoundError, OSError, torch.OutOfMemoryError) as exc:
        if os.environ.get("GRPO_DEBUG"):
            raise
        print(f"error: stage {name} failed: {exc}\n(set GRPO_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(2)
