"""Host-side bookkeeping of sequence-level continuous batching for the static decoder.

The decoder holds a fixed number of slots (rows of its KV cache). Rows of a request wait in a queue;
when a slot's row ends, the next waiting row is prefilled into that slot, as vLLM's scheduler does, so
a request is never held by its longest row and needs no more memory than its slots. The device state
is the decoder's (grpo/rollout/static_decode.py); this schedule only decides, without reading the
device, which rows go where, when the host must look at the device next, and how much of the cache a
decode step must read:

- admission: the free slots, in order, take the waiting rows in order (FIFO); with ``refill`` off a
  wave is admitted only when every slot is free, which is plain static batching (the old behaviour,
  kept for the benchmark);
- syncs: a row's end by a stop id is known only by reading the device, every ``sync_every`` steps;
  its end by length is known here (``start + limit - 1``), so the host syncs exactly then too;
- length bucket: the step writes each live slot at its cursor, at most ``width + steps since its
  prefill`` (less once it stopped), so the step attends over that bound plus one, rounded up to the
  bucket: one CUDA graph per bucket (only the PyTorch attention reads it; the Triton kernel reads each
  slot's own cursor).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """A row in a slot: prefilled before decode step ``start`` at cache width ``width`` (its wave's
    padded prompt width, where its first decode step writes), allowed ``limit`` new tokens."""

    row: int
    start: int
    width: int
    limit: int


@dataclass(frozen=True)
class Wave:
    """Rows prefilled together, ``rows[i]`` into slot ``slots[i]``, left-padded to ``width``."""

    slots: list[int]
    rows: list[int]
    width: int


class SlotSchedule:
    def __init__(self, prompt_lengths: list[int], limits: list[int], slots: int, *, refill: bool,
                 sync_every: int, bucket: int, cache_len: int) -> None:
        if slots < 1 or sync_every < 1:
            raise ValueError(f"slots and sync_every must be >= 1, got {slots} and {sync_every}")
        if len(limits) != len(prompt_lengths) or min(limits, default=1) < 1:
            raise ValueError("one limit >= 1 per row is needed")
        self.lengths, self.limits = prompt_lengths, limits
        self.refill, self.sync_every, self.bucket, self.cache_len = refill, sync_every, bucket, cache_len
        self.waiting = deque(range(len(prompt_lengths)))
        self.placed: list[Placement | None] = [None] * slots
        self.step = 0  # decode steps run so far

    def done(self) -> bool:
        return not self.waiting and all(p is None for p in self.placed)

    def busy(self) -> list[int]:
        return [s for s, p in enumerate(self.placed) if p is not None]

    def admit(self) -> Wave | None:
        """The rows to prefill now, or None."""
        free = [s for s, p in enumerate(self.placed) if p is None]
        if not self.waiting or not free or (not self.refill and len(free) < len(self.placed)):
            return None
        rows = [self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))]
        width = max(self.lengths[r] for r in rows)
        for slot, row in zip(free, rows):
            self.placed[slot] = Placement(row, self.step, width, self.limits[row])
        return Wave(free[: len(rows)], rows, width)

    def retire(self, slot: int) -> int:
        """Free ``slot`` (its row ended); returns the row."""
        placement = self.placed[slot]
        self.placed[slot] = None
        return placement.row

    def next_sync(self) -> int:
        """The step at which the host reads the device next: ``sync_every`` steps on, or earlier when
        a row reaches its length limit (its end is certain then, and its slot can take the next row)."""
        ends = [p.start + p.limit - 1 for p in self.placed if p is not None]
        return min([self.step + self.sync_every, *ends])

    def length(self) -> int:
        """The cache length the next decode step attends over (a multiple of the bucket, or the cache)."""
        reach = max(p.width + min(self.step - p.start, p.limit - 1) + 1 for p in self.placed if p is not None)
        return min(self.cache_len, -(-reach // self.bucket) * self.bucket)
