"""torch.distributed for the stages: who this process is, its share of a list, and the collectives.

A stage runs as one process, or as one of ``WORLD_SIZE`` processes that ``torchrun`` started
(grpo/launch.py relaunches a stage under torchrun when its params ask for more than one). Everything
here works unchanged in a single process (world size 1, rank 0, collectives are identities), so the
stage code calls it unconditionally and has one code path.

Backends: NCCL when the processes use CUDA devices (RCCL on ROCm builds answers to the same name),
gloo on CPU. Work is split in contiguous shards in rank order, so gathering the shards in rank order
gives back the single-process order, and what a stage writes does not depend on the process count.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable, TypeVar

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)
T = TypeVar("T")


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    """Rank 0, the one process that writes a stage's outputs."""
    return rank() == 0


def launched() -> bool:
    """Whether torchrun (or another launcher following its contract) started this process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_from_env() -> None:
    """Join the process group torchrun's environment describes (RANK, WORLD_SIZE, MASTER_ADDR, ...);
    nothing when this process was started alone. On a GPU each process takes the device of its
    LOCAL_RANK, before anything allocates on the default one."""
    if not launched() or dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    log.info("process group: rank %d of %d (%s)", rank(), world_size(), backend)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _device() -> torch.device:
    """Where collective tensors live: NCCL reduces CUDA tensors only."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shard_bounds(n: int, unit: int = 1, *, of_rank: int | None = None, world: int | None = None) -> tuple[int, int]:
    """[start, stop) of this rank's contiguous share of ``n`` items, cut at multiples of ``unit`` (a
    generation batch: shards then hold the same batches a single process runs), as even as the units
    allow; a rank may get an empty share when there are fewer units than ranks."""
    if unit < 1:
        raise ValueError(f"shard unit must be >= 1, got {unit}")
    r = rank() if of_rank is None else of_rank
    w = world_size() if world is None else world
    units = -(-n // unit)
    return min(n, unit * (r * units // w)), min(n, unit * ((r + 1) * units // w))


def gather(obj: T) -> list[T]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_concat(items: list[T]) -> list[T]:
    """The ranks' lists concatenated in rank order: a sharded list put back together."""
    return [item for part in gather(items) for item in part]


def all_reduce_sum(value: float) -> float:
    """The sum of ``value`` over ranks (float64, so counts stay exact)."""
    if world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=_device())
    dist.all_reduce(tensor)
    return float(tensor.item())


def all_reduce_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Sum the gradients of ``params`` over ranks, in one flat buffer: every rank's loss is already
    divided by the step-wide normaliser, so the sum is the single-process gradient. A parameter with
    no gradient on this rank (its micro-batches were all empty) contributes zeros."""
    if world_size() == 1:
        return
    params = list(params)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1).to(_device(), torch.float32) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        size = p.numel()
        p.grad = flat[offset:offset + size].view_as(p).to(p.device, p.dtype)
        offset += size


def broadcast(obj: T) -> T:
    """Rank 0's ``obj`` on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


class Silent:
    """Stands in for a writer on the ranks that must not write: every method call does nothing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def main_only(make: Callable[[], T]) -> T | Silent:
    """``make()`` on rank 0, a ``Silent`` stand-in elsewhere (log writers, trackers)."""
    return make() if is_main() else Silent()
