"""Presets: each is a complete, valid params file; one command switches params.yaml to it; an unknown
name is a clear error with a non-zero exit; each plans within the memory of the card it is named for."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grpo.config import SECTIONS, load_params
from grpo.preset import PRESETS, available

TARGET_GIB = {"rtx3060ti-8gb": 8, "h200": 141, "rocm-bf16-llama8b": 24}


def test_the_documented_presets_exist():
    assert available() == sorted(TARGET_GIB)


@pytest.mark.parametrize("name", sorted(TARGET_GIB))
def test_preset_passes_validation_of_every_section(name):
    params = load_params(PRESETS / f"{name}.yaml", list(SECTIONS))
    assert set(params) == set(SECTIONS)


def test_rtx3060ti_preset_is_the_8gb_recipe():
    p = load_params(PRESETS / "rtx3060ti-8gb.yaml", list(SECTIONS))
    t = p["train"]
    assert p["model"].source == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B" and p["prompt"].style == "r1"
    assert (t.quantization, t.group_size, t.max_response_length, t.lora.r) == ("nf4", 4, 768, 16)
    assert sorted(t.lora.targets) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert t.prompts_per_step * t.group_size // t.train_batch_size == 16  # gradient-accumulation micro-batches
    assert "r1_format" in t.rewards and "correctness" in t.rewards


def test_rocm_preset_is_the_llama_run_card():
    p = load_params(PRESETS / "rocm-bf16-llama8b.yaml", list(SECTIONS))
    t = p["train"]
    assert p["model"].source == "meta-llama/Llama-3.1-8B-Instruct" and t.quantization == "none"
    assert (t.lora.r, t.group_size, t.lr, t.max_steps) == (32, 6, 5e-6, 250)
    assert t.prompts_per_step * t.group_size // t.train_batch_size == 2
    assert sorted(t.rewards) == sorted(["correctness", "integer_answer", "tagged_format_strict",
                                        "tagged_format_soft", "tag_count"])


def test_h200_preset_is_larger_than_the_8gb_one():
    big = load_params(PRESETS / "h200.yaml", ["train"])["train"]
    small = load_params(PRESETS / "rtx3060ti-8gb.yaml", ["train"])["train"]
    assert big.group_size > small.group_size and big.max_response_length > small.max_response_length
    assert big.prompts_per_step > small.prompts_per_step


def run_module(module: str, *args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(PRESETS.parent)})


def test_switching_copies_the_preset_over_params_yaml(tmp_path):
    (tmp_path / "params.yaml").write_text("old: true\n")
    proc = run_module("grpo.preset", "rtx3060ti-8gb", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "params.yaml").read_text() == (PRESETS / "rtx3060ti-8gb.yaml").read_text()


def test_unknown_preset_is_a_clear_error_and_leaves_params_alone(tmp_path):
    (tmp_path / "params.yaml").write_text("old: true\n")
    proc = run_module("grpo.preset", "rtx4090", cwd=tmp_path)
    assert proc.returncode == 2
    assert "unknown preset 'rtx4090'" in proc.stderr and "rtx3060ti-8gb" in proc.stderr
    assert (tmp_path / "params.yaml").read_text() == "old: true\n"


@pytest.mark.parametrize("name", sorted(TARGET_GIB))
def test_preset_fits_its_card(name, tmp_path):
    proc = run_module("grpo.check", "--params", str(PRESETS / f"{name}.yaml"), "--budget-gib", str(TARGET_GIB[name]),
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fits: peak" in proc.stdout
