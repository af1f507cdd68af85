"""The base model's greedy accuracy on held-out arith, per difficulty level, with standard errors.

Each level's first ``--questions`` test questions (``prepare.seed`` of ``--params``, the rows the prepare
stage writes for ``prepare.arith_levels: [L]``) are prompted, generated and scored as the evaluate stage
does (``grpo.eval.run.evaluate_rows``: the ``prompt`` params, the ``evaluate.benchmarks.arith``
protocol, lenient extraction, the verifier), with one engine for every level. Prints a markdown table.

    .venv/bin/python bench/arith_probe.py [--params presets/arith-cpu.yaml] [--model models/base]
                                          [--levels 0 1 2 3] [--questions 32]

``models/base`` comes from ``python -m stages.base_model`` (or ``dvc repro base_model``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo.config import SECTIONS, ProtocolParams, load_params  # noqa: E402
from grpo.data.loading import load_dataset_rows  # noqa: E402
from grpo.data.synthetic import ARITH_LEVELS  # noqa: E402
from grpo.eval.run import evaluate_rows  # noqa: E402
from grpo.model.loading import load_tokenizer  # noqa: E402
from grpo.prompts import PromptStyle  # noqa: E402
from grpo.rollout.engines import make_engine, resolve_engine_kind  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=ROOT / "presets/arith-cpu.yaml",
                        help="prompt, prepare.seed and the evaluate protocol (default: the arith-cpu preset)")
    parser.add_argument("--model", type=Path, default=ROOT / "models/base", help="an HF model folder")
    parser.add_argument("--levels", type=int, nargs="+", choices=ARITH_LEVELS, default=list(ARITH_LEVELS))
    parser.add_argument("--questions", type=int, default=32, help="test questions per level")
    args = parser.parse_args()

    params = load_params(args.params, list(SECTIONS))
    ev = params["evaluate"]
    style = PromptStyle.from_params(params["prompt"])
    protocol = ev.benchmarks.get("arith", ProtocolParams())
    seed = params["prepare"].seed
    tokenizer = load_tokenizer(args.model)
    engine = make_engine(resolve_engine_kind(ev.engine, serves_adapters=True), model_dir=args.model, dtype=ev.dtype,
                         batch_size=ev.batch_size, seed=ev.seed)
    try:
        results = {}
        for level in args.levels:
            rows = load_dataset_rows("arith", "eval", seed=seed, levels=[level]).rows[: args.questions]
            _, metrics, _ = evaluate_rows(engine, tokenizer, rows, protocol, style, adapter_dir=None,
                                          seed=ev.seed)
            results[level] = metrics
    finally:
        engine.close()
    print(f"{args.model.name}, prompt from {args.params.name}; n={protocol.n}, temperature {protocol.temperature}, "
          f"{protocol.max_new_tokens} new tokens, seed {seed}\n")
    print("| level | questions | pass@1 ± SE | answer rate | truncated | mean length |")
    print("| --- | --- | --- | --- | --- | --- |")
    for level, m in results.items():
        print(f"| {level} | {m['num_questions']} | {m['pass@1']:.3f} ± {m['pass@1_stderr']:.3f} | "
              f"{m['answer_rate']:.2f} | {m['truncation_rate']:.2f} | {m['mean_length']:.1f} |")


if __name__ == "__main__":
    main()
