"""`dvc repro` with train.num_processes: 2 (and sent's): the stages relaunch themselves under torchrun
(gloo on CPU), and the outputs equal a 1-process `dvc repro` of the same params: SENT's files byte for
byte, training's rollouts, rewards and logs, the adapter up to float summation order. Then the run's
identity ignores the process count: set back to 1, the train stage resumes from the 2-process run's
last checkpoint and rewrites the same adapter."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.pipeline.project import copy_project, edit_params, ran_stages, run, tiny_params

pytestmark = pytest.mark.slow
# a rank's share of a step (1 prompt x 2 samples) is one micro-batch, as in the 1-process run
TRAIN = {"train_batch_size": 2}
SAME_BYTES = ("data/sent/scores.jsonl", "data/sent/curriculum.json", "metrics/sent.json",
              "metrics/train/samples.jsonl", "metrics/train/plots/metrics/reward.tsv",
              "metrics/train/plots/metrics/eval/accuracy.tsv")


def repro_train(project: Path, tiny_model_dir: Path, processes: int) -> str:
    tiny_params(project, tiny_model_dir)
    edit_params(project, train={**TRAIN, "num_processes": processes}, sent={"num_processes": processes})
    proc = run(["dvc", "repro", "train"], project, OMP_NUM_THREADS="1")
    assert "train" in ran_stages(proc.stdout)
    return proc.stdout + proc.stderr


def adapter(project: Path) -> dict[str, torch.Tensor]:
    return load_file(str(project / "models/final/adapter_model.safetensors"))


def test_repro_on_two_processes_equals_one_process(tmp_path, tiny_model_dir):
    one = copy_project(tmp_path / "one")
    two = copy_project(tmp_path / "two")
    repro_train(one, tiny_model_dir, 1)
    log = repro_train(two, tiny_model_dir, 2)
    assert "torch.distributed.run" in log and "rank 1" in log  # both stages ran as 2 torchrun workers
    for name in SAME_BYTES:
        assert (two / name).read_bytes() == (one / name).read_bytes(), name
    want = adapter(one)
    for key, value in adapter(two).items():
        torch.testing.assert_close(value, want[key], rtol=1e-5, atol=1e-6, msg=key)

    # back to one process: the params changed, so dvc reruns train, which resumes from the last
    # checkpoint (the process count is not part of the run) instead of training again
    edit_params(two, train={"num_processes": 1})
    proc = run(["dvc", "repro", "train"], two, OMP_NUM_THREADS="1")
    assert ran_stages(proc.stdout) == ["train"]
    assert "resumed from" in proc.stdout + proc.stderr
    for key, value in adapter(two).items():
        torch.testing.assert_close(value, want[key], rtol=1e-5, atol=1e-6, msg=key)
