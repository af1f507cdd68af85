"""How long a GRPO step's detokenisation takes: the 8 GB preset's 64 completions of 768 ids turned into text
one ``tokenizer.decode`` at a time (what transformers' ``batch_decode`` does) against
``grpo.rollout.base.decode_texts`` (one call to the Rust backend where that gives the same strings).

The tokenizer is bench/r1_model.py's (a byte-level BPE trained on the bundled GSM8K text, filled to
R1-Distill-Qwen-1.5B's 151,936 ids); the ids are uniform over the vocabulary (a random-weight model's
samples look so), seeded. Prints one JSON line: the median ms of each way over ``--repeats`` and whether
they gave the same strings.

    python bench/detokenize_speed.py [--rows 64] [--length 768] [--repeats 15]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.r1_model import R1_SHAPE, build_tokenizer, corpus_texts  # noqa: E402
from grpo.rollout.base import decode_texts  # noqa: E402


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--length", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    tokenizer = build_tokenizer(R1_SHAPE["vocab_size"], corpus_texts())
    rng = random.Random(0)
    ids = [[rng.randrange(R1_SHAPE["vocab_size"]) for _ in range(args.length)] for _ in range(args.rows)]
    one_by_one = [tokenizer.decode(row, skip_special_tokens=True) for row in ids]
    print(json.dumps({
        "rows": args.rows, "length": args.length, "cpus": os.cpu_count(),
        "decode_each_ms": round(median_ms(lambda: [tokenizer.decode(r, skip_special_tokens=True) for r in ids],
                                          args.repeats), 2),
        "decode_texts_ms": round(median_ms(lambda: decode_texts(tokenizer, ids), args.repeats), 2),
        "same_strings": decode_texts(tokenizer, ids) == one_by_one,
    }))


if __name__ == "__main__":
    main()
