"""The keyed sampler's cost a decode step on a CPU: ``keyed_scores`` (temperature, Gumbel noise) and the
argmax over [rows, vocab] float32 logits, as HF ``generate``'s logits processor runs it on the CPU default's
rollouts (grpo.rollout.native), eagerly, once a token.

    .venv/bin/python bench/sampler_cpu.py                                # this tree
    GRPO_TREE=.baseline .venv/bin/python bench/sampler_cpu.py --label old  # another tree, same machine
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ...                 # an AVX2 host imitated

Median of ``--repeats`` timed calls after two untimed ones, for each (rows, vocab): SmolLM2's 49,152 ids and
Qwen's 151,936. Where the tree's ``keyed_scores`` takes precomputed ``offsets`` (the engine makes them once a
call), they are made outside the timing. Prints one JSON line a case and appends it to --out.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.environ.get("GRPO_TREE", str(Path(__file__).resolve().parent.parent)))
from grpo.rollout import sampling  # noqa: E402


def time_case(rows: int, vocab: int, repeats: int) -> float:
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))
    keys = sampling.row_keys(0, torch.arange(rows), torch.zeros(rows, dtype=torch.long))
    positions = torch.full((rows,), 17)
    extra = {}
    if "offsets" in inspect.signature(sampling.keyed_scores).parameters:
        extra["offsets"] = sampling.vocab_offsets(vocab)
    times = []
    for i in range(repeats + 2):
        t0 = time.perf_counter()
        sampling.keyed_scores(logits, keys, positions, temperature=0.7, **extra).argmax(-1)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="new")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sampler_cpu.jsonl")
    args = parser.parse_args()
    for vocab in (49_152, 151_936):
        for rows in (16, 64):
            ms = time_case(rows, vocab, args.repeats) * 1e3
            line = {"label": args.label, "tree": os.environ.get("GRPO_TREE", "this"), "rows": rows, "vocab": vocab,
                    "ms": round(ms, 2), "capability": torch.backends.cpu.get_cpu_capability(),
                    "threads": torch.get_num_threads()}
            print(json.dumps(line), flush=True)
            with args.out.open("a") as f:
                f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
