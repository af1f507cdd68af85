"""``train.compile_layers``: each decoder layer torch.compile'd for a step's scoring and training passes.

A training micro-batch at the 8 GB preset's shape launches ~9,000 kernels, many of them small elementwise
ones (norms, rotary, SwiGLU, LoRA's casts and adds), and compiling those pieces one function at a time
lost: their kernels took 20% less time but each of ~400 calls a micro-batch paid dynamo's guard check and
the compiled autograd wrapper on the host (bench/RESULTS.md, "Fused elementwise work in training"). One
compiled region a layer is the other shape of that trade: the whole layer (the 4-bit de-quantisation,
LoRA and gradient checkpointing's re-forward included) is traced as one graph (with no break on the CPU,
tests/train/test_trainer.py; all layers share it), so a micro-batch makes a few calls per layer. Whether
that wins is measured, not assumed: it is a knob of ``grpo.tune``, which weighs the compile against the
run's steps.

Only the training passes run compiled (``compiled_layers`` around them): generation with HF ``generate``
runs the same layers with a growing KV cache, which would recompile at every length. The compiled
functions are made once per layer and kept on it, so every step after the first reuses them; widths vary
from step to step, hence ``dynamic=True``.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder's layer modules (``model.model.layers`` for Qwen2, Qwen3 and Llama)."""
    return list(model.get_decoder().layers)


@contextmanager
def compiled_layers(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Inside the block each decoder layer runs its compiled forward; outside, its own."""
    layers = decoder_layers(model) if enabled else []
    for layer in layers:
        if getattr(layer, "_compiled_forward", None) is None:
            layer._compiled_forward = torch.compile(type(layer).forward.__get__(layer), dynamic=True)
        layer.forward = layer._compiled_forward  # an instance attribute shadows the class's forward
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward
