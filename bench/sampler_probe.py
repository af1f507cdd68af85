"""The decode step's keyed sampler: torch.compile's fused kernel against the Triton kernel
(grpo/kernels/keyed_sample.py), at a decode step's rows and R1-Distill-Qwen's vocabulary (random bf16 logits).

    python3 bench/sampler_probe.py [--label L] [--rows 16,64]

Each way is compiled as the decoder compiles its sampler part (``static_decode.compiled``), captured as a CUDA graph
and replayed over 28 different logits buffers (so that they come from memory, as one step's LM head leaves them);
µs are per call. Both ways' ids are compared first. Writes $OUT/sampler_probe_LABEL.json (default bench/results/).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.matmul_4bit_probe import captured, replay_us  # noqa: E402
from grpo.kernels.keyed_sample import keyed_best_op, keyed_sample  # noqa: E402
from grpo.rollout.sampling import row_keys, sample, vocab_offsets  # noqa: E402
from grpo.rollout.static_decode import compiled  # noqa: E402

OUT = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
VOCAB = 151_936
BUFFERS = 28


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="probe")
    parser.add_argument("--rows", default="16,64")
    args = parser.parse_args()
    offsets = vocab_offsets(VOCAB, "cuda")
    ways = {"inductor": compiled(lambda lg, k, p: sample(lg, k, p, temperature=1.0, offsets=offsets), True),
            "triton": compiled(lambda lg, k, p: keyed_sample(lg, k, p, offsets, 1.0, keyed_best_op), True)}
    results: dict = {"gpu": torch.cuda.get_device_name(), "vocab": VOCAB, "rows": {}}
    g = torch.Generator(device="cuda").manual_seed(0)
    for rows in (int(r) for r in args.rows.split(",")):
        logits = [torch.randn(rows, VOCAB, generator=g, device="cuda").bfloat16() * 4 for _ in range(BUFFERS)]
        keys = row_keys(3, torch.arange(rows) // 4, torch.arange(rows) % 4).cuda()
        positions = torch.full((rows,), 17, device="cuda")
        ids = {name: fn(logits[0], keys, positions) for name, fn in ways.items()}
        row = results["rows"][rows] = {"same ids": bool(torch.equal(ids["inductor"], ids["triton"]))}
        for name, fn in ways.items():
            graph, _ = captured(lambda fn=fn: [fn(lg, keys, positions) for lg in logits][-1])
            row[name] = round(replay_us(graph) / BUFFERS, 2)
            del graph
        print(f"rows {rows}: {row}", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"sampler_probe_{args.label}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
