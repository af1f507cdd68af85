"""Generation with transformers' ``generate`` or the static decoder on a model in memory.

Training builds this engine over its policy (4-bit base plus injected LoRA), so rollouts always come
from the current weights with no export or reload. SENT and evaluation can use it through
``NativeEngine.from_pretrained`` when vLLM is not installed.

Batches are left-padded; transformers 5.17 derives position ids from the attention mask
(``cumsum - 1``), the same positions grpo.train.step gives the scoring pass (tested in
tests/rollout/test_native_engine.py).

``backend="static"`` decodes with grpo.rollout.static_decode (static KV cache, continuous batching,
CUDA graphs on a GPU) instead of ``generate``: same interface, same greedy tokens, many times faster
on a GPU. ``auto`` takes it on CUDA for the model types it supports and keeps ``generate`` elsewhere.

Sampling is keyed per row (grpo.rollout.sampling): row (prompt i of the call, sample j) draws from
the noise of (seed, i, j, position), through a logits processor on the ``generate`` path and inside
the decoder on the static path, so the two paths draw the same tokens for equal logits and a row's
tokens do not depend on which batch or slot it lands in. Callers that split their work into several
calls give each call its own seed (grpo.sent.scoring.batch_seed: a function of the batch's position,
which keeps SENT's resume contract).

Out of memory anywhere in a call (a real one, or ``GRPO_FAULT_OOM`` phase ``generate``, grpo/train/
memory.py) frees memory, halves the rows in flight and redoes only the rows that had not finished;
thanks to the keyed sampling the outputs equal an unfaulted run's.
"""
from __future__ import annotations

import gc
import logging
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm
from transformers import LogitsProcessor, LogitsProcessorList

from grpo.model.loading import disable_cpu_weight_repacking, load_policy_model, load_tokenizer
from grpo.model.lora import lora_modules
from grpo.rollout.base import (GENERATION_BACKENDS, Completion, SamplingParams, encode_prompts, make_completions,
                               stop_token_ids)
from grpo.rollout.budget import slots_for_model
from grpo.rollout.sampling import keyed_scores, row_keys, vocab_offsets
from grpo.rollout.static_decode import StaticDecoder, supports
from grpo.fault_injection import FaultHook
from grpo.microbatch import AdaptiveBatchSize, free_memory

GENERATION_ADVICE = "lower max_new_tokens (or the prompts' length), or use a smaller model."

log = logging.getLogger(__name__)


class NativeEngine:
    """Generation over ``model`` with at most ``batch_size`` sequences in flight (a prompt's n samples
    count n): ``generate`` decodes them in batches, the static decoder in as many slots.

    ``size`` adapts the rows in flight to out-of-memory errors across calls, as the trainer's
    micro-batches do (grpo.microbatch; the trainer passes its own ``size`` and ``fault_hook`` so
    that its checkpoints and metrics carry them). ``max_slots_for(prompt_tokens, params)``, when
    given, caps the rows in flight for a memory budget (grpo.memory_plan's formula and the free memory;
    on a GPU grpo/rollout/budget.py's by default): ``prompt_tokens`` is a call's longest prompt,
    ``params`` its sampling. ``decoder``, when given, is the static decoder to use (the tests' small
    buckets); by default one is built over ``model`` on first use."""

    def __init__(self, model, tokenizer, *, batch_size: int, backend: str = "auto", merge_lora: bool = True,
                 read_4bit_mlp: bool = False, keep_dense: bool = False, release_dense: bool = True,
                 size: AdaptiveBatchSize | None = None,
                 fault_hook: FaultHook | None = None, max_slots_for: Callable[[int, SamplingParams], int] | None = None,
                 decoder: StaticDecoder | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if backend not in GENERATION_BACKENDS:
            raise ValueError(f"backend must be one of {GENERATION_BACKENDS}, got {backend!r}")
        self.batch_size = batch_size
        self.size = size or AdaptiveBatchSize("generate", batch_size, advice=GENERATION_ADVICE)
        self.hook = fault_hook or FaultHook()
        self.max_slots_for = max_slots_for
        self.model = model
        # release_dense: the static decoder frees its dense weight copies after each generate() call,
        # so training does not carry them (measured in bench/RESULTS.md, GPU section), keep_dense's aside
        self.backend, self.merge_lora, self.release_dense = backend, merge_lora, release_dense
        # the static decoder's (grpo/rollout/static_layers.py); keep_dense: train.dense_training's kept copies
        self.read_4bit_mlp, self.keep_dense = read_4bit_mlp, keep_dense
        self._decoder: StaticDecoder | None = decoder
        self.tokenizer = tokenizer
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
                        compute_dtype: str = "auto", device: str = "auto", adapter_dir: str | None = None,
                        max_slots_for: Callable[[int, SamplingParams], int] | None = None) -> "NativeEngine":
        """Load the HF folder ``model_dir`` (optionally with a PEFT-format adapter) for SENT or evaluation,
        through the training loader (grpo.model.loading: ``quantization`` nf4 or none, ``compute_dtype``
        auto = fp32 on CPU, bf16/fp16 on GPU).

        The engine owns this model, so ``generate(adapter_dir=...)`` may name another adapter (or None
        for the bare base): the base is then reloaded and the adapter applied, as vLLM switches adapters
        per call."""
        load_kwargs = {"quantization": quantization, "compute_dtype": compute_dtype, "device": device}
        adapter_dir = None if adapter_dir is None else str(adapter_dir)
        engine = cls(_load_model(model_dir, adapter_dir, load_kwargs), load_tokenizer(model_dir), batch_size=batch_size,
                     max_slots_for=max_slots_for)
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
        # n copies of each prompt, adjacent (a group usually shares a batch and its padding):
        # row r is sample r % n of prompt r // n, and that pair keys its sampling
        n = params.n
        rows = [ids for ids in prompt_ids for _ in range(n)]
        index = torch.arange(len(rows))
        keys = row_keys(params.seed, index // n + params.first_prompt, index % n)
        was_training = self.model.training
        self.model.eval()  # no dropout (LoRA's included) while sampling
        decoder = self._static_decoder()
        if self.max_slots_for is None and self.model.device.type == "cuda":
            # on a GPU every call sizes its rows in flight from the memory left (grpo/rollout/budget.py)
            targets = tuple(sorted({name.rsplit(".", 1)[-1] for name in lora_modules(self.model)}))
            self.max_slots_for = slots_for_model(self.model, static_decoder=decoder is not None,
                                                 lora_targets=targets, merge_lora=self.merge_lora,
                                                 read_4bit_mlp=decoder is not None and decoder.read_4bit_mlp)
        try:
            with torch.no_grad(), tqdm(total=len(rows), desc="generate", unit="seq", disable=not progress) as bar:
                done = self._generate_rows(rows, keys, params, decoder, bar.update)
        finally:
            self.model.train(was_training)
            if decoder is not None and self.release_dense:
                decoder.release()
        with torch.profiler.record_function("grpo/engine.detokenize"):  # a sub-phase in a `grpo.profile` trace
            return make_completions(self.tokenizer, prompt_ids,
                                    [[done[i * n + j] for j in range(n)] for i in range(len(prompt_ids))],
                                    self.stop_ids)

    def _generate_rows(self, rows: list[list[int]], keys: torch.Tensor, params: SamplingParams,
                       decoder: StaticDecoder | None, advance: Callable[[], object]) -> dict[int, list[int]]:
        """Every row's new ids. On out of memory: free memory, halve the rows in flight, and redo only
        the rows that had not finished (``advance`` ticks the progress bar once per finished row)."""
        done: dict[int, list[int]] = {}
        had_oom = False
        while len(done) < len(rows):
            pending = [r for r in range(len(rows)) if r not in done]
            in_flight = self._rows_in_flight([rows[r] for r in pending], params)

            def finish(i: int, ids: list[int]) -> None:
                done[pending[i]] = ids
                advance()

            try:
                self._run(decoder, [rows[r] for r in pending], keys[pending], params, in_flight, finish)
                oom = False
            except torch.OutOfMemoryError:
                oom = True
            if oom:  # out of the except block, so the traceback no longer holds the failed tensors
                free_memory()
                self.size.current = in_flight  # halve what was really in flight
                self.size.shrink()
                had_oom = True
        self.size.end_step(had_oom)
        return done

    def _rows_in_flight(self, rows: list[list[int]], params: SamplingParams) -> int:
        """How many rows decode at once: the adaptive size, capped by the memory budget and the rows."""
        limit = min(self.size.current, len(rows))
        if self.max_slots_for is not None:
            prompt_tokens = max(map(len, rows))
            budget = self.max_slots_for(prompt_tokens, params)
            if budget < 1:
                log.warning("the memory budget fits no sequence of %d + %d tokens; trying one at a time",
                            prompt_tokens, params.max_new_tokens)
            limit = min(limit, max(1, budget))
        return limit

    def _run(self, decoder: StaticDecoder | None, rows: list[list[int]], keys: torch.Tensor,
             params: SamplingParams, in_flight: int, finish: Callable[[int, list[int]], None]) -> None:
        """Generate ``rows`` with ``in_flight`` at once, calling ``finish(i, new ids)`` as row i ends: the
        static decoder keeps ``in_flight`` slots busy; ``generate`` runs consecutive batches."""
        if decoder is not None:
            decoder.generate(rows, keys=keys, max_new_tokens=params.max_new_tokens, stop_ids=self.stop_ids,
                             pad_id=self.pad_id, temperature=params.temperature, top_p=params.top_p,
                             top_k=params.top_k, slots=in_flight, on_done=finish,
                             before_prefill=lambda slots: self.hook.check("generate", slots))
            return
        for start in range(0, len(rows), in_flight):
            chunk = range(start, min(start + in_flight, len(rows)))
            self.hook.check("generate", len(chunk))
            outputs = self._generate_batch([rows[i] for i in chunk], keys[chunk.start:chunk.stop], params)
            for i, ids in zip(chunk, outputs):
                finish(i, ids)

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
            self._decoder = StaticDecoder(self.model, merge_lora=self.merge_lora, read_4bit_mlp=self.read_4bit_mlp,
                                          keep_dense=self.keep_dense)
        else:
            self._decoder.refresh()  # the policy's LoRA weights changed since the last call
        return self._decoder

    def _generate_batch(self, prompt_ids: list[list[int]], keys: torch.Tensor,
                        params: SamplingParams) -> list[list[int]]:
        """Left-pad and ``generate``; returns each row's new ids (pads after an early stop still attached)."""
        width = max(len(ids) for ids in prompt_ids)
        device = self.model.device
        input_ids = torch.tensor([[self.pad_id] * (width - len(ids)) + ids for ids in prompt_ids], device=device)
        attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompt_ids],
                                      device=device)
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=params.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.stop_ids,
            use_cache=True,
            **_sampling_kwargs(params, keys.to(device), width),
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


class _KeyedSampling(LogitsProcessor):
    """``generate``'s hook into grpo.rollout.sampling: the warped logits plus each row's keyed Gumbel
    noise, so the argmax that greedy decoding then takes is the keyed sample. transformers 5.17 runs
    custom processors after its own (none here: every knob of ``_sampling_kwargs`` is neutral)."""

    def __init__(self, keys: torch.Tensor, width: int, params: SamplingParams) -> None:
        self.keys, self.width, self.params = keys, width, params
        self.offsets: torch.Tensor | None = None  # the vocabulary's noise offsets, made at the first token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        positions = torch.full_like(self.keys, input_ids.shape[1] - self.width)  # index in the response
        if self.offsets is None:
            self.offsets = vocab_offsets(scores.shape[-1], scores.device)
        p = self.params
        return keyed_scores(scores, self.keys, positions, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                            offsets=self.offsets)


def _sampling_kwargs(params: SamplingParams, keys: torch.Tensor, width: int) -> dict:
    """Greedy decoding, every other knob set explicitly neutral, plus the keyed sampler unless greedy.
    Explicit, because ``generate`` fills any unset knob from the model's generation_config (Qwen2.5-
    Instruct ships top_k 20, repetition_penalty 1.05), which would make samples depend on a file vLLM
    ignores when it is handed SamplingParams."""
    kwargs = {"do_sample": False, "temperature": 1.0, "top_p": 1.0, "top_k": None, "repetition_penalty": 1.0}
    if not params.greedy:
        kwargs["logits_processor"] = LogitsProcessorList([_KeyedSampling(keys, width, params)])
    return kwargs
