"""Generation and training from a dense copy of the frozen 4-bit base.

The base never changes during LoRA training, so each bitsandbytes ``Linear4bit`` weight can be
de-quantised once and kept. Inside ``dense_base(model)`` those layers run a plain dense matmul on the
cached copy (LoRA branches still apply on top, unmerged), which decodes several times faster than the
4-bit kernels on CPU and on small GPU batches, at the memory cost of one dense copy of the base. The
numbers are the same policy: bitsandbytes also de-quantises to the compute dtype before its matmul.

Training passes run densely only with ``train.dense_training`` (``dense_for_training``): bitsandbytes
de-quantises every 4-bit weight again in each forward, each checkpointed re-forward and each backward,
thousands of small launches a micro-batch, while the copy is made once a step; it costs the copy's
memory during training, which the memory plan counts and ``grpo.tune`` weighs.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F


def linear4bit_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every bitsandbytes 4-bit linear layer of ``model`` (none without bitsandbytes)."""
    try:
        import bitsandbytes as bnb
    except ImportError:  # no bitsandbytes (e.g. ROCm): nothing is quantised
        return []
    return [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]


def dequantized(module: torch.nn.Module) -> torch.Tensor:
    """A new de-quantised copy of a 4-bit layer's weight in its compute dtype (not cached)."""
    import bitsandbytes.functional as bnbf

    weight = bnbf.dequantize_4bit(module.weight.data, module.weight.quant_state)
    return weight.to(module.compute_dtype or weight.dtype).contiguous()


def dense_weight(module: torch.nn.Module) -> torch.Tensor:
    """The de-quantised weight of a 4-bit layer in its compute dtype, cached on the module until
    ``drop_dense_copies``."""
    cached = getattr(module, "_dense_weight", None)
    if cached is None:
        cached = dequantized(module)
        module._dense_weight = cached  # frozen base: computed once, reused by every rollout
    return cached


def _dense_forward(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    weight = dense_weight(module)
    bias = None if module.bias is None else module.bias.to(weight.dtype)
    return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)


@contextmanager
def dense_base(model: torch.nn.Module, enabled: bool = True) -> Iterator[int]:
    """Run the model's 4-bit layers densely inside the block; yields how many layers were switched."""
    modules = linear4bit_modules(model) if enabled else []
    for m in modules:
        m.forward = _dense_forward.__get__(m)  # an instance attribute shadows the class's forward
    try:
        yield len(modules)
    finally:
        for m in modules:
            del m.forward


@contextmanager
def dense_for_training(model: torch.nn.Module, enabled: bool) -> Iterator[int]:
    """``dense_base`` for a step's training passes. The copies it had to make are freed at the end, so
    generation gets that memory back (the static GPU decoder builds copies of its own); copies that
    generation cached (``train.dense_generation`` off the static decoder) are reused and kept.

    Every copy is made on entry, not at a layer's first forward: a compiled, checkpointed layer whose
    first forward made its copy would recompute in backward along the other branch (copy cached), saving
    other tensors, which torch.utils.checkpoint rejects (seen on an H100 with the 8 GB preset's step)."""
    modules = linear4bit_modules(model) if enabled else []
    cached = {id(m) for m in modules if getattr(m, "_dense_weight", None) is not None}
    with torch.no_grad():
        for m in modules:
            dense_weight(m)
    with dense_base(model, enabled) as switched:
        try:
            yield switched
        finally:
            for m in modules:
                if id(m) not in cached and getattr(m, "_dense_weight", None) is not None:
                    del m._dense_weight


def drop_dense_copies(model: torch.nn.Module) -> int:
    """Free the cached dense copies (they are rebuilt on next use); returns how many were dropped.
    Lets a training step give the copy's memory (~2.9 GiB at 1.5B) back between rollouts."""
    dropped = 0
    for m in linear4bit_modules(model):
        if getattr(m, "_dense_weight", None) is not None:
            del m._dense_weight
            dropped += 1
    return dropped
