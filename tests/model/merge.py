"""Merging an adapter into its base, as an independent reference for the tests: the project serves
adapters unmerged (the native engine folds LoRA per call, vLLM takes adapter folders), so nothing in
grpo/ merges; a merged plain-transformers model checks those paths from outside."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from grpo.io import atomic_dir
from grpo.model.adapter import load_adapter
from grpo.model.lora import lora_modules


def merge_lora_(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight and put the plain ``nn.Linear`` back (for export only).

    Needs an unquantised base: merging into 4-bit weights would re-quantise and lose the update.
    """
    for name, m in lora_modules(model).items():
        base = m.base
        if type(base) is not nn.Linear:
            raise ValueError(
                f"merge_lora_: {name} wraps a {type(base).__name__}; merge into an unquantised base "
                "(load it with quantization='none', as merge_and_export does)"
            )
        with torch.no_grad():
            merged = base.weight.float() + m.delta_weight().to(base.weight.device)
            base.weight.copy_(merged.to(base.weight.dtype))
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, base)
    return model


def merge_and_export(base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path) -> Path:
    """Write a plain HF model folder (weights + tokenizer) with the adapter merged into the base.

    The base is loaded unquantised in fp32 on the CPU (merging into 4-bit weights would lose the
    update), merged in fp32, then stored in the base's own dtype so the export is the base's size.
    """
    base_dir = Path(base_dir)
    stored_dtype = getattr(AutoConfig.from_pretrained(base_dir), "dtype", None) or torch.float32
    if isinstance(stored_dtype, str):
        stored_dtype = getattr(torch, stored_dtype)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    load_adapter(model, adapter_dir)
    merge_lora_(model)
    model.to(stored_dtype)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return Path(out_dir)
