"""Adapters on disk in PEFT's format, so PEFT, vLLM's ``LoRARequest`` and the hub load what we train.

A folder holds ``adapter_config.json`` and ``adapter_model.safetensors`` (keys
``base_model.model.<module path>.lora_A.weight`` / ``.lora_B.weight``, fp32). Writes are atomic: a
killed save leaves the previous adapter (or nothing), never a half-written folder.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from grpo.io import atomic_dir, atomic_write_json
from grpo.model.lora import (
    LoRALinear,
    inject_lora,
    load_lora_state_dict,
    lora_modules,
    lora_state_dict,
    target_matches,
)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

# PEFT features this loader does not implement: an adapter using one is refused, not half-applied.
_UNSUPPORTED = {
    "use_dora": False,
    "bias": "none",
    "fan_in_fan_out": False,
    "modules_to_save": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "layers_to_transform": None,
}


@dataclass(frozen=True)
class LoraSettings:
    """What shapes an adapter: rank, alpha, dropout, target module names, rsLoRA scaling."""

    r: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    use_rslora: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    @classmethod
    def from_adapter_config(cls, cfg: dict) -> LoraSettings:
        return cls(
            r=cfg["r"],
            alpha=cfg["lora_alpha"],
            dropout=cfg.get("lora_dropout", 0.0),
            targets=tuple(cfg["target_modules"]),
            use_rslora=cfg.get("use_rslora", False),
        )


def adapter_config_dict(settings: LoraSettings, base_model_name_or_path: str) -> dict:
    """The ``adapter_config.json`` content: PEFT 0.21 loads it without warnings, vLLM reads the same
    fields; the ``_UNSUPPORTED`` fields are written out so no reader guesses their defaults."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": settings.r,
        "lora_alpha": settings.alpha,
        "lora_dropout": settings.dropout,
        "target_modules": sorted(settings.targets),
        "use_rslora": settings.use_rslora,
        "init_lora_weights": True,
        "inference_mode": True,
        "lora_bias": False,
        "revision": None,
        **_UNSUPPORTED,
    }


def save_adapter(
    model: torch.nn.Module,
    out_dir: str | Path,
    *,
    base_model_name_or_path: str,
    lora_config: LoraSettings,
) -> Path:
    """Write the model's LoRA weights and ``lora_config`` as a PEFT adapter folder, atomically."""
    out_dir = Path(out_dir)
    modules = lora_modules(model)
    if not modules:
        raise ValueError(f"save_adapter({out_dir}): the model has no LoRA layers")
    _check_fits(modules, lora_config, source="lora_config")
    weights = {k: v.contiguous() for k, v in lora_state_dict(model).items()}
    with atomic_dir(out_dir) as tmp:
        save_file(weights, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        atomic_write_json(tmp / ADAPTER_CONFIG, adapter_config_dict(lora_config, base_model_name_or_path))
    return out_dir


def read_adapter_config(adapter_dir: str | Path) -> dict:
    """The parsed ``adapter_config.json`` of a LoRA adapter folder; ValueError naming the file when it
    is not valid JSON, not a LoRA config, or uses a PEFT feature this project does not load."""
    path = Path(adapter_dir) / ADAPTER_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{adapter_dir}: no {ADAPTER_CONFIG}; not an adapter folder")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    if cfg.get("peft_type") != "LORA":
        raise ValueError(f"{path}: peft_type={cfg.get('peft_type')!r}; only LORA adapters are supported")
    for key in ("r", "lora_alpha", "target_modules"):
        if key not in cfg:
            raise ValueError(f"{path}: missing {key!r}")
    if not isinstance(cfg["target_modules"], list):
        raise ValueError(f"{path}: target_modules={cfg['target_modules']!r}; only a list of module names is supported")
    for key, default in _UNSUPPORTED.items():
        if cfg.get(key, default) not in (default, [], {}, None):
            raise ValueError(f"{path}: {key}={cfg[key]!r} is not supported (only {default!r})")
    return cfg


def load_adapter(model: torch.nn.Module, adapter_dir: str | Path, *, expected_base: str | None = None) -> LoraSettings:
    """Load a PEFT LoRA adapter into ``model``; returns its settings.

    A model without LoRA layers gets them injected from the adapter's config; a model that has them
    must match the adapter's rank, alpha/rsLoRA scaling and targets. ``expected_base``, when given, must
    equal the adapter's ``base_model_name_or_path`` exactly. Every mismatch raises ValueError naming the
    field, the folder and both values.
    """
    adapter_dir = Path(adapter_dir)
    cfg = read_adapter_config(adapter_dir)
    settings = LoraSettings.from_adapter_config(cfg)
    base = cfg.get("base_model_name_or_path")
    if expected_base is not None and base != expected_base:
        raise ValueError(
            f"{adapter_dir}: base_model_name_or_path mismatch: the adapter was trained on {base!r}, "
            f"expected {expected_base!r}"
        )
    weights_path = adapter_dir / ADAPTER_WEIGHTS
    if not weights_path.is_file():
        raise FileNotFoundError(f"{adapter_dir}: no {ADAPTER_WEIGHTS}")
    try:
        weights = load_file(str(weights_path))
    except Exception as exc:  # safetensors raises its own error types for truncated or garbled files
        raise ValueError(f"{weights_path}: not a readable safetensors file (truncated or corrupt?): {exc}") from exc

    modules = lora_modules(model)
    if modules:
        _check_fits(modules, settings, source=str(adapter_dir))
    else:
        inject_lora(
            model,
            targets=list(settings.targets),
            r=settings.r,
            alpha=settings.alpha,
            dropout=settings.dropout,
            use_rslora=settings.use_rslora,
        )
    try:
        load_lora_state_dict(model, weights)
    except ValueError as exc:
        raise ValueError(f"{weights_path}: {exc}") from exc
    return settings


def _check_fits(modules: dict[str, LoRALinear], settings: LoraSettings, *, source: str) -> None:
    """Raise ValueError when ``settings`` (from ``source``) do not describe the model's LoRA layers."""
    model_ranks = sorted({m.r for m in modules.values()})
    if model_ranks != [settings.r]:
        raise ValueError(
            f"{source}: r mismatch: {source} has r={settings.r}, the model's LoRA layers have r={model_ranks}"
        )
    model_targets = sorted({name.rsplit(".", 1)[-1] for name in modules})
    covered = all(any(target_matches(name, t) for t in settings.targets) for name in modules)
    every_target_used = all(any(target_matches(name, t) for name in modules) for t in settings.targets)
    if not (covered and every_target_used):
        raise ValueError(
            f"{source}: target_modules mismatch: {source} has {sorted(settings.targets)}, "
            f"the model's LoRA layers are {model_targets}"
        )
    expected = settings.scaling
    scalings = sorted({m.scaling for m in modules.values()})
    if any(abs(s - expected) > 1e-9 * max(1.0, abs(expected)) for s in scalings):
        raise ValueError(
            f"{source}: lora_alpha/use_rslora mismatch: {source} gives scaling {expected:g} "
            f"(alpha={settings.alpha}, use_rslora={settings.use_rslora}), the model's LoRA layers use {scalings}"
        )
