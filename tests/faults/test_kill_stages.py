"""kill -9 of the train, sent and evaluate stages under real ``dvc repro`` in a temp git repo (tiny model).

Each kill is a SIGKILL the stage sends itself at a named point (``GRPO_FAULT_KILL``, grpo/fault_injection.py),
so the tests are deterministic. After every kill: dvc reports the stage failed, and every output or
checkpoint that exists is complete. After the final clean ``dvc repro``: the outputs equal an
uninterrupted run's byte for byte (the adapter, the DVCLive log, the metrics) and no temp leftovers
remain.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from grpo.io import read_jsonl
from grpo.train.checkpoint import list_checkpoints
from tests.pipeline.project import copy_project, edit_params, ran_stages, run

pytestmark = pytest.mark.slow

TRAIN = {"max_steps": 6, "prompts_per_step": 2, "group_size": 2, "max_response_length": 6,
         "save_every": 1, "val_every": 3, "keep_last": 2, "val_max_new_tokens": 4, "compute_dtype": "float32",
         "log_completions_every": 1, "rewards": {"length_penalty": 1.0, "integer_answer": 0.5}, "lr": 1e-2}
LEFTOVER = re.compile(r"^\..*\.(tmp-|old-|deleting)")


@pytest.fixture(scope="module")
def project(tmp_path_factory, varied_model_dir) -> Path:
    """The project up to sent, on the tiny model: 12 training questions, one 2-question benchmark."""
    project = copy_project(tmp_path_factory.mktemp("faults") / "project")
    edit_params(
        project,
        model={"source": str(varied_model_dir)},
        prepare={"benchmarks": ["gsm8k"], "max_train": 12, "max_val": 2, "max_eval": {"gsm8k": 2}},
        sent={"engine": "native", "M": 2, "max_new_tokens": 6, "batch_size": 4, "save_every": 4, "num_stages": 2},
        train=TRAIN,
        evaluate={"engine": "native", "benchmarks": {"gsm8k": {"max_new_tokens": 4}}},
    )
    repro(project, "sent")
    return project


def repro(project: Path, *targets: str, kill: str | None = None, oom: str | None = None,
          force: bool = False) -> str:
    """``dvc repro [-f -s] targets``; with a fault, assert that dvc failed because of it. Returns stderr."""
    args = ["dvc", "repro", *(["-f", "-s"] if force else []), *targets]
    fault = {k: v for k, v in (("GRPO_FAULT_KILL", kill), ("GRPO_FAULT_OOM", oom)) if v}
    proc = run(args, project, check=not fault, **fault)
    if kill:
        assert proc.returncode != 0 and f"GRPO_FAULT_KILL: SIGKILL at {kill.split('@')[0]}" in proc.stderr, proc.stderr[-3000:]
    if oom:
        assert proc.returncode != 0, proc.stderr[-3000:]
    return proc.stderr


def readable_safetensors(path: Path) -> None:
    with safe_open(str(path), framework="pt") as fh:
        for key in fh.keys():
            fh.get_tensor(key)


def assert_nothing_half_written(project: Path) -> None:
    """Every checkpoint, adapter, data file and metrics file that exists is complete and parses."""
    for ckpt in list_checkpoints(project / "models/checkpoints"):
        json.loads((ckpt / "state.json").read_text())
        readable_safetensors(ckpt / "adapter/adapter_model.safetensors")
        if (ckpt / "trainer_state.pt").exists():
            torch.load(ckpt / "trainer_state.pt", weights_only=False)
    for adapter in ("models/final", "models/best"):
        if (project / adapter).exists():
            json.loads((project / adapter / "adapter_config.json").read_text())
            readable_safetensors(project / adapter / "adapter_model.safetensors")
    for path in [*(project / "data").rglob("*.jsonl"), *(project / "eval").rglob("*.jsonl")]:
        read_jsonl(path)
    for path in [*(project / "data").rglob("*.json"), *(project / "metrics").rglob("*.json")]:
        json.loads(path.read_text())


def leftovers(project: Path) -> list[str]:
    return sorted(str(p.relative_to(project)) for top in ("models", "data", "metrics", "eval")
                  for p in (project / top).rglob(".*") if LEFTOVER.match(p.name))


def steps(project: Path) -> list[int]:
    return [int(c.name.split("-")[1]) for c in list_checkpoints(project / "models/checkpoints")]


def train_outputs(project: Path) -> dict:
    """What the train stage produced: the final adapter and every file of its DVCLive log."""
    log = project / "metrics/train"
    return {"adapter": load_file(str(project / "models/final/adapter_model.safetensors")),
            "adapter_config": (project / "models/final/adapter_config.json").read_text(),
            **{str(p.relative_to(log)): p.read_bytes() for p in sorted(log.rglob("*")) if p.is_file()}}


def assert_same_train_outputs(got: dict, expected: dict) -> None:
    assert got["adapter"].keys() == expected["adapter"].keys()
    for key, value in expected["adapter"].items():
        torch.testing.assert_close(got["adapter"][key], value, rtol=0, atol=0)
    assert {k: v for k, v in got.items() if k != "adapter"} == {k: v for k, v in expected.items() if k != "adapter"}


# (fault, checkpoints on disk after it). save_every 1, val_every 3, keep_last 2: checkpoint 3 keeps its
# adapter after pruning (the validation log names it), older unvalidated ones go.
TRAIN_FAULTS = [
    ({"kill": "train.step@2"}, [1]),  # step 2's update done, its checkpoint not written
    ({"kill": "checkpoint.write@2"}, [1, 2]),  # resumed at 1; step 3's checkpoint half-written
    ({"kill": "replace:step-000004"}, [2, 3]),  # step 4's checkpoint complete in temp, not renamed
    ({"kill": "checkpoint.prune"}, [2, 3, 4]),  # step 4 in place, step 2 not pruned yet
    ({"oom": "train:all"}, [2, 3, 4]),  # OOM at micro-batch size 1: a clear error, checkpoints intact
    ({"kill": "train.finish"}, [3, 5, 6]),  # every step saved, no final adapter
    ({"kill": "replace:final"}, [3, 5, 6]),  # final adapter complete in temp, not renamed
    ({"kill": "train.summary"}, [3, 5, 6]),  # final adapter in place, no summary figures yet
]


def test_train_killed_at_every_point_resumes_to_the_uninterrupted_adapter(project):
    repro(project, "train")
    expected = train_outputs(project)
    assert any(v.abs().sum() > 0 for k, v in expected["adapter"].items() if "lora_B" in k), "training moved nothing"
    shutil.rmtree(project / "models/checkpoints")  # dvc sees the persist out changed and reruns train

    for fault, kept in TRAIN_FAULTS:
        stderr = repro(project, "train", **fault)
        if "oom" in fault:
            assert "error: stage train failed: out of memory in train at micro-batch size 1" in stderr
        assert steps(project) == kept, (fault, steps(project))
        assert_nothing_half_written(project)
    # every run of the fault loop stopped before the end: no final adapter, or no summary figures
    assert not (project / "models/final").exists() or "reward_mean_last5" not in json.loads(
        (project / "metrics/train/metrics.json").read_text())

    repro(project, "train")
    assert_same_train_outputs(train_outputs(project), expected)
    assert steps(project) == [3, 5, 6]
    assert leftovers(project) == []
    assert "up to date" in run(["dvc", "status", "train"], project).stdout


def sent_outputs(project: Path) -> dict:
    return {"scores": (project / "data/sent/scores.jsonl").read_text(),
            "curriculum": (project / "data/sent/curriculum.json").read_text(),
            "metrics": (project / "metrics/sent.json").read_text()}


def test_sent_killed_resumes_from_progress_to_the_same_scores(project):
    expected = sent_outputs(project)  # the fixture's uninterrupted run
    shutil.rmtree(project / "data/sent_progress")
    repro(project, "sent", kill="sent.batch@2", force=True)  # 2 of 3 batches scored and saved
    assert len(json.loads((project / "data/sent_progress/progress.json").read_text())["scores"]) == 8
    assert not (project / "data/sent").exists()  # dvc removed the old out; nothing half-written
    stderr = repro(project, "sent", kill="replace:sent")  # resumed, scored batch 3, killed before the rename
    assert "8 of 12 questions already scored" in stderr
    assert not (project / "data/sent").exists() and not (project / "metrics/sent.json").exists()
    assert_nothing_half_written(project)
    stderr = repro(project, "sent")
    assert "12 of 12 questions already scored" in stderr
    assert sent_outputs(project) == expected
    assert leftovers(project) == []


def test_evaluate_killed_recomputes_the_same_outputs(project):
    stage = "evaluate_base@gsm8k"
    repro(project, stage, kill="evaluate.samples")  # samples written, metrics not: dvc does not commit
    assert not (project / "metrics/eval/base/gsm8k.json").exists()
    assert stage in ran_stages(run(["dvc", "repro", stage], project).stdout)  # recomputed, not skipped
    got = ((project / "eval/base/gsm8k.jsonl").read_text(), (project / "metrics/eval/base/gsm8k.json").read_text())
    run(["dvc", "repro", "-f", "-s", stage], project)  # an uninterrupted run
    expected = ((project / "eval/base/gsm8k.jsonl").read_text(), (project / "metrics/eval/base/gsm8k.json").read_text())
    assert len(read_jsonl(project / "eval/base/gsm8k.jsonl")) == 2 and got == expected
    assert leftovers(project) == []
