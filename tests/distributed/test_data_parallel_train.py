"""Data-parallel training on CPU with gloo: 2 processes (torchrun) compute the 1-process run of the same
global batch: identical rollouts and rewards, the same adapter up to float summation order, equal
weights on both ranks; a kill -9 of one rank mid-run resumes on 1 process to the same adapter; two
rendezvousing launchers (--nnodes 2 on localhost) do the same."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo.launch import ENDPOINT_ENV, ID_ENV, torchrun_command

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "tests.distributed.train_driver"
# batch-scaled advantages, a dapo token normaliser, an entropy quantile and a KL term: every quantity
# that spans the step is exercised; 3 steps, validation at 2 and 3, a checkpoint every step.
# Micro-batches of 3 rows, a rank's share of the step's 6: the 1-process run then sums the same
# micro-batch gradients. With other micro-batches the sum's rounding differs, and AdamW (lr 1e-2)
# amplifies it: one process with micro-batches of 6 against 3 ends 0.019 apart in the largest LoRA
# weight after 3 steps, while 2 processes and 1 process with equal micro-batches agree to the bit.
PARAMS = {"advantage_scale": "batch", "entropy_keep_fraction": 0.5, "beta": 0.05, "max_steps": 3,
          "train_batch_size": 3}


def env(**extra: str) -> dict[str, str]:
    # one thread a process in every run: the 1-process run computes with the threads torchrun gives a worker
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "DRIVER_PARAMS": json.dumps(PARAMS),
            **extra}


def launch(cmd: list[str], out: Path, **extra: str) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    log = (out / f"log-{len(list(out.glob('log-*')))}.txt").open("w")
    return subprocess.Popen(cmd, cwd=ROOT, env=env(**extra), stdout=log, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, out: Path, expect_ok: bool = True) -> None:
    code = proc.wait(timeout=600)
    logs = "\n".join(p.read_text()[-3000:] for p in sorted(out.glob("log-*")))
    assert (code == 0) == expect_ok, f"exit {code}\n{logs}"


def alone(model: Path, out: Path, **extra: str) -> None:
    finish(launch([sys.executable, "-m", DRIVER, str(model), str(out)], out, **extra), out)


def torchrun(model: Path, out: Path, expect_ok: bool = True, **extra: str) -> None:
    cmd = torchrun_command(DRIVER, [str(model), str(out)], 2, 1, "train")
    finish(launch(cmd, out, **extra), out, expect_ok)


def rollouts(out: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((out / "rollouts").glob("step-*.json"))}


def assert_same_run(run: Path, reference: Path) -> None:
    assert rollouts(run) == rollouts(reference)  # token ids and rewards of every step, in order
    assert len(rollouts(reference)) == PARAMS["max_steps"]
    got = load_file(str(run / "run/final/adapter_model.safetensors"))
    want = load_file(str(reference / "run/final/adapter_model.safetensors"))
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-6, msg=key)
    # validation saw the same completions: the select stage's input is the same
    assert (run / "run/metrics/plots/metrics/eval/accuracy.tsv").read_text() == \
        (reference / "run/metrics/plots/metrics/eval/accuracy.tsv").read_text()


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one_process")
    alone(tiny_model_dir, out)
    return out


def test_two_processes_train_the_one_process_adapter(tiny_model_dir, reference, tmp_path):
    torchrun(tiny_model_dir, tmp_path)
    assert_same_run(tmp_path, reference)
    ranks = [torch.load(tmp_path / f"weights-rank-{r}.pt") for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys()
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])  # one model on both ranks
    # the trained adapter is not the initial one (B starts at zero): the comparison above has content
    final = load_file(str(tmp_path / "run/final/adapter_model.safetensors"))
    assert any(t.abs().max() > 0 for k, t in final.items() if "lora_B" in k)


def test_kill_one_rank_mid_run_then_resume_on_one_process(tiny_model_dir, reference, tmp_path):
    # rank 1 dies by SIGKILL after step 2's update; torchrun then stops rank 0 and fails
    torchrun(tiny_model_dir, tmp_path, expect_ok=False, GRPO_FAULT_KILL="train.step@2", GRPO_FAULT_KILL_RANK="1")
    assert not (tmp_path / "run/final").exists()
    steps = sorted(p.name for p in (tmp_path / "run/checkpoints").iterdir())
    assert steps and steps[-1] < "step-000003", steps
    again = Path(shutil.copytree(tmp_path, tmp_path.parent / f"{tmp_path.name}-again"))
    alone(tiny_model_dir, tmp_path)  # the same run resumed by one process
    assert "resumed from" in (tmp_path / "log-1.txt").read_text()
    assert_same_run(tmp_path, reference)
    # or by two again: rank 0 reads the checkpoint and hands it to rank 1
    torchrun(tiny_model_dir, again)
    assert "resumed from" in (again / "log-1.txt").read_text()
    assert_same_run(again, reference)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_launchers_rendezvous_as_two_nodes(tiny_model_dir, reference, tmp_path):
    rdzv = {ENDPOINT_ENV: f"127.0.0.1:{free_port()}", ID_ENV: f"test-{os.getpid()}"}
    os.environ.update(rdzv)
    try:
        cmd = torchrun_command(DRIVER, [str(tiny_model_dir), str(tmp_path)], 1, 2, "train")
    finally:
        for key in rdzv:
            os.environ.pop(key)
    assert "--rdzv-endpoint" in cmd and "--standalone" not in cmd
    nodes = [launch(cmd, tmp_path, **rdzv) for _ in range(2)]  # two hosts' launchers, here on one host
    for node in nodes:
        finish(node, tmp_path)
    assert_same_run(tmp_path, reference)


def test_fewer_prompts_than_processes_is_a_clear_error(tiny_model_dir, tmp_path):
    torchrun(tiny_model_dir, tmp_path, expect_ok=False, DRIVER_PARAMS=json.dumps({**PARAMS, "prompts_per_step": 1}))
    log = (tmp_path / "log-0.txt").read_text()
    assert "train.prompts_per_step (1) must be at least the number of processes (2)" in log
    assert not (tmp_path / "run" / "checkpoints").exists()
