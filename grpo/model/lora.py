"""Hand-written LoRA (Hu et al. 2021) over a frozen base, with PEFT's initialisation and key names.

Each targeted linear layer ``base`` becomes ``LoRALinear(base)`` computing

    y = base(x) + dropout(x) @ A^T @ B^T * scaling,    scaling = alpha / r   (rsLoRA: alpha / sqrt(r))

A (r x in) starts kaiming-uniform and B (out x r) at zero, so a fresh adapter leaves the model unchanged.
The LoRA branch always runs in fp32 with fp32 parameters, whatever the base computes in: the optimiser
then keeps fp32 state and small updates are not rounded away in bf16.

Adapters stay unmerged while training: the base may be 4-bit, and ``lora_disabled`` needs the bare base
(the KL reference).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

# PEFT saves `base_model.model.<module path>.lora_A.weight`; vLLM and the hub expect exactly that.
PEFT_PREFIX = "base_model.model."


class LoRALinear(nn.Module):
    """A frozen linear layer (``nn.Linear`` or bitsandbytes ``Linear4bit``) plus a trainable low-rank update."""

    def __init__(
        self,
        base: nn.Linear,
        *,
        r: int,
        alpha: float,
        dropout: float = 0.0,
        use_rslora: bool = False,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        if r <= 0:
            raise ValueError(f"LoRA rank r={r}: must be positive")
        self.base = base.requires_grad_(False)
        self.in_features = base.in_features
        self.out_features = base.out_features
        self.r = r
        self.scaling = alpha / (math.sqrt(r) if use_rslora else r)
        device = base.weight.device
        self.lora_A = nn.Parameter(torch.empty(r, self.in_features, dtype=torch.float32, device=device))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, r, dtype=torch.float32, device=device))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.disabled = False
        self.reset_parameters(generator)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """PEFT's default init: A kaiming-uniform with a=sqrt(5) (nn.Linear's init), B zero.
        The values are drawn on the CPU so a seed gives the same adapter on every device."""
        a = torch.empty(self.lora_A.shape, dtype=torch.float32)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        with torch.no_grad():
            self.lora_A.copy_(a)
            self.lora_B.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.disabled:
            return y
        update = F.linear(F.linear(self.dropout(x.float()), self.lora_A), self.lora_B) * self.scaling
        return y + update.to(y.dtype)

    def delta_weight(self) -> torch.Tensor:
        """The dense update B @ A * scaling (out x in, fp32) that merging adds to the base weight."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def extra_repr(self) -> str:
        return f"r={self.r}, scaling={self.scaling:g}, disabled={self.disabled}"


@contextmanager
def lora_tf32(enabled: bool) -> Iterator[None]:
    """``train.lora_tf32``: inside the block, CUDA's fp32 matmuls (the LoRA branch; the base runs in the
    compute dtype) use TF32 tensor cores; the setting before is restored after. A CPU's matmuls are not
    affected (this is CUDA's flag)."""
    if not enabled:
        yield
        return
    before = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.fp32_precision = before


def target_matches(name: str, target: str) -> bool:
    """PEFT's rule for a list of target_modules: the module's full name, or a dotted suffix of it."""
    return name == target or name.endswith("." + target)


def inject_lora(
    model: nn.Module,
    *,
    targets: list[str],
    r: int,
    alpha: float,
    dropout: float = 0.0,
    use_rslora: bool = False,
    seed: int = 0,
) -> list[str]:
    """Wrap every linear layer whose name ends in one of ``targets`` (e.g. ``q_proj``) in ``LoRALinear``
    and freeze everything else; returns the wrapped module names in model order.

    A target that matches no module, or matches something that is not a linear layer, raises ValueError.
    ``seed`` alone fixes the initial A matrices (a private generator; the global RNG is untouched).
    """
    if not targets:
        raise ValueError("LoRA targets: empty list; name at least one module (e.g. q_proj)")
    if lora_modules(model):
        raise ValueError("inject_lora: the model already has LoRA layers")
    found: list[tuple[str, nn.Module]] = []
    hits = {target: 0 for target in targets}
    for name, module in model.named_modules():
        matched = [t for t in targets if target_matches(name, t)]
        if not matched:
            continue
        if not isinstance(module, nn.Linear):
            raise ValueError(f"LoRA target {matched[0]!r} matches {name} ({type(module).__name__}), not a linear layer")
        for target in matched:
            hits[target] += 1
        found.append((name, module))
    missing = [t for t, n in hits.items() if n == 0]
    if missing:
        raise ValueError(f"LoRA target(s) {missing} match no module of {type(model).__name__}")

    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    for name, module in found:
        lora = LoRALinear(module, r=r, alpha=alpha, dropout=dropout, use_rslora=use_rslora, generator=generator)
        _set_submodule(model, name, lora)
    return [name for name, _ in found]


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """Every ``LoRALinear`` in the model by module name (the name of the layer it wraps)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable parameters: each LoRA layer's A then B, in model order (give these to the optimiser)."""
    return [p for m in lora_modules(model).values() for p in (m.lora_A, m.lora_B)]


@contextmanager
def lora_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run the bare base inside the block: the KL reference without a second copy of the model."""
    modules = list(lora_modules(model).values())
    previous = [m.disabled for m in modules]
    for m in modules:
        m.disabled = True
    try:
        yield model
    finally:
        for m, was in zip(modules, previous):
            m.disabled = was


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """LoRA weights under PEFT's key names, as detached fp32 CPU copies (safe to save or keep)."""
    sd: dict[str, torch.Tensor] = {}
    for name, m in lora_modules(model).items():
        sd[f"{PEFT_PREFIX}{name}.lora_A.weight"] = m.lora_A.detach().to("cpu", copy=True)
        sd[f"{PEFT_PREFIX}{name}.lora_B.weight"] = m.lora_B.detach().to("cpu", copy=True)
    return sd


def load_lora_state_dict(model: nn.Module, sd: dict[str, torch.Tensor]) -> None:
    """Copy LoRA weights (PEFT key names) into the model's LoRA layers; keys and shapes must match exactly."""
    params: dict[str, nn.Parameter] = {}
    for name, m in lora_modules(model).items():
        params[f"{PEFT_PREFIX}{name}.lora_A.weight"] = m.lora_A
        params[f"{PEFT_PREFIX}{name}.lora_B.weight"] = m.lora_B
    missing = sorted(params.keys() - sd.keys())
    unexpected = sorted(sd.keys() - params.keys())
    if missing or unexpected:
        raise ValueError(
            f"LoRA weights do not fit the model: {len(missing)} missing (e.g. {missing[:2]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:2]})"
        )
    for key, param in params.items():
        if tuple(sd[key].shape) != tuple(param.shape):
            raise ValueError(f"LoRA weight {key}: shape {tuple(sd[key].shape)}, the model needs {tuple(param.shape)}")
    with torch.no_grad():
        for key, param in params.items():
            param.copy_(sd[key])
