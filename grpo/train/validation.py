"""In-training validation on data/prepared/val.jsonl with the current policy.

Greedy by default (``val_samples: 1``); with n > 1 samples at the training temperature, accuracy is
the mean over all samples. The select stage chooses a checkpoint from this log alone, never from the
benchmark suite, so benchmark numbers stay an unbiased test. Under data parallelism the questions are
sharded across ranks and the completions gathered, so every rank returns the single-process figures.
"""
from __future__ import annotations

from grpo import distributed
from grpo.prompts import PromptStyle, build_prompt, full_response
from grpo.rollout.base import GenerationEngine, SamplingParams
from grpo.verify.rewards import compute_rewards


def validate(engine: GenerationEngine, tokenizer, rows: list[dict], style: PromptStyle, *,
             max_new_tokens: int, n: int, temperature: float, seed: int) -> dict[str, float]:
    prompts = [build_prompt(tokenizer, row["question"], style) for row in rows]
    # under data parallelism each rank generates a contiguous share, keyed as the whole request
    lo, hi = distributed.shard_bounds(len(prompts))
    sampling = SamplingParams(n=n, temperature=0.0 if n == 1 else temperature,
                              max_new_tokens=max_new_tokens, seed=seed, first_prompt=lo)
    groups = engine.generate(prompts[lo:hi], sampling) if hi > lo else []
    completions = distributed.gather_concat([c for group in groups for c in group])
    samples = [row for row in rows for _ in range(n)]
    responses = [full_response(style, c.text) for c in completions]
    finish = [c.finish_reason for c in completions]
    lengths = [len(c.token_ids) for c in completions]
    format_fn = "r1_format" if style.style == "r1" else "tagged_format_soft"
    scored = compute_rewards(responses, samples, {"correctness": 1.0, format_fn: 1.0}, finish, lengths,
                             max_new_tokens)
    count = len(completions)
    return {
        "accuracy": sum(scored.per_fn["correctness"]) / count,
        "format_rate": sum(scored.per_fn[format_fn]) / count,
        "verify_timeouts": float(scored.verify_timeouts),
        "response_length_mean": sum(lengths) / count,
        "truncated_frac": finish.count("length") / count,
        "num_questions": float(len(rows)),
    }
