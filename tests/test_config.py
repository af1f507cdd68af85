"""grpo/config.py: every bad param gives one clear error naming its key path and what is allowed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo.config import SECTIONS, ConfigError, load_params, parse_section

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, params: dict) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_repo_params_validate_every_section():
    params = load_params(ROOT / "params.yaml", list(SECTIONS))
    assert params["prepare"].val_fraction == pytest.approx(0.05)
    assert params["model"].source == "smollm2-135m-instruct"


def test_defaults_fill_missing_keys(tmp_path):
    params = load_params(write(tmp_path, {"train": {"lr": 1e-5}}), ["train"])
    assert params["train"].lr == 1e-5
    assert params["train"].group_size == 4
    assert params["train"].lora.targets == ["q_proj", "k_proj", "v_proj", "o_proj"]


@pytest.mark.parametrize(
    "section, raw, expected",
    [
        ("prepare", {"val_fraction": -3}, "prepare.val_fraction: got -3; allowed: a number in the open interval (0, 1)"),
        ("prepare", {"val_fraction": 1.0}, "prepare.val_fraction"),
        ("prepare", {"val_fractoin": 0.1}, "prepare.val_fractoin: unknown key; allowed keys: source"),
        ("prepare", {"max_train": "many"}, "prepare.max_train: expected an integer or null, got 'many'"),
        ("prepare", {"train_sources": ["gsm9k"]}, "prepare.train_sources: got ['gsm9k']; allowed: names from gsm8k"),
        ("prepare", {"train_sources": []}, "a non-empty list"),
        ("prepare", {"max_eval": {"gsm8k": 0}}, "prepare.max_eval: got {'gsm8k': 0}"),
        ("train", {"group_size": 1}, "train.group_size: got 1; allowed: a number >= 2"),
        ("train", {"lr": -0.001}, "train.lr: got -0.001; allowed: a number > 0"),
        ("train", {"loss_type": "ppo"}, "train.loss_type: got 'ppo'; allowed: one of 'grpo', 'bnpo', 'dr_grpo', 'dapo'"),
        ("train", {"lora": {"r": 0}}, "train.lora.r: got 0; allowed: a number > 0"),
        ("train", {"lora": {"targets": ["qkv"]}}, "train.lora.targets"),
        ("train", {"lora": {"rank": 8}}, "train.lora.rank: unknown key"),
        ("train", {"rewards": {"corectness": 1.0}}, "train.rewards: got {'corectness': 1.0}; allowed: names from correctness"),
        ("train", {"gradient_checkpointing": "yes"}, "train.gradient_checkpointing: expected true/false, got 'yes'"),
        ("train", {"max_steps": 2.5}, "train.max_steps: expected an integer, got 2.5"),
        ("train", {"delta": 0.5}, "train.delta: got 0.5; allowed: a number > 1"),
        ("sent", {"M": 1}, "sent.M: got 1; allowed: a number >= 2"),
        ("sent", {"engine": "tgi"}, "sent.engine: got 'tgi'"),
        ("evaluate", {"benchmarks": {"gsm8k": {"n": 0}}}, "evaluate.benchmarks.gsm8k.n: got 0"),
        ("model", {"dtype": "int8"}, "model.dtype: got 'int8'"),
    ],
)
def test_bad_values_name_the_key(section, raw, expected):
    with pytest.raises(ConfigError) as err:
        parse_section(section, raw)
    assert expected in str(err.value)


def test_all_problems_reported_at_once(tmp_path):
    path = write(tmp_path, {"train": {"lr": -1, "group_size": 1}, "trian": {}})
    with pytest.raises(ConfigError) as err:
        load_params(path, ["train"])
    message = str(err.value)
    assert "train.lr" in message and "train.group_size" in message
    assert "trian: unknown section" in message


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="params file not found"):
        load_params(tmp_path / "nope.yaml", ["model"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("prepare: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(bad, ["prepare"])


def test_stage_exits_nonzero_and_writes_nothing(tmp_path):
    """The issue's must-show: a bad prepare param stops the stage before any output exists."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["prepare"]["val_fraction"] = -3
    path = write(tmp_path, params)
    proc = subprocess.run(
        [sys.executable, "-m", "stages.prepare", "--params", str(path)],
        cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": ""}, capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert "prepare.val_fraction: got -3" in proc.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "metrics").exists()
