from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests never touch the network: the hub is unreachable on CI machines.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random tiny Qwen2 chat model folder, built once per test session (see tests/tiny_model.py)."""
    from tests.tiny_model import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))
