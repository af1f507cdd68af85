"""How many sequences a generate call may decode at once on this GPU: the memory plan's formula
(grpo.memory_plan.max_slots) applied to the memory actually left, so every stage's generation fits by
construction rather than by a batch size tuned on someone else's card.

The memory left is the smaller of what this process may still allocate (its per-process cap, as
``torch.cuda.set_per_process_memory_fraction`` sets it, less what it holds) and what the device has
free (other processes and the CUDA context included), less ``MARGIN`` for cuBLAS workspaces, CUDA
graph pools and fragmentation. It is read when a call starts, after the weights and the static
decoder's copies are in place, so only the cache, the decode step and the prompt pass are sized.
An out-of-memory error still halves the rows in flight (grpo/rollout/native.py): the plan is an
estimate, and the halving is what guarantees progress.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from grpo.memory_plan import GIB, Arch, max_slots

log = logging.getLogger(__name__)

MARGIN = int(0.5 * GIB)
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def cuda_bytes_left(device: torch.device) -> int:
    """Bytes this process can still allocate on ``device``, less the safety margin (0 at least)."""
    # the memory-fraction getter wants an index: a bare "cuda" means the current device
    device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    total = torch.cuda.get_device_properties(device).total_memory
    capped = int(total * torch.cuda.get_per_process_memory_fraction(device))
    allocated = torch.cuda.memory_allocated(device)
    free, _ = torch.cuda.mem_get_info(device)
    # the allocator's cached but unused blocks are free for this process, though not for the device
    unused_cache = torch.cuda.memory_reserved(device) - allocated
    return max(0, min(capped - allocated, free + unused_cache) - MARGIN)


def slots_for_model(model: torch.nn.Module, *, static_decoder: bool, lora_targets: tuple[str, ...],
                    merge_lora: bool) -> Callable[[int], int]:
    """``max_slots_for`` for NativeEngine over ``model`` on a GPU: sequence tokens -> slots that fit now."""
    arch = Arch.from_config(model.config.to_dict())
    dtype = DTYPE_NAMES.get(_compute_dtype(model), "bfloat16")

    def slots(sequence_tokens: int) -> int:
        left = cuda_bytes_left(model.device)
        # sampling at temperature > 0 (the larger decode step) and the whole prompt as the cache's start:
        # the plan of a greedy call or a shorter prompt is never larger
        fitting = max_slots(arch, left, dtype=dtype, quantised=False, prompt_tokens=sequence_tokens, new_tokens=0,
                            static_decoder=static_decoder, lora_targets=lora_targets, merge_lora=merge_lora)
        log.info("generation budget: %.2f GiB left, %d sequences of %d tokens fit", left / GIB, fitting,
                 sequence_tokens)
        return fitting

    return slots


def _compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype activations and the KV cache take: a 4-bit layer's compute dtype, else the embeddings'."""
    for module in model.modules():
        compute = getattr(module, "compute_dtype", None)
        if isinstance(compute, torch.dtype):
            return compute
    return model.get_input_embeddings().weight.dtype
