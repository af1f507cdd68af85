"""A Triton launch that fits the GPU it runs on: the first of a kernel's launch options that loads.

Why: a kernel whose program asks for more shared memory than a block may have does not load, and Triton
raises ``OutOfResources`` on the host when it loads it, before any launch. Cards differ threefold (an H100
allows 227 KiB a block, an A100 163, an RTX 30 or 40 card 99: the 8 GB preset's own card), so each kernel
lists options from its fastest (wide tiles, deep pipelines) to its leanest, and the first that loads on
this GPU is remembered. The search runs in the decoder's eager warm-up, never inside a CUDA graph capture:
a remembered option launches at once. bench/smem_fit.py prints what each option asks for, by card.
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

try:
    from triton.runtime.errors import OutOfResources
except ImportError:  # CPU-only installs without triton never launch a kernel
    OutOfResources = None

T = TypeVar("T")

_CHOSEN: dict[tuple, tuple] = {}  # the option that loaded, by kernel, device and specialisation


def k_blocks_divide(k: int, options: Sequence[tuple]) -> bool:
    """Whether every option's K block (its first element) divides ``k``: kernels whose K loop has no tail take
    only such widths, whichever option loads."""
    return all(k % option[0] == 0 for option in options)


def first_that_loads(key: tuple, options: Sequence[tuple], launch: Callable[[tuple], T]) -> T:
    """``launch(option)`` for the option remembered under ``key``, else for each of ``options`` in turn until
    one loads (the last one's error, if it fails too, is the caller's); the one that loaded is remembered."""
    tries = [_CHOSEN[key]] if key in _CHOSEN else list(options)
    for option in tries[:-1]:
        try:
            out = launch(option)
        except OutOfResources:
            continue
        _CHOSEN[key] = option
        return out
    out = launch(tries[-1])
    _CHOSEN[key] = tries[-1]
    return out
