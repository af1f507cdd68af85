"""The memory phases of every GPU stage, planned from params.yaml with the formulas of grpo/memory_plan.py.

Each stage's engine, as the stage builds it:

- sent: ``make_engine(sent.engine)`` over models/base, unquantised in ``sent.dtype``, no LoRA, one
  ``generate`` call of ``sent.batch_size`` questions x ``sent.M`` samples at a time (stages/sent.py);
- train: the nf4/bf16 policy with LoRA and AdamW state; rollouts and validation, then training
  micro-batches (grpo/train/loop.py);
- evaluate: ``make_engine(evaluate.engine)`` over models/base in ``evaluate.dtype`` (unquantised), bare
  for ``base`` and with the trained adapter (``train.lora``) for ``final`` and ``best``, in batches of
  ``evaluate.batch_size`` sequences, for each benchmark of ``prepare.benchmarks`` with its protocol
  (grpo/eval/run.py);
- infer: ``grpo.infer``'s defaults: one sequence, base + adapter, unquantised, greedy.

Every phase is one process's: under torchrun (``<stage>.num_processes``, ``nnodes``) each process
needs its own device with that much memory. A process of SENT or evaluate runs whole engine batches of
the same size as one process does (grpo/distributed.py shards by batches), and a training rank
generates at most ``train.generation_batch_size`` rows and trains micro-batches of
``train.train_batch_size`` as one process does, plus the flat fp32 buffer of the gradient all-reduce
and its copy (``grad_allreduce``).

The native engine is planned. ``engine: vllm`` is planned as vLLM's own minimum (weights and one
full-length sequence: vLLM schedules its batch within ``gpu_memory_utilization``); ``auto`` is planned
as the native engine, the fallback where vLLM does not import (the case that must fit by itself).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from grpo.config import EvaluateParams, LoraParams, PrepareParams, ProtocolParams, SentParams
from grpo.hardware import cpu_native_bf16
from grpo.infer import DEFAULT_MAX_NEW_TOKENS
from grpo.memory_plan import (CUDA_RUNTIME_BYTES, LORA_LOADED_BYTES, Arch, Phase, capped_from, fitted_generation,
                              lora_params, plan_memory, uses_static_decoder, weight_bytes)

SECTIONS = ["model", "prepare", "sent", "train", "evaluate"]  # what plan_stages reads
EVAL_MODELS = ("base", "final,best")  # best has final's shape (same adapter config)


def planned_dtype(dtype: str, cuda: bool) -> str:
    """A compute dtype param resolved as the loader resolves ``auto``: bf16 on a GPU and on a CPU with
    native bf16 (grpo/hardware.py), fp32 otherwise."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if cuda or cpu_native_bf16() else "float32"


def _generation_phase(arch: Arch, stage: str, *, engine: str, dtype: str, cuda: bool, sequences: int,
                      prompt_tokens: int, new_tokens: int, knob: str, tokens_knob: str,
                      adapter: LoraParams | None = None, greedy: bool = False, top_p: float = 1.0,
                      top_k: int = 0, quantised: bool = False, budget: int | None = None) -> Phase:
    """A generation-only stage over an engine that loads models/base (optionally + an adapter); on a
    GPU with a ``budget`` the native engine decodes only the rows that fit it (grpo/rollout/budget.py)."""
    vllm = engine == "vllm"
    targets = tuple(adapter.targets) if adapter is not None else ()
    resident = [("base_weights", weight_bytes(arch, dtype, quantised)),
                ("adapter", lora_params(arch, adapter.r, targets) * LORA_LOADED_BYTES if adapter else 0),
                ("runtime", CUDA_RUNTIME_BYTES if cuda else 0)]
    requested = 1 if vllm else sequences
    in_flight, rows = fitted_generation(
        arch, requested, budget if cuda and not vllm else None, sum(v for _, v in resident), dtype=dtype,
        quantised=quantised, prompt_tokens=prompt_tokens, new_tokens=new_tokens,
        static_decoder=uses_static_decoder("auto", cuda) and not vllm, lora_targets=targets, greedy=greedy,
        top_p=top_p, top_k=top_k)
    if vllm:  # vLLM's minimum: weights and one full-length sequence's cache; the batch is its own
        rows = {"kv_cache": rows["kv_cache"]}
        knob = ""
    return Phase(stage, "generation", tuple(resident + list(rows.items())), knob, tokens_knob, in_flight,
                 new_tokens, capped_from(requested, in_flight))


def plan_sent(arch: Arch, s: SentParams, prep: PrepareParams, *, cuda: bool, prompt_tokens: int,
              budget: int | None = None) -> Phase:
    questions = s.batch_size if prep.max_train is None else min(s.batch_size, prep.max_train)
    return _generation_phase(arch, "sent", engine=s.engine, dtype=planned_dtype(s.dtype, cuda), cuda=cuda,
                             sequences=questions * s.M, prompt_tokens=prompt_tokens, new_tokens=s.max_new_tokens,
                             knob="sent.batch_size", tokens_knob="sent.max_new_tokens",
                             top_p=s.top_p, top_k=s.top_k, budget=budget)


def plan_evaluate(arch: Arch, e: EvaluateParams, benchmark: str, model: str, *, adapter: LoraParams,
                  prep: PrepareParams, cuda: bool, prompt_tokens: int, budget: int | None = None) -> Phase:
    protocol = e.benchmarks.get(benchmark, ProtocolParams())
    sequences = e.batch_size
    if benchmark in prep.max_eval:  # a short benchmark never fills a larger batch
        sequences = min(sequences, prep.max_eval[benchmark] * protocol.n)
    return _generation_phase(arch, f"evaluate {model}/{benchmark}", engine=e.engine,
                             dtype=planned_dtype(e.dtype, cuda), cuda=cuda, sequences=sequences,
                             prompt_tokens=prompt_tokens, new_tokens=protocol.max_new_tokens,
                             knob="evaluate.batch_size",
                             tokens_knob=f"evaluate.benchmarks.{benchmark}.max_new_tokens",
                             adapter=None if model == "base" else adapter,
                             greedy=protocol.temperature == 0, top_p=protocol.top_p, budget=budget)


def plan_infer(arch: Arch, adapter: LoraParams, *, cuda: bool, prompt_tokens: int) -> Phase:
    return _generation_phase(arch, "infer", engine="native", dtype=planned_dtype("auto", cuda), cuda=cuda,
                             sequences=1, prompt_tokens=prompt_tokens, new_tokens=DEFAULT_MAX_NEW_TOKENS,
                             knob="", tokens_knob="--max-new-tokens", adapter=adapter, greedy=True)


def plan_stages(params: dict[str, Any], arch: Arch, *, cuda: bool, prompt_tokens: int,
                prompt_tokens_by: dict[str, int] | None = None, budget: int | None = None) -> list[Phase]:
    """Every GPU phase of the stages ``params`` enable, in pipeline order. ``params``: the validated
    ``SECTIONS``. ``prompt_tokens`` is the longest prompt to plan for; ``prompt_tokens_by`` may set it
    per stage ("sent", "train", "infer") or per benchmark name. With a GPU ``budget`` (bytes), native
    generation decodes the rows that fit it, as the engines do at run time."""
    by = prompt_tokens_by or {}
    prep, train, ev = params["prepare"], params["train"], params["evaluate"]
    phases: list[Phase] = []
    if params["sent"].enabled:
        phases.append(plan_sent(arch, params["sent"], prep, cuda=cuda, prompt_tokens=by.get("sent", prompt_tokens),
                                budget=budget))
    train_phases = plan_memory(arch, train, compute_dtype=planned_dtype(train.compute_dtype, cuda),
                               prompt_tokens=by.get("train", prompt_tokens), cuda=cuda, budget=budget)
    if train.num_processes * train.nnodes > 1:  # grpo.distributed.all_reduce_gradients' buffer and copy
        grad_buffer = ("grad_allreduce", 2 * 4 * lora_params(arch, train.lora.r, tuple(train.lora.targets)))
        train_phases = [dataclasses.replace(p, rows=p.rows + (grad_buffer,)) if p.name == "training" else p
                        for p in train_phases]
    phases.extend(train_phases)
    for benchmark in prep.benchmarks:
        for model in EVAL_MODELS:
            phases.append(plan_evaluate(arch, ev, benchmark, model, adapter=train.lora, prep=prep, cuda=cuda,
                                        prompt_tokens=by.get(benchmark, prompt_tokens), budget=budget))
    phases.append(plan_infer(arch, train.lora, cuda=cuda, prompt_tokens=by.get("infer", prompt_tokens)))
    return phases


def with_param(params: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """``params`` with the top-level field ``section.name`` replaced."""
    section, name = key.split(".")
    return {**params, section: dataclasses.replace(params[section], **{name: value})}


def largest_fitting(params: dict[str, Any], phase: Phase, arch: Arch, *, budget: int, **plan_kwargs: Any) -> int:
    """The largest value of ``phase.knob`` (at most its current value) whose plan of the same phase
    fits ``budget`` bytes; 0 when not even 1 does (or the phase has no batch knob). ``plan_kwargs``:
    ``plan_stages``' (the budget is passed on: engines cap their rows to it)."""
    if not phase.knob:
        return 0
    current = getattr(params[phase.knob.split(".")[0]], phase.knob.split(".")[1])

    def peak(value: int) -> int:
        planned = plan_stages(with_param(params, phase.knob, value), arch, budget=budget, **plan_kwargs)
        return next(p.peak for p in planned if (p.stage, p.name) == (phase.stage, phase.name))

    lo, hi = 0, current  # peak(lo) fits (or lo == 0), peak(hi + 1) does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if peak(mid) <= budget else (lo, mid - 1)
    return lo


def data_prompt_tokens(project: Path, raw: dict) -> dict[str, int]:
    """The longest prompt, in tokens, of the questions each stage reads from the project's
    ``data/prepared`` (built by the project's own prompt builder and tokenizer): ``prompt_tokens_by``
    for ``plan_stages``, where a plan should use the user's data rather than an assumed length."""
    from grpo.config import parse_section
    from grpo.io import read_jsonl
    from grpo.model.loading import load_tokenizer
    from grpo.prompts import PromptStyle, build_prompt

    prepared = project / "data" / "prepared"
    for need in (project / "models" / "base", prepared / "train.jsonl"):
        if not need.exists():
            raise FileNotFoundError(f"{need} not found: run `dvc repro prepare base_model` first")
    tok = load_tokenizer(project / "models" / "base")
    style = PromptStyle.from_params(parse_section("prompt", raw.get("prompt") or {}))

    def longest(path: Path) -> int:
        rows = read_jsonl(path) if path.exists() else []
        return max((len(tok(build_prompt(tok, row["question"], style), add_special_tokens=False)["input_ids"])
                    for row in rows), default=0)

    train = longest(prepared / "train.jsonl")
    by = {"sent": train, "train": max(train, longest(prepared / "val.jsonl"))}
    benchmarks = (raw.get("prepare") or {}).get("benchmarks") or []
    return by | {b: longest(prepared / "eval" / f"{b}.jsonl") for b in benchmarks}
