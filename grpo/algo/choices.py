"""The names of the objective's variants, which grpo/algo/objective.py implements (each name has its
branch there; tests/test_choices.py runs every one). Apart from it only so that grpo/config.py can
validate params without importing torch."""
from __future__ import annotations

from typing import Literal, get_args

AdvantageScale = Literal["group", "batch", "none"]
ADVANTAGE_SCALES: tuple[str, ...] = get_args(AdvantageScale)  # what params' train.advantage_scale may name
LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]
LOSS_TYPES: tuple[str, ...] = get_args(LossType)  # what params' train.loss_type may name
