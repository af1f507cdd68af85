"""Device slots: experiments that `dvc queue start -j N` runs side by side take one device each.

DVC's queue runs each experiment in its own worker and temp workspace, and knows nothing of GPUs: two
workers would both use GPU 0. With ``GRPO_DEVICE_SLOTS=N`` in the environment of ``dvc queue start``, a
stage that uses a device (one whose params section has ``num_processes``: sent, train, evaluate) first
takes the lock of a free slot among N, holds it until it exits (the kernel releases a killed process's
lock too), and sees only that slot's GPUs through ``CUDA_VISIBLE_DEVICES``: slot i of a stage running
k processes is devices [i·k, (i+1)·k) of those visible before (on a CPU, slots stand in for GPUs and
only limit how many such stages run at once). A stage that finds every slot taken waits for one.

The locks are files in ``GRPO_SLOT_DIR`` (default: <system temp dir>/grpo-device-slots), which every
worker of one machine shares. Unset ``GRPO_DEVICE_SLOTS`` (any plain ``dvc repro``): no slot, no lock.
"""
from __future__ import annotations

import fcntl
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)
SLOTS_ENV = "GRPO_DEVICE_SLOTS"
DIR_ENV = "GRPO_SLOT_DIR"
_held: list[IO] = []  # the open lock files of this process: closing one would release its slot


def slot_count() -> int | None:
    value = os.environ.get(SLOTS_ENV)
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{SLOTS_ENV} must be a number of device slots >= 1, got {value!r}")
    return int(value)


def slot_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or Path(tempfile.gettempdir()) / "grpo-device-slots")


def _try_lock(path: Path) -> IO | None:
    handle = path.open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    # kept across the exec into torchrun (grpo/launch.py), which then holds the slot for its workers
    os.set_inheritable(handle.fileno(), True)
    return handle


def take_slot(devices_per_slot: int = 1, poll_s: float = 1.0) -> int | None:
    """Take a free slot (waiting for one) and restrict CUDA to its devices; None without slots."""
    count = slot_count()
    if count is None:
        return None
    folder = slot_dir()
    folder.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        for slot in range(count):
            handle = _try_lock(folder / f"slot-{slot}.lock")
            if handle is not None:
                _held.append(handle)
                _restrict_devices(slot, devices_per_slot, count)
                log.info("device slot %d of %d (%s=%s)", slot, count, "CUDA_VISIBLE_DEVICES",
                         os.environ.get("CUDA_VISIBLE_DEVICES"))
                return slot
        if not waited:
            log.info("all %d device slots are taken; waiting for one", count)
            waited = True
        time.sleep(poll_s)


def _restrict_devices(slot: int, per_slot: int, count: int) -> None:
    """Point CUDA at the slot's devices, numbered within what was visible before (all when unset)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(count * per_slot)]
    if len(devices) < count * per_slot:
        raise ValueError(f"{SLOTS_ENV}={count} slots of {per_slot} device(s) need {count * per_slot} devices; "
                         f"CUDA_VISIBLE_DEVICES={visible!r} has {len(devices)}")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices[slot * per_slot:(slot + 1) * per_slot])
