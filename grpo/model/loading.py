"""Load the policy: a frozen base (nf4 4-bit through bitsandbytes, or plain bf16/fp16/fp32) that LoRA
adapters are injected into (see ``lora.py``), plus its tokenizer.

The base never trains: every parameter is frozen here, and ``inject_lora`` adds the only trainable ones.
The KL reference is the same model with LoRA switched off (``lora.lora_disabled``), so one copy of the
base serves the policy, the old policy and the reference.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from grpo.hardware import cpu_compute_dtype

log = logging.getLogger(__name__)

QUANTIZATIONS = ("nf4", "none")
COMPUTE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(device: str = "auto") -> torch.device:
    """``auto``: the GPU when torch sees one, else the CPU. ``rocm`` is an alias for ``cuda`` that also
    checks torch is a ROCm (HIP) build, since ROCm GPUs appear to torch as ``cuda`` devices."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device == "rocm":
        if torch.version.hip is None or not torch.cuda.is_available():
            raise ValueError(f"device={device!r}, but this torch ({torch.__version__}) sees no ROCm GPU")
        return torch.device("cuda")
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r}, but this torch ({torch.__version__}) sees no CUDA GPU")
        return torch.device(device)
    raise ValueError(f"device={device!r}: expected auto, cpu, cuda, cuda:N or rocm")


def resolve_compute_dtype(compute_dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bf16 on a GPU with native bf16, fp16 on an older GPU; on a CPU bf16 where it is native
    (AVX512-BF16 or AMX), else fp32, which is exact and, without native bf16, several times faster than
    emulated bf16 (grpo/hardware.py, bench/RESULTS.md)."""
    if compute_dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
        return cpu_compute_dtype()
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype={compute_dtype!r}: expected auto or one of {sorted(COMPUTE_DTYPES)}")
    return COMPUTE_DTYPES[compute_dtype]


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """The model folder's tokenizer, ready for batched generation.

    ``padding_side="left"``: a batch of prompts must end flush at the right edge so that every row's
    first generated token follows its own prompt. Training code that pads completions on the right
    builds its own tensors and does not depend on this. Without a pad token, eos pads (attention masks
    keep it out of the loss and the logits).
    """
    model_dir = Path(model_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{model_dir}: no loadable tokenizer ({exc})") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{model_dir}: the tokenizer has no chat template; prompts need one (use a chat model)")
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"{model_dir}: the tokenizer has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def attention_implementation(device: torch.device) -> str:
    """``sdpa`` on accelerators; ``eager`` on CPU, where torch's SDPA has no fast bf16 kernel: SmolLM2-135M
    decoding 32 sequences in bf16 ran at 195 tokens/s eager against 130 with SDPA (and about equal in
    fp32; bench/decode_cpu.py, bench/RESULTS.md)."""
    return "eager" if device.type == "cpu" else "sdpa"


def prefer_prebuilt_attention(device: torch.device) -> None:
    """On CUDA, keep SDPA off cuDNN's attention (its FlashAttention and memory-efficient kernels remain).
    cuDNN builds and compiles a plan for each new sequence length, and a GRPO step's micro-batches are new
    widths (longest prompt + longest response) step after step. Measured on an H100 at the 8 GB preset,
    compile caches cleared before each run: the first three training phases took 5.9, 5.8 and 5.0 s with
    cuDNN and 3.4, 2.3 and 2.8 s without it; from the fourth step both take 2.1-2.35 s, at the same peak
    (bench/RESULTS.md, "The slow first steps"). The switch is process-wide, as the choice is."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def load_policy_model(
    model_dir: str | Path,
    *,
    quantization: str = "nf4",
    compute_dtype: str = "auto",
    device: str = "auto",
    gradient_checkpointing: bool = True,
    attention: str | None = None,
) -> PreTrainedModel:
    """Load the frozen base for LoRA training: nf4 4-bit (QLoRA) or unquantised in the compute dtype.

    Every base parameter is frozen. ``model.config.use_cache`` is False, so training forwards build no
    KV cache (``generate`` still caches: it asks for the cache itself). Gradient checkpointing, when on,
    only acts in ``model.train()`` mode (HF checks ``self.training``), so run training forwards in
    train mode; with LoRA dropout 0 and Qwen/Llama attention dropout 0, train mode changes nothing else.
    ``attention`` is transformers' ``attn_implementation``; None: ``attention_implementation``'s choice.
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r}: expected one of {QUANTIZATIONS}")
    torch_device = resolve_device(device)
    dtype = resolve_compute_dtype(compute_dtype, torch_device)
    prefer_prebuilt_attention(torch_device)
    kwargs: dict = {"dtype": dtype, "device_map": {"": str(torch_device)},
                    "attn_implementation": attention or attention_implementation(torch_device)}
    if quantization == "nf4":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype,
        )
    model = AutoModelForCausalLM.from_pretrained(Path(model_dir), **kwargs)
    model.requires_grad_(False)
    model.config.use_cache = False
    if quantization == "nf4":
        disable_cpu_weight_repacking(model)
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    log.info("loaded %s: %s, %s on %s", model_dir, quantization, dtype, torch_device)
    return model


def disable_cpu_weight_repacking(model: torch.nn.Module) -> int:
    """Stop bitsandbytes repacking 4-bit weights for its AVX512-BF16 CPU kernel; returns how many
    ``Linear4bit`` modules were changed.

    bitsandbytes 0.50.2 repacks a ``Linear4bit`` weight in place on its first CPU forward in eval mode
    without grad (every ``generate()``); afterwards the layer's training forward no longer passes
    gradients back to its input, so LoRA parameters below it silently get ``grad=None``
    (docs/ARCHITECTURE.md, "Facts measured"; ``tests/model/test_model_loading.py`` keeps the regression
    test).
    """
    import bitsandbytes as bnb

    count = 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False
            count += 1
    return count


def enable_gradient_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder layer in the backward pass instead of keeping its activations.

    Non-reentrant checkpointing propagates gradients to LoRA parameters inside a checkpointed layer even
    though the layer's input (the frozen embedding's output) does not require grad, so the input-grad
    hook HF adds for the reentrant variant is removed again: it would only cost work, and its
    ``requires_grad_`` call fails on tensors made under ``torch.inference_mode``.
    """
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.disable_input_require_grads()
