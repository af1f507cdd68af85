"""Generation and training from a dense copy of the frozen 4-bit base.

The base never changes during LoRA training, so each bitsandbytes ``Linear4bit`` weight can be
de-quantised once and kept. Inside ``dense_base(model)`` those layers run a plain dense matmul on the
cached copy (LoRA branches still apply on top, unmerged), which decodes several times faster than the
4-bit kernels on CPU and on small GPU batches, at the memory cost of one dense copy of the base. The
numbers are the same policy: bitsandbytes also de-quantises to the compute dtype before its matmul.

``train.dense_training`` (``dense_for_training``): bitsandbytes de-quantises every 4-bit weight again in
each forward, each checkpointed re-forward and each backward, thousands of small launches a micro-batch.
With it, the 4-bit layers no adapter wraps (``adapter_free``: in the 8 GB preset the MLP, 88% of the base)
run from a copy made once and kept for the run. The static decoder reads that same copy (the gate and up
projections' as one, ``joined_dense``), so it costs generation no memory and no step de-quantises those
layers again; training pays it, which the memory plan counts and ``grpo.tune`` weighs. Layers with an
adapter keep the 4-bit path: the decoder merges a copy of its own for them, so a kept copy would be one
more in both phases.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from grpo.model.lora import LoRALinear


def linear4bit_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every bitsandbytes 4-bit linear layer of ``model`` (none without bitsandbytes)."""
    try:
        import bitsandbytes as bnb
    except ImportError:  # no bitsandbytes (e.g. ROCm): nothing is quantised
        return []
    return [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]


def adapter_free(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The 4-bit layers no active LoRA adapter wraps: their dense copy is the same in every phase."""
    adapted = {id(m.base) for m in model.modules() if isinstance(m, LoRALinear) and not m.disabled}
    return [m for m in linear4bit_modules(model) if id(m) not in adapted]


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


def joined_dense(modules: list[torch.nn.Module]) -> torch.Tensor:
    """One cached dense copy of 4-bit layers that share an input, their weights stacked by rows (the static
    decoder's gate and up, which one kernel reads): each layer's cached copy (``dense_weight``) is its row
    slice of it, so a dense forward of one layer reads the same memory and nothing is copied twice."""
    copies = [getattr(m, "_dense_weight", None) for m in modules]
    whole = None if copies[0] is None else copies[0]._base
    offset = 0
    for copy in copies:  # already joined: each copy the next rows of one tensor
        if whole is None or copy is None or copy._base is not whole or copy.storage_offset() != offset:
            break
        offset += copy.numel()
    else:
        if offset == whole.numel():
            return whole
    joined = torch.cat([dequantized(m) if c is None else c for m, c in zip(modules, copies)])
    rows = 0
    for m in modules:
        m._dense_weight = joined[rows:rows + m.out_features]
        rows += m.out_features
    return joined


def _dense_forward(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    weight = dense_weight(module)
    bias = None if module.bias is None else module.bias.to(weight.dtype)
    return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)


@contextmanager
def _dense_forwards(modules: list[torch.nn.Module]) -> Iterator[int]:
    for m in modules:
        m.forward = _dense_forward.__get__(m)  # an instance attribute shadows the class's forward
    try:
        yield len(modules)
    finally:
        for m in modules:
            del m.forward


@contextmanager
def dense_base(model: torch.nn.Module, enabled: bool = True) -> Iterator[int]:
    """Run the model's 4-bit layers densely inside the block; yields how many layers were switched."""
    with _dense_forwards(linear4bit_modules(model) if enabled else []) as switched:
        yield switched


@contextmanager
def dense_for_training(model: torch.nn.Module, enabled: bool) -> Iterator[int]:
    """``train.dense_training`` for a step's scoring and training passes: the adapter-free 4-bit layers run
    from their kept copy (made here if generation has not made it, and kept after), and so does any other
    4-bit layer whose copy generation cached (``train.dense_generation`` off the static decoder); the rest
    keep the 4-bit path. Yields how many layers run densely.

    Every copy is made on entry, not at a layer's first forward: a compiled, checkpointed layer whose
    first forward made its copy would recompute in backward along the other branch (copy cached), saving
    other tensors, which torch.utils.checkpoint rejects (seen on an H100 with the 8 GB preset's step)."""
    if not enabled:
        yield 0
        return
    with torch.no_grad():
        for m in adapter_free(model):
            dense_weight(m)
    with _dense_forwards([m for m in linear4bit_modules(model)
                          if getattr(m, "_dense_weight", None) is not None]) as switched:
        yield switched


def drop_dense_copies(model: torch.nn.Module) -> int:
    """Free the cached dense copies (they are rebuilt on next use); returns how many were dropped.
    Lets a training step give the copy's memory (~2.9 GiB at 1.5B) back between rollouts."""
    dropped = 0
    for m in linear4bit_modules(model):
        if getattr(m, "_dense_weight", None) is not None:
            del m._dense_weight
            dropped += 1
    return dropped
