"""The pieces of grpo.distributed and grpo.launch that need no process group."""
from __future__ import annotations

import sys

import pytest

from grpo.distributed import gather_concat, shard_bounds
from grpo.launch import ENDPOINT_ENV, torchrun_command


def shards(n: int, unit: int, world: int) -> list[tuple[int, int]]:
    return [shard_bounds(n, unit, of_rank=r, world=world) for r in range(world)]


@pytest.mark.parametrize("n,unit,world", [(7, 1, 2), (7, 2, 2), (8, 4, 3), (1, 1, 4), (0, 3, 2), (13, 5, 4)])
def test_shards_are_contiguous_cover_everything_and_cut_at_units(n, unit, world):
    cut = shards(n, unit, world)
    assert cut[0][0] == 0 and cut[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(cut, cut[1:]))  # rank order is item order, nothing skipped
    assert all(lo % unit == 0 for lo, _ in cut)  # each shard starts a batch of one process's run
    sizes = [hi - lo for lo, hi in cut]
    assert max(sizes) - min(sizes) <= unit  # as even as whole units allow


def test_one_process_holds_everything():
    assert shard_bounds(5) == (0, 5)
    assert gather_concat([1, 2]) == [1, 2]


def test_launch_commands(monkeypatch):
    cmd = torchrun_command("stages.train", ["--params", "p.yaml"], 4, 1, "train")
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"] and "--standalone" in cmd
    assert cmd[-4:] == ["-m", "stages.train", "--params", "p.yaml"]
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    with pytest.raises(ValueError, match=f"train.nnodes is 2: set {ENDPOINT_ENV}"):
        torchrun_command("stages.train", [], 1, 2, "train")
