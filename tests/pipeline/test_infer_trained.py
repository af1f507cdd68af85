"""The README's inference command in a project that `dvc repro` trained: the adapter in models/best
records the base the pipeline resolved, so models/base/ is found without --base."""
from __future__ import annotations

import json

import pytest

from tests.pipeline.project import run

pytestmark = pytest.mark.slow


def test_readme_inference_command_on_the_trained_adapter(trained_project):
    recorded = json.loads((trained_project / "models/best/adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == json.loads((trained_project / "models/base/MODEL_INFO.json").read_text())["source"]
    proc = run('python -m grpo.infer --adapter models/best --prompt "What is 15 + 27?"', trained_project)
    assert proc.stdout.startswith("<reasoning>\n")  # the params' tagged style, prefill included
    assert len(proc.stdout.strip()) > len("<reasoning>")
