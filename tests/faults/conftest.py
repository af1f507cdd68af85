"""Shared by the fault suite."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_model import make_varied_length_model_dir


@pytest.fixture(scope="session")
def varied_model_dir(tmp_path_factory) -> Path:
    """A tiny model whose sampled answers vary in length (see tests/tiny_model.py), so GRPO trains."""
    return make_varied_length_model_dir(tmp_path_factory.mktemp("varied_model"))
