"""Fixtures of the rollout tests: the tiny model's tokenizer, and the model itself in fp32 and eval mode
(one per test module: a module may switch it to train mode and back)."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo.model.loading import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
