"""Evaluate one model (base, or base + an adapter) on one benchmark: generate, extract, verify, score.

Every question is prompted exactly as in training (``grpo.prompts.build_prompt`` with the ``prompt``
params), the answer is extracted leniently from the full response (prefill + completion), and
checked against the gold answer with the benchmark row's ``answer_type``. Outputs:

- ``eval/<model>/<benchmark>.jsonl``: one line per sample (``id``, ``sample``, ``completion``, ``answer``,
  ``gold``, ``correct``, ``length`` in tokens, ``finish_reason``), for error analysis and the report
  (a sample whose check timed out is not correct; ``verify_timeouts`` in the metrics counts them);
- ``metrics/eval/<model>/<benchmark>.json``: the metrics of ``grpo.eval.metrics.summarize``;
- ``logs/eval/<model>/<benchmark>.json``: the generation time and speed (untracked, grpo/measured.py).

The adapter is applied by the engine (vLLM serves it as a LoRA on the unchanged base, the native
engine injects it), never merged into a new base, so all three models share one ``models/base``.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

from grpo import distributed
from grpo.config import EvaluateParams, ProtocolParams
from grpo.eval.metrics import SampleResult, summarize
from grpo.eval.summary import MODELS
from grpo.fault_injection import kill_point
from grpo.io import atomic_write_json, read_jsonl, write_jsonl
from grpo.measured import eval_log, write_log
from grpo.prompts import PromptStyle, build_prompt, full_response
from grpo.rollout.base import GenerationEngine, SamplingParams
from grpo.rollout.engines import make_engine, resolve_engine_kind
from grpo.verify import Verdict, answers_equivalent, extract_answer, judge

log = logging.getLogger(__name__)
ADAPTER_CONFIG = "adapter_config.json"  # the PEFT file name; grpo.model.adapter would import torch here


@dataclass(frozen=True)
class EvalPaths:
    """Where evaluation reads and writes, relative to ``root`` (the project root in the DVC stages)."""

    root: Path = Path(".")

    @property
    def base_model(self) -> Path:
        return self.root / "models" / "base"

    def adapter(self, model: str) -> Path | None:
        """The adapter folder of ``model``: None for the base, models/final or models/best otherwise."""
        if model not in MODELS:
            raise ValueError(f"--model must be one of {', '.join(MODELS)}, got {model!r}")
        return None if model == "base" else self.root / "models" / model

    def benchmark(self, name: str) -> Path:
        return self.root / "data" / "prepared" / "eval" / f"{name}.jsonl"

    def samples(self, model: str, benchmark: str) -> Path:
        return self.root / "eval" / model / f"{benchmark}.jsonl"

    def metrics(self, model: str, benchmark: str) -> Path:
        return self.root / "metrics" / "eval" / model / f"{benchmark}.json"

    def measured(self, model: str, benchmark: str) -> Path:
        return eval_log(self.root, model, benchmark)


def sampling_params(protocol: ProtocolParams, seed: int) -> SamplingParams:
    return SamplingParams(n=protocol.n, temperature=protocol.temperature, top_p=protocol.top_p,
                          max_new_tokens=protocol.max_new_tokens, seed=seed)


def evaluate_rows(engine: GenerationEngine, tokenizer, rows: list[dict], protocol: ProtocolParams,
                  style: PromptStyle, *, adapter_dir: Path | None, seed: int,
                  shard_unit: int = 1) -> tuple[list[dict], dict[str, float], dict[str, float]]:
    """Generate ``protocol.n`` samples per row and score them: (per-sample records, metrics, measured
    figures: this process's generation wall time and generated tokens per second).

    Under torchrun each process generates and scores a contiguous share of the prompts (in the
    length order below), cut at multiples of ``shard_unit`` prompts (one engine batch), and every
    process gets the whole records and metrics back: the same as one process computes."""
    prompts = [build_prompt(tokenizer, row["question"], style) for row in rows]
    # Shortest first, so the native engine's consecutive batches hold prompts of similar length: a
    # batch is left-padded to its longest prompt, and on CPU the padded prefill can cost as much as
    # the decoding (one 449-token MATH-500 prompt doubled that benchmark's time). vLLM does not pad.
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    lo, hi = distributed.shard_bounds(len(order), shard_unit)
    mine = order[lo:hi]
    start = time.perf_counter()
    generated = engine.generate([prompts[i] for i in mine], replace(sampling_params(protocol, seed), first_prompt=lo),
                                adapter_dir=None if adapter_dir is None else str(adapter_dir),
                                progress=True) if mine else []
    elapsed = time.perf_counter() - start
    scored = {i: _score_question(rows[i], group, style) for i, group in zip(mine, generated)}
    tokens = sum(r["length"] for records, _ in scored.values() for r in records)
    for part in distributed.gather(scored):
        scored.update(part)
    records = [record for i in range(len(rows)) for record in scored[i][0]]
    results = [scored[i][1] for i in range(len(rows))]
    measured = {"generate_s": elapsed, "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0}
    return records, summarize(results, equivalent=answers_equivalent), measured


def _score_question(row: dict, group: list, style: PromptStyle) -> tuple[list[dict], list[SampleResult]]:
    """One question's samples: their records for the samples file and their results for the metrics."""
    records, results = [], []
    for index, completion in enumerate(group):
        answer = extract_answer(full_response(style, completion.text), mode="lenient",
                                finish_reason=completion.finish_reason)
        verdict = judge(answer, row["answer"], row["answer_type"])
        correct = verdict is Verdict.EQUIVALENT
        results.append(SampleResult(correct, answer, len(completion.token_ids), completion.finish_reason,
                                    timed_out=verdict is Verdict.TIMEOUT))
        records.append({"id": row["id"], "sample": index, "completion": completion.text, "answer": answer,
                        "gold": row["answer"], "correct": correct, "length": len(completion.token_ids),
                        "finish_reason": completion.finish_reason})
    return records, results


def _max_lora_rank(adapter_dir: Path | None) -> int:
    """The adapter's rank rounded up to a power of two >= 8: vLLM accepts only a fixed set of maximum
    ranks (8, 16, 32, 64, ...), and the adapter may have any rank up to it."""
    if adapter_dir is None:
        return 8
    rank = int(json.loads((adapter_dir / ADAPTER_CONFIG).read_text(encoding="utf-8"))["r"])
    return max(8, 1 << (rank - 1).bit_length())


def run_evaluation(model: str, benchmark: str, params: EvaluateParams, style: PromptStyle,
                   paths: EvalPaths = EvalPaths()) -> dict[str, float]:
    """Evaluate ``model`` on ``benchmark`` and write its per-sample outputs and metrics; returns the metrics.

    The protocol is ``params.benchmarks[benchmark]``, or ProtocolParams' defaults (greedy) when the
    benchmark has no entry.
    """
    adapter_dir = paths.adapter(model)
    if adapter_dir is not None and not (adapter_dir / ADAPTER_CONFIG).is_file():
        raise FileNotFoundError(f"adapter for model {model!r} not found at {adapter_dir} "
                                f"(run the {'train' if model == 'final' else 'select'} stage first)")
    if adapter_dir is not None:
        check_adapter_base(adapter_dir, paths.base_model)
    data = paths.benchmark(benchmark)
    if not data.is_file():
        raise FileNotFoundError(f"benchmark file {data} not found: add {benchmark!r} to prepare.benchmarks")
    rows = read_jsonl(data)
    if not rows:
        raise ValueError(f"benchmark file {data} is empty")
    protocol = params.benchmarks.get(benchmark, ProtocolParams())
    from grpo.model.loading import load_tokenizer  # imports torch: here, so eval_summary stays light

    tokenizer = load_tokenizer(paths.base_model)
    # one engine kind for base, final and best (the stage serves adapters), so that a difference
    # between models is never a difference between engines
    kind = resolve_engine_kind(params.engine, serves_adapters=True)
    engine = make_engine(kind, model_dir=paths.base_model, dtype=params.dtype, batch_size=params.batch_size,
                         max_model_len=_max_model_len(tokenizer, rows, protocol, style),
                         enable_lora=adapter_dir is not None, max_lora_rank=_max_lora_rank(adapter_dir),
                         seed=params.seed, adapter_dir=adapter_dir)
    try:
        log.info("evaluating %s on %s: %d questions x %d samples, temperature %s, up to %d new tokens",
                 model, benchmark, len(rows), protocol.n, protocol.temperature, protocol.max_new_tokens)
        # shards end on the engine's batch boundaries, so every batch is one a single process runs too
        unit = math.lcm(params.batch_size, protocol.n) // protocol.n
        records, metrics, measured = evaluate_rows(engine, tokenizer, rows, protocol, style,
                                                   adapter_dir=adapter_dir, seed=params.seed, shard_unit=unit)
    finally:
        engine.close()
    if not distributed.is_main():
        return metrics  # rank 0 writes the files
    write_jsonl(paths.samples(model, benchmark), records)
    kill_point("evaluate.samples")
    atomic_write_json(paths.metrics(model, benchmark), metrics)
    write_log(paths.measured(model, benchmark), measured)
    log.info("%s on %s: pass@1 %.3f +- %.3f, truncated %.2f, %.1f tokens/s", model, benchmark,
             metrics["pass@1"], metrics["pass@1_stderr"], metrics["truncation_rate"], measured["tokens_per_s"])
    return metrics


def check_adapter_base(adapter_dir: Path, base_dir: Path) -> None:
    """Refuse an adapter trained on another base than models/base: with equal shapes it would load and
    silently evaluate nonsense. The base's identity is the ``source`` in MODEL_INFO.json (what the
    train stage writes into the adapter); a base folder without MODEL_INFO.json is not checked."""
    info = base_dir / "MODEL_INFO.json"
    if not info.is_file():
        return
    from grpo.model.adapter import read_adapter_config  # imports torch

    trained_on = read_adapter_config(adapter_dir).get("base_model_name_or_path")
    base = json.loads(info.read_text(encoding="utf-8"))["source"]
    if trained_on != base:
        raise ValueError(f"{adapter_dir}: base_model_name_or_path mismatch: the adapter was trained on "
                         f"{trained_on!r}, but {base_dir} is {base!r} (model.source); retrain, or set "
                         f"model.source to the adapter's base")


def _max_model_len(tokenizer, rows: list[dict], protocol: ProtocolParams, style: PromptStyle) -> int:
    """The longest prompt plus the token budget: vLLM reserves KV cache for this length."""
    longest = max(len(tokenizer(build_prompt(tokenizer, r["question"], style), add_special_tokens=False)["input_ids"])
                  for r in rows)
    return longest + protocol.max_new_tokens
