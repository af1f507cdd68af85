"""select: the rule (metric, max/min, earliest/latest), skipped checkpoints, and no benchmark leakage."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from grpo.select import SELECTION_FILE, select_checkpoint, write_best
from grpo.trainlog import validation_dir

ROOT = Path(__file__).resolve().parents[2]


def make_adapter(folder: Path, marker: float) -> None:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    save_file({"base_model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.full((4, 2), marker)},
              str(folder / "adapter_model.safetensors"))


def make_run(root: Path, rows: list[tuple[int, float, float]], missing: tuple[int, ...] = ()) -> Path:
    """A validation log with (step, accuracy, mean completion length) rows, written by DVCLive itself as
    the train stage writes it, and the rows' checkpoints."""
    from dvclive import Live

    from grpo.train.tracking import close_dvc_repo

    live = Live(str(root / "metrics" / "train"), save_dvc_exp=False, dvcyaml=None)
    for step, accuracy, length in rows:
        live.step = step
        for name, value in (("accuracy", accuracy), ("format_rate", 0.5), ("completions/mean_length", length)):
            live.log_metric(f"eval/{name}", value)
        live.next_step()
    close_dvc_repo(live)
    for step, _, _ in rows:
        if step not in missing:
            make_adapter(root / "models" / "checkpoints" / f"step-{step:06d}" / "adapter", float(step))
    return validation_dir(root / "metrics" / "train")


ROWS = [(5, 0.25, 90.0), (10, 0.5, 80.0), (15, 0.5, 80.0), (20, 0.375, 70.0)]


@pytest.mark.parametrize("metric, mode, tie, expected", [
    ("accuracy", "max", "earliest", 10),
    ("accuracy", "max", "latest", 15),
    ("accuracy", "min", "earliest", 5),
    ("completions/mean_length", "min", "latest", 20),
    ("completions/mean_length", "max", "latest", 5),
    ("completions/mean_length", "min", "earliest", 20),
])
def test_rule(tmp_path, metric, mode, tie, expected):
    log = make_run(tmp_path, ROWS)
    selection = select_checkpoint(log, tmp_path / "models" / "checkpoints", metric=metric, mode=mode, tie=tie)
    assert selection.chosen.step == expected


def test_ties_between_values_read_from_text(tmp_path):
    log = make_run(tmp_path, [(5, 0.1 + 0.2, 1.0), (10, 0.3, 1.0)])
    ckpts = tmp_path / "models" / "checkpoints"
    assert select_checkpoint(log, ckpts, metric="accuracy", mode="max", tie="earliest").chosen.step == 5
    assert select_checkpoint(log, ckpts, metric="accuracy", mode="max", tie="latest").chosen.step == 10


def test_missing_and_corrupt_adapters_are_skipped_and_listed(tmp_path, caplog):
    log = make_run(tmp_path, ROWS, missing=(10,))
    ckpts = tmp_path / "models" / "checkpoints"
    (ckpts / "step-000015" / "adapter" / "adapter_model.safetensors").write_bytes(b"\x00" * 10)  # truncated
    with caplog.at_level(logging.WARNING):
        selection = select_checkpoint(log, ckpts, metric="accuracy", mode="max", tie="earliest")
    assert selection.chosen.step == 20
    assert selection.to_json()["unavailable"] == ["step-000010", "step-000015"]
    assert "step-000010" in caplog.text and "step-000015" in caplog.text


def test_errors_name_the_problem(tmp_path):
    ckpts = tmp_path / "models" / "checkpoints"
    with pytest.raises(FileNotFoundError, match="validation log"):
        select_checkpoint(tmp_path / "nope", ckpts, metric="accuracy", mode="max", tie="earliest")
    log = make_run(tmp_path, ROWS, missing=(5, 10, 15, 20))
    with pytest.raises(ValueError, match="'reward' is not in the validation log .*no reward.tsv.*; available metrics: "
                                         "accuracy, completions/mean_length, format_rate$"):
        select_checkpoint(log, ckpts, metric="reward", mode="max", tie="earliest")
    with pytest.raises(ValueError, match="no checkpoint .* is available"):
        select_checkpoint(log, ckpts, metric="accuracy", mode="max", tie="earliest")
    shutil.rmtree(log)
    log.mkdir()
    with pytest.raises(ValueError, match="has no rows"):
        select_checkpoint(log, ckpts, metric="accuracy", mode="max", tie="earliest")


def test_write_best_copies_the_adapter_with_its_selection(tmp_path):
    log = make_run(tmp_path, ROWS)
    ckpts, best = tmp_path / "models" / "checkpoints", tmp_path / "models" / "best"
    best.mkdir(parents=True)
    (best / "stale.txt").write_text("from an older selection")
    write_best(select_checkpoint(log, ckpts, metric="accuracy", mode="max", tie="latest"), ckpts, best)
    assert sorted(p.name for p in best.iterdir()) == [SELECTION_FILE, "adapter_config.json", "adapter_model.safetensors"]
    assert (best / "adapter_model.safetensors").read_bytes() == \
        (ckpts / "step-000015" / "adapter" / "adapter_model.safetensors").read_bytes()
    info = json.loads((best / SELECTION_FILE).read_text())
    assert info["checkpoint"] == "step-000015" and info["step"] == 15 and info["value"] == 0.5
    assert (info["metric"], info["mode"], info["tie"]) == ("accuracy", "max", "latest")
    assert [c["step"] for c in info["candidates"]] == [5, 10, 15, 20]


def test_stage_reads_only_the_validation_log(tmp_path):
    """Tempting benchmark results that favour step 5 are on disk; the stage still picks step 10 from
    the validation log, and it reads nothing under eval/ or metrics/eval*."""
    make_run(tmp_path, ROWS)
    for path in ("metrics/eval/best/gsm8k.json", "metrics/eval.json", "eval/step-000005.json"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(json.dumps({"accuracy": 1.0, "pass@1": 1.0, "checkpoint": "step-000005"}))
    (tmp_path / "params.yaml").write_text("select:\n  metric: accuracy\n  mode: max\n  tie: earliest\n")
    audit = tmp_path / "opened.txt"
    # an audit hook records every file the stage process opens
    code = (f"import sys; log = open({str(audit)!r}, 'w')\n"
            "sys.addaudithook(lambda ev, a: log.write(str(a[0]) + '\\n') if ev == 'open' and isinstance(a[0], str) else None)\n"
            "import runpy; runpy.run_module('stages.select', run_name='__main__')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "models" / "best" / SELECTION_FILE).read_text())["step"] == 10
    in_project = [(tmp_path / line).resolve().relative_to(tmp_path.resolve()).as_posix()
                  for line in audit.read_text().splitlines()
                  if (tmp_path / line).resolve().is_relative_to(tmp_path.resolve())]
    assert "metrics/train/plots/metrics/eval/accuracy.tsv" in in_project
    assert not [p for p in in_project if p.startswith(("eval/", "metrics/eval"))], in_project
