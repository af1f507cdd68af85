"""The settings the tuner may change: per stage, the knobs that trade memory for speed, and their candidates.

Each knob is a dotted params key and a few values around the current one (half, same, double, and the
whole step where that is the natural top), so a search stays a handful of trials per knob. On a CPU the
compute dtype and, for SENT, the engine are knobs too: which is faster depends on the CPU (native bf16 or
not), which is exactly what a measured trial finds out.
"""
from __future__ import annotations

import importlib.util
from typing import Any

from grpo.rollout.base import ENGINE_KINDS
from grpo.stage_plans import planned_dtype

STAGES = ("train", "sent", "evaluate")  # what `grpo.tune --stages` may name, in pipeline order
SPEED = {"train": "s/step", "sent": "tok/s", "evaluate": "tok/s"}  # train: lower wins; others: higher


# A candidate replaces the current best only when it is this much faster: two trials of one setting
# (SENT's engine `auto`, which resolves to vLLM, and `vllm`) measured 885 and 934 tokens/s on the 2-core
# CPU, 5.5% apart, and training trials of three steps spread as much (bench/RESULTS.md, "grpo.tune on a
# CPU"); a smaller gain is as likely noise, and changing a setting for it churns params.yaml.
MIN_GAIN = 0.10


def faster(stage: str, a: float, b: float) -> bool:
    """Is speed ``a`` better than ``b`` by at least ``MIN_GAIN`` for this stage's measure?"""
    gain = b / a if stage == "train" else a / b
    return gain >= 1 + MIN_GAIN


# Which way each knob trades memory: +1, a smaller value needs less (smaller batches and chunks, the 4-bit
# base instead of a dense copy); -1, a larger one does (checkpointing on). The decoder's MLP read in 4 bits
# (train.generation_mlp_4bit) saves 2.2 GiB at the 1.5B shape but is no longer only a memory saver: a decode
# step at 16 sequences is 1.08x faster than the dense copy's, at 64 1.17x slower (H100, bench/RESULTS.md), so the
# search measures it as any other knob.
MEMORY_ORDER = {"train.generation_batch_size": 1, "train.train_batch_size": 1, "train.logprob_chunk_size": 1,
                "train.dense_generation": 1, "train.dense_training": 1, "train.gradient_checkpointing": -1,
                "sent.batch_size": 1, "evaluate.batch_size": 1}


def leaner(key: str, value: Any, current: Any) -> bool:
    """Does ``value`` of knob ``key`` only save memory against ``current``? On a GPU such a value is never
    faster (more and smaller kernels, a recomputed forward, de-quantising matmuls: micro-batch 8 took 9.68
    s/step against 16's 6.60, log-prob chunk 512 6.83 against 1024's 6.60; bench/RESULTS.md), so the search
    measures it only once the current setting fails. On a CPU a smaller batch can be faster (caches)."""
    order = MEMORY_ORDER.get(key)
    return order is not None and (value - current) * order < 0


# Knobs whose value True costs every trial a one-off (a compile: 48-75 s on an H100 or H200, where a trial
# is otherwise about 40 s; bench/RESULTS.md): the search measures the other knobs with it off and tries it
# last (knob_values lists it last), so two trials pay it rather than every one.
ONE_OFF_COSTS = ("train.compile_layers",)


def _around(current: int, top: int) -> list[int]:
    return sorted({v for v in (current // 2, current, current * 2) if 1 <= v <= top})


def _dtypes(current: str) -> list[str]:
    """A CPU's dtype candidates: the current one (``auto`` stays ``auto``, so a tuned params file keeps
    choosing by capability) and whichever of fp32/bf16 it does not resolve to here."""
    resolved = planned_dtype(current, cuda=False)
    return [current] + [d for d in ("float32", "bfloat16") if d != resolved]


def _engines(current: str) -> list[str]:
    """SENT's engine candidates on a CPU where vLLM is installed: the current one (``auto`` stays ``auto``)
    and the engine it does not resolve to (there ``auto`` is vLLM: grpo/rollout/engines.py)."""
    resolved = "vllm" if current == "auto" else current
    return [current] + [e for e in ENGINE_KINDS if e not in ("auto", resolved)]


def knob_values(stage: str, raw: dict[str, Any], gpu: bool) -> dict[str, list[Any]]:
    """{params key: candidate values} for ``stage``, from the user's raw params; the current value is
    always among the candidates."""
    if stage == "train":
        t = raw["train"]
        sequences = t["prompts_per_step"] * t["group_size"]
        knobs: dict[str, list[Any]] = {
            "train.generation_batch_size": sorted(set(_around(t["generation_batch_size"], sequences)) | {sequences}),
            "train.train_batch_size": _around(t["train_batch_size"], sequences),
            "train.gradient_checkpointing": [True, False],
        }
        if t.get("quantization", "nf4") == "nf4":
            knobs["train.dense_generation"] = [True, False]
            knobs["train.dense_training"] = [True, False]
        if gpu:
            knobs["train.generation_merge_lora"] = [True, False]
            if t.get("quantization", "nf4") == "nf4":  # the decoder's MLP read in 4 bits: no dense copy of it
                knobs["train.generation_mlp_4bit"] = [False, True]
            knobs["train.logprob_chunk_size"] = _around(t["logprob_chunk_size"], 1 << 16)
        else:
            knobs["train.compute_dtype"] = _dtypes(t["compute_dtype"])
        # a compile paid once against seconds saved each step: the trial's figure spreads the first step's
        # cost over the run (grpo/tuning/trial.py), so a short run keeps the eager layers (ONE_OFF_COSTS)
        knobs["train.compile_layers"] = [False, True]
        return knobs
    if stage in ("sent", "evaluate"):
        section = raw[stage]
        knobs = {f"{stage}.batch_size": _around(section["batch_size"], 1 << 12)}
        if not gpu:
            knobs[f"{stage}.dtype"] = _dtypes(section["dtype"])
            if stage == "sent" and importlib.util.find_spec("vllm"):
                knobs["sent.engine"] = _engines(section["engine"])
        return knobs
    raise ValueError(f"--stages: unknown stage {stage!r}; choose from {', '.join(STAGES)}")


def current_settings(params: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """The values ``keys`` have in the validated ``params`` (defaults included)."""
    return {key: getattr(params[key.split(".")[0]], key.split(".")[1]) for key in keys}
