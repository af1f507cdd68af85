"""The one generation interface every stage uses (SENT, training rollouts, validation, evaluation).

Two engines implement it: ``NativeEngine`` (transformers ``generate`` on an in-memory model, so training
samples from the current policy) and ``VLLMEngine`` (vLLM, for SENT and evaluation). Both return the
exact sampled token ids, so the trainer scores the tokens that were sampled and never re-tokenises text.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

log = logging.getLogger(__name__)

FinishReason = Literal["stop", "length"]
# the engines make_engine builds (grpo/rollout/engines.py: auto = vLLM where it imports and suits the stage)
EngineKind = Literal["auto", "vllm", "native"]
ENGINE_KINDS: tuple[str, ...] = get_args(EngineKind)
# the native engine's decoders (grpo/rollout/native.py): auto = static on CUDA, HF generate elsewhere
GenerationBackend = Literal["auto", "hf", "static"]
GENERATION_BACKENDS: tuple[str, ...] = get_args(GenerationBackend)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` is greedy; ``top_k == 0`` switches top-k off. ``seed`` keys
    the random stream per (prompt index in the call, sample index): both engines draw a sample
    independently of how the call is batched (native: grpo/rollout/sampling.py; vLLM: per-request seeds).
    ``first_prompt`` is the index of the call's first prompt in a request that processes split among
    themselves (grpo/distributed.py): prompt i of the call draws as prompt ``first_prompt + i``, so each
    shard draws what the whole request draws in one process."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    seed: int = 0
    first_prompt: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.first_prompt < 0:
            raise ValueError(f"SamplingParams.first_prompt must be >= 0, got {self.first_prompt}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Completion:
    """One sampled response. ``token_ids`` are exactly the sampled ids: they end with the EOS id when
    the model stopped (``finish_reason == "stop"``) and hold no pad ids; ``text`` is their decoding
    without special tokens."""

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: FinishReason


class GenerationEngine(Protocol):
    def generate(self, prompts: list[str], params: SamplingParams, *, adapter_dir: str | None = None,
                 progress: bool = False) -> list[list[Completion]]:
        """``params.n`` completions per prompt: the outer list follows ``prompts``.

        ``prompts`` are full prompt strings (``grpo.prompts.build_prompt``: chat template and prefill
        included), tokenised without adding special tokens. ``adapter_dir`` is a PEFT-format LoRA folder
        to generate with, or None for the engine's model as it is."""
        ...

    def close(self) -> None:
        """Free the model and its memory; the engine is unusable afterwards."""
        ...


def stop_token_ids(tokenizer, generation_config=None) -> list[int]:
    """Every id that ends a response: the tokenizer's eos plus generation_config's (one id or a list).

    Chat models end a turn with a token (``<|im_end|>``, ``<|eot_id|>``) that is not always the
    tokenizer's eos; both engines stop on this same set so their outputs agree."""
    ids: list[int] = []
    candidates = [tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)]
    for value in candidates:
        for token_id in value if isinstance(value, (list, tuple)) else [value]:
            if token_id is not None and token_id not in ids:
                ids.append(int(token_id))
    if not ids:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no eos token: "
                         "generation could never stop")
    return ids


def encode_prompts(tokenizer, prompts: list[str]) -> list[list[int]]:
    # The chat template already wrote any BOS; letting the tokenizer add one again would double it.
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]


def make_completions(tokenizer, prompt_ids: list[list[int]], samples: list[list[list[int]]],
                     stop_ids: list[int]) -> list[list[Completion]]:
    """Each prompt's completions: its samples cut after their first stop id (kept) and decoded."""
    stops = set(stop_ids)

    def cut(sampled: list[int]) -> list[int]:
        end = next((i for i, t in enumerate(sampled) if t in stops), len(sampled) - 1)
        return list(sampled[: end + 1])

    token_ids = [[cut(sampled) for sampled in group] for group in samples]
    texts = iter(decode_texts(tokenizer, [ids for group in token_ids for ids in group]))
    # a cut sample ends with a stop id exactly when the model stopped
    return [[Completion(prompt_ids=list(prompt), token_ids=ids, text=next(texts),
                        finish_reason="stop" if ids and ids[-1] in stops else "length") for ids in group]
            for prompt, group in zip(prompt_ids, token_ids)]


def decode_texts(tokenizer, sequences: list[list[int]]) -> list[str]:
    """``tokenizer.decode(ids, skip_special_tokens=True)`` of every sequence.

    transformers decodes a batch one sequence at a time, each through its Python argument handling; a
    Rust-backed tokenizer that neither overrides decoding nor cleans up spaces gives the same strings from
    one call to its backend: a step's 64 × 768 ids in 10.1 ms against 16.4 on 2 cores, 11-12 on one
    (bench/detokenize_speed.py, bench/RESULTS.md)."""
    from transformers import TokenizersBackend  # here: grpo.config reads this module's lists, light

    if (type(tokenizer)._decode is not TokenizersBackend._decode
            or getattr(tokenizer, "clean_up_tokenization_spaces", True)):
        return [tokenizer.decode(ids, skip_special_tokens=True) for ids in sequences]
    return tokenizer.backend_tokenizer.decode_batch(sequences, skip_special_tokens=True)
