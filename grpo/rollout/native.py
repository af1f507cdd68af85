"""Generation with transformers' ``generate`` on a model in memory.

Training builds this engine over its policy (4-bit base plus injected LoRA), so rollouts always come
from the current weights with no export or reload. SENT and evaluation can use it through
``NativeEngine.from_pretrained`` when vLLM is not installed.

Batches are left-padded; transformers 5.17 derives position ids from the attention mask
(``cumsum - 1``), the same positions grpo.train.batch gives the scoring pass (tested in
tests/rollout/test_native_engine.py).

``backend="static"`` decodes with grpo.rollout.static_decode (static KV cache, CUDA graphs on a GPU)
instead of ``generate``: same interface, same greedy tokens, many times faster on a GPU. ``auto``
takes it on CUDA for the model types it supports and keeps ``generate`` elsewhere.
"""
from __future__ import annotations

import gc
import logging
from pathlib import Path

import torch
from tqdm import tqdm

from grpo.model.loading import disable_cpu_weight_repacking, load_policy_model, load_tokenizer
from grpo.rollout.base import Completion, SamplingParams, encode_prompts, make_completion, stop_token_ids
from grpo.rollout.static_decode import StaticDecoder, supports

BACKENDS = ("auto", "hf", "static")

log = logging.getLogger(__name__)


class NativeEngine:
    """``generate`` over ``model`` in batches of ``batch_size`` sequences (a prompt's n copies count n).

    ``batch_size`` is a plain attribute: the trainer resizes it between calls after an out-of-memory."""

    def __init__(self, model, tokenizer, *, batch_size: int, backend: str = "auto", merge_lora: bool = True,
                 release_dense: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.model = model
        # release_dense: the static decoder frees its dense weight copies after each generate() call,
        # so training does not carry them (measured in bench/RESULTS.md, GPU section)
        self.backend, self.merge_lora, self.release_dense = backend, merge_lora, release_dense
        self._decoder: StaticDecoder | None = None
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.stop_ids = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        # Sampling runs in eval mode without grad, where bitsandbytes would repack 4-bit weights and break
        # LoRA gradients afterwards (see disable_cpu_weight_repacking); the loader already does this,
        # but the engine is what triggers the repack, so it guards whatever model it is handed.
        if any(getattr(m, "support_avx512bf16_for_cpu", False) for m in model.modules()):
            disable_cpu_weight_repacking(model)
        # Set by from_pretrained: lets generate() switch adapters by reloading the base from disk.
        self._model_dir: Path | None = None
        self._load_kwargs: dict = {}
        self._adapter_dir: str | None = None

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, *, batch_size: int = 16, quantization: str = "none",
                        compute_dtype: str = "auto", device: str = "auto",
                        adapter_dir: str | None = None) -> "NativeEngine":
        """Load the HF folder ``model_dir`` (optionally with a PEFT-format adapter) for SENT or evaluation,
        through the training loader (grpo.model.loading: ``quantization`` nf4 or none, ``compute_dtype``
        auto = fp32 on CPU, bf16/fp16 on GPU).

        The engine owns this model, so ``generate(adapter_dir=...)`` may name another adapter (or None
        for the bare base): the base is then reloaded and the adapter applied, as vLLM switches adapters
        per call."""
        load_kwargs = {"quantization": quantization, "compute_dtype": compute_dtype, "device": device}
        adapter_dir = None if adapter_dir is None else str(adapter_dir)
        engine = cls(_load_model(model_dir, adapter_dir, load_kwargs), load_tokenizer(model_dir), batch_size=batch_size)
        engine._model_dir, engine._load_kwargs, engine._adapter_dir = Path(model_dir), load_kwargs, adapter_dir
        return engine

    def generate(self, prompts: list[str], params: SamplingParams, *, adapter_dir: str | None = None,
                 progress: bool = False) -> list[list[Completion]]:
        self._use_adapter(adapter_dir)
        prompt_ids = encode_prompts(self.tokenizer, prompts)
        empty = [i for i, ids in enumerate(prompt_ids) if not ids]
        if empty:
            raise ValueError(f"prompt {empty[0]} ({prompts[empty[0]][:60]!r}) encodes to no tokens with "
                             f"{type(self.tokenizer).__name__}: wrong tokenizer for this model folder?")
        # n copies of each prompt, adjacent, so a prompt's group usually shares a batch (and its padding).
        rows = [(i, ids) for i, ids in enumerate(prompt_ids) for _ in range(params.n)]
        groups: list[list[Completion]] = [[] for _ in prompts]
        starts = range(0, len(rows), self.batch_size)
        was_training = self.model.training
        self.model.eval()  # no dropout (LoRA's included) while sampling
        decoder = self._static_decoder()
        try:
            with torch.no_grad():
                for batch_index, start in enumerate(tqdm(starts, desc="generate", unit="batch", disable=not progress)):
                    chunk = rows[start:start + self.batch_size]
                    # One seed per batch: the same call gives the same samples, whatever ran before it.
                    torch.manual_seed(params.seed + batch_index)
                    sampled = self._generate_batch([ids for _, ids in chunk], params, decoder)
                    for (i, ids), out in zip(chunk, sampled):
                        groups[i].append(make_completion(self.tokenizer, ids, out, self.stop_ids))
        finally:
            self.model.train(was_training)
            if decoder is not None and self.release_dense:
                decoder.release()
        return groups

    def close(self) -> None:
        self.model = self._decoder = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _static_decoder(self) -> StaticDecoder | None:
        """The static decoder when the backend asks for it, its LoRA weights re-read for this call."""
        use = self.backend == "static" or (
            self.backend == "auto" and self.model.device.type == "cuda" and supports(self.model) is None)
        if not use:
            return None
        if self._decoder is None or self._decoder.model is not self.model:
            self._decoder = StaticDecoder(self.model, merge_lora=self.merge_lora)
        else:
            self._decoder.refresh()  # the policy's LoRA weights changed since the last call
        return self._decoder

    def _generate_batch(self, prompt_ids: list[list[int]], params: SamplingParams,
                        decoder: StaticDecoder | None = None) -> list[list[int]]:
        """Left-pad, generate, and return each row's new ids (pads after an early EOS still attached)."""
        width = max(len(ids) for ids in prompt_ids)
        device = self.model.device
        input_ids = torch.tensor([[self.pad_id] * (width - len(ids)) + ids for ids in prompt_ids], device=device)
        attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompt_ids],
                                      device=device)
        if decoder is not None:
            out = decoder.generate(input_ids, attention_mask, max_new_tokens=params.max_new_tokens,
                                   stop_ids=self.stop_ids, pad_id=self.pad_id, temperature=params.temperature,
                                   top_p=params.top_p, top_k=params.top_k)
            return out.tolist()  # the one host sync per batch (plus one per sync_every tokens)
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=params.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.stop_ids,
            use_cache=True,
            **_sampling_kwargs(params),
        )
        return out[:, width:].tolist()  # the one host sync per batch

    def _use_adapter(self, adapter_dir: str | None) -> None:
        adapter_dir = None if adapter_dir is None else str(adapter_dir)
        if adapter_dir == self._adapter_dir:
            return
        if self._model_dir is None:
            raise ValueError(
                "this NativeEngine wraps a model it did not load (the training policy), so it cannot "
                f"switch adapters; got adapter_dir={adapter_dir!r}. Use NativeEngine.from_pretrained."
            )
        log.info("native engine: loading %s with adapter %s", self._model_dir, adapter_dir or "(none)")
        self.model = None  # free the old weights before loading the new ones
        gc.collect()
        self.model = _load_model(self._model_dir, adapter_dir, self._load_kwargs)
        self._adapter_dir = adapter_dir


def _load_model(model_dir: str | Path, adapter_dir: str | None, load_kwargs: dict):
    model = load_policy_model(model_dir, gradient_checkpointing=False, **load_kwargs)
    if adapter_dir is not None:
        from grpo.model.adapter import load_adapter

        load_adapter(model, adapter_dir)
    return model.eval()


def _sampling_kwargs(params: SamplingParams) -> dict:
    """Every knob that shapes the next-token distribution, set explicitly: ``generate`` fills any unset
    one from the model's generation_config (Qwen2.5-Instruct ships top_k 20, repetition_penalty 1.05),
    which would make samples depend on a file vLLM ignores when it is handed SamplingParams."""
    if params.greedy:
        return {"do_sample": False, "temperature": 1.0, "top_p": 1.0, "top_k": None, "repetition_penalty": 1.0}
    return {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "repetition_penalty": 1.0}
