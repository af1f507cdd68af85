"""Checkpoints: everything needed to resume bit-for-bit, written atomically.

``models/checkpoints/step-000010/``
    ``adapter/``            PEFT-format LoRA adapter (what select copies and vLLM loads)
    ``trainer_state.pt``    optimiser, LR scheduler and RNG states (python, numpy, torch)
    ``state.json``          step, data cursor, curriculum stage, micro-batch sizes, metric history

A checkpoint is written into a hidden temp folder and renamed into place, so a kill during the write
leaves either the previous checkpoints or a new complete one, never a half one; pruning renames a
checkpoint to a hidden name before deleting it, for the same reason. Hidden leftovers of a killed
write or prune are swept when training resumes (``sweep_hidden``). Only the last
``keep_last`` keep their optimiser state; checkpoints that the validation log refers to keep their
adapter (select may choose them), everything else is deleted.
"""
from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo.fault_injection import kill_point
from grpo.io import atomic_dir

log = logging.getLogger(__name__)
PREFIX = "step-"


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:06d}"


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(root: Path, step: int, *, save_adapter_fn, optimizer, scheduler, state: dict) -> Path:
    """Write checkpoint ``step`` atomically. ``save_adapter_fn(folder)`` writes the adapter."""
    target = Path(root) / checkpoint_name(step)
    with atomic_dir(target) as tmp:
        tmp = Path(tmp)
        save_adapter_fn(tmp / "adapter")
        kill_point("checkpoint.write")
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "rng": rng_state()}, tmp / "trainer_state.pt")
        (tmp / "state.json").write_text(json.dumps(state, sort_keys=True, indent=1), encoding="utf-8")
    return target


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first (hidden temp folders of interrupted writes are ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def checkpoint_step(path: Path) -> int:
    return int(Path(path).name[len(PREFIX):])


def load_latest(root: Path) -> tuple[Path, dict, dict] | None:
    """The newest checkpoint that loads: (folder, state.json, trainer_state.pt contents).

    A checkpoint whose files are unreadable (a truncated write after a disk fault) is skipped with a
    warning in favour of the previous good one.
    """
    for path in reversed(list_checkpoints(root)):
        if not (path / "trainer_state.pt").exists():
            continue  # an adapter-only checkpoint kept for select; it cannot resume training
        try:
            state = json.loads((path / "state.json").read_text(encoding="utf-8"))
            trainer = torch.load(path / "trainer_state.pt", weights_only=False)
            _check_adapter_readable(path / "adapter")
        except Exception as exc:  # any unreadable file disqualifies this checkpoint
            log.warning("skipping unreadable checkpoint %s: %s", path, exc)
            continue
        return path, state, trainer
    return None


def _check_adapter_readable(folder: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(folder / "adapter_model.safetensors"), framework="pt") as fh:
        for key in fh.keys():
            fh.get_tensor(key)


def prune(root: Path, keep_last: int, referenced_steps: set[int]) -> None:
    """Delete old checkpoints; ones the validation log refers to keep only their adapter."""
    full = [p for p in list_checkpoints(root) if (p / "trainer_state.pt").exists()]
    for path in full[: max(0, len(full) - keep_last)]:
        if checkpoint_step(path) in referenced_steps:
            (path / "trainer_state.pt").unlink()
        else:
            # hidden first, so a kill half-way through the delete leaves no half checkpoint in view
            doomed = path.with_name(f".{path.name}.deleting")
            path.rename(doomed)
            shutil.rmtree(doomed)


def sweep_hidden(root: Path) -> None:
    """Delete hidden leftovers (temp folders of killed writes, half-deleted checkpoints) under ``root``,
    which only the train stage writes; DVC would otherwise store them as part of the checkpoints out."""
    root = Path(root)
    for path in root.glob(".*") if root.is_dir() else []:
        log.warning("removing %s, left by an interrupted checkpoint write or prune", path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
