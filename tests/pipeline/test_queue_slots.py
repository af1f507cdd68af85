"""A sweep on a multi-GPU box: with GRPO_DEVICE_SLOTS=2, `dvc queue start -j 2` runs two queued
experiments at the same time, and each stage that uses a device takes its own slot (on this CPU machine
the slots stand in for GPUs: each stage sees its slot's device as CUDA_VISIBLE_DEVICES). Real dvc in a
temp git repo; the stage is a probe through grpo.cli.run_stage, as the project's device stages are."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.pipeline.project import QUEUE_S, ROOT, run
from tests.pipeline.test_experiments import wait_for_queue

# The probe holds its slot until the other experiment's probe has started too (or gives up after
# 300 s, failing its experiment): both finishing proves they ran side by side, whatever the timing.
PROBE = '''
import json, os, time
from pathlib import Path
from grpo.cli import run_stage

def main(params, args):
    probe = Path(os.environ["PROBE_DIR"])
    name = str(params["train"].lr)
    (probe / f"started-{name}").write_text(os.environ["CUDA_VISIBLE_DEVICES"])
    deadline = time.monotonic() + 300
    while len(list(probe.glob("started-*"))) < 2:
        if time.monotonic() > deadline:
            raise OSError("the other experiment never started while this one held its slot")
        time.sleep(0.5)
    Path("out.json").write_text(json.dumps({"device": os.environ["CUDA_VISIBLE_DEVICES"]}))

run_stage("train", ["train"], main)
'''
DVC_YAML = {"stages": {"probe": {"cmd": "python probe.py", "deps": ["probe.py"], "params": ["train"],
                                 "outs": ["out.json"]}}}


def test_two_queued_experiments_run_at_once_each_on_its_own_slot(tmp_path):
    project, probe_dir, slots = tmp_path / "project", tmp_path / "probe", tmp_path / "slots"
    for folder in (project, probe_dir):
        folder.mkdir()
    (project / "probe.py").write_text(PROBE)
    (project / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML))
    (project / "params.yaml").write_text(yaml.safe_dump({"train": {"lr": 1e-3}}))
    (project / ".gitignore").write_text("/out.json\n")
    run("git init -q && dvc init -q && git add -A && git commit -qm probe", project)
    env = {"PYTHONPATH": str(ROOT), "GRPO_SLOT_DIR": str(slots), "PROBE_DIR": str(probe_dir),
           "CUDA_VISIBLE_DEVICES": ""}
    run("dvc exp run --queue -S 'train.lr=1e-4,5e-4'", project)  # the README's commands
    try:
        run("GRPO_DEVICE_SLOTS=2 dvc queue start -j 2", project, timeout=QUEUE_S, **env)
        wait_for_queue(project, timeout_s=600)
        status = run("dvc queue status", project, timeout=QUEUE_S).stdout
        assert status.count("Success") == 2, status
    finally:
        run("dvc queue stop", project, check=False, timeout=QUEUE_S)  # no worker outlives the test
    devices = {p.name: p.read_text() for p in probe_dir.glob("started-*")}
    assert sorted(devices) == ["started-0.0001", "started-0.0005"]
    assert sorted(devices.values()) == ["0", "1"], devices  # two slots, one each
    # the lock files are the slots: one per slot, in the shared folder
    assert sorted(p.name for p in slots.iterdir()) == ["slot-0.lock", "slot-1.lock"]
