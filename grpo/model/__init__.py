"""The policy model: loading (nf4 4-bit or unquantised; CUDA, ROCm, CPU), hand-written LoRA, and
PEFT-compatible adapter folders (save, load)."""
from grpo.model.adapter import LoraSettings, load_adapter, read_adapter_config, save_adapter
from grpo.model.loading import (
    disable_cpu_weight_repacking,
    enable_gradient_checkpointing,
    load_policy_model,
    load_tokenizer,
    resolve_compute_dtype,
    resolve_device,
)
from grpo.model.lora import (
    LoRALinear,
    inject_lora,
    load_lora_state_dict,
    lora_disabled,
    lora_modules,
    lora_parameters,
    lora_state_dict,
)

__all__ = [
    "LoRALinear",
    "LoraSettings",
    "disable_cpu_weight_repacking",
    "enable_gradient_checkpointing",
    "inject_lora",
    "load_adapter",
    "load_lora_state_dict",
    "load_policy_model",
    "load_tokenizer",
    "lora_disabled",
    "lora_modules",
    "lora_parameters",
    "lora_state_dict",
    "read_adapter_config",
    "resolve_compute_dtype",
    "resolve_device",
    "save_adapter",
]
