"""How many sequences a generate call may decode at once on this GPU: the memory plan's formula
(grpo.memory_plan.max_slots) applied to the memory actually left, so every stage's generation fits by
construction rather than by a batch size tuned on someone else's card.

The memory left is the smaller of what this process may still allocate (its per-process cap, as
``torch.cuda.set_per_process_memory_fraction`` sets it, less what it holds) and what the device has
free (other processes and the CUDA context included), less the plan's ``GENERATION_MARGIN`` for
cuBLAS workspaces, CUDA graph pools and fragmentation; ``python -m grpo.check`` plans the same rows. It is read when a call starts, after the weights and the static
decoder's copies are in place, so only the cache, the decode step and the prompt pass are sized.
An out-of-memory error still halves the rows in flight (grpo/rollout/native.py): the plan is an
estimate, and the halving is what guarantees progress.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

import torch

from grpo.memory_plan import GIB, Arch, generation_slots

if TYPE_CHECKING:
    from grpo.rollout.base import SamplingParams

log = logging.getLogger(__name__)

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def cuda_bytes_left(device: torch.device) -> int:
    """Bytes this process can still allocate on ``device`` (0 at least)."""
    # the memory-fraction getter wants an index: a bare "cuda" means the current device
    device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    total = torch.cuda.get_device_properties(device).total_memory
    capped = int(total * torch.cuda.get_per_process_memory_fraction(device))
    allocated = torch.cuda.memory_allocated(device)
    free, _ = torch.cuda.mem_get_info(device)
    # the allocator's cached but unused blocks are free for this process, though not for the device
    unused_cache = torch.cuda.memory_reserved(device) - allocated
    return max(0, min(capped - allocated, free + unused_cache))


def slots_for_model(model: torch.nn.Module, *, static_decoder: bool, lora_targets: tuple[str, ...],
                    merge_lora: bool, read_4bit_mlp: bool = False) -> Callable[[int, "SamplingParams"], int]:
    """``max_slots_for`` for NativeEngine over ``model`` on a GPU: (longest prompt, sampling) -> the rows
    that fit in the memory left now (0 when not even one does)."""
    arch = Arch.from_config(model.config.to_dict())
    dtype = DTYPE_NAMES.get(_compute_dtype(model), "bfloat16")

    def slots(prompt_tokens: int, params: "SamplingParams") -> int:
        left = cuda_bytes_left(model.device)
        fitting = generation_slots(arch, left, dtype=dtype, quantised=False, prompt_tokens=prompt_tokens,
                                 new_tokens=params.max_new_tokens, static_decoder=static_decoder,
                                 lora_targets=lora_targets, merge_lora=merge_lora, read_4bit_mlp=read_4bit_mlp,
                                 greedy=params.temperature == 0,
                                 top_p=params.top_p, top_k=params.top_k)
        log.info("generation budget: %.2f GiB left, %d sequences of %d + %d tokens fit", left / GIB, fitting,
                 prompt_tokens, params.max_new_tokens)
        return fitting

    return slots


def _compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype activations and the KV cache take: a 4-bit layer's compute dtype, else the embeddings'."""
    for module in model.modules():
        compute = getattr(module, "compute_dtype", None)
        if isinstance(compute, torch.dtype):
            return compute
    return model.get_input_embeddings().weight.dtype
