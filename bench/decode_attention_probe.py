"""The decode-attention kernel's launches at a decode step's shape, one layer's kernel over 28 layers' caches
(issue 18: in the 8 GiB step's decode it took 555 µs a step at 64 sequences, twice its caches' read time).

    python3 bench/decode_attention_probe.py [--slots 16,64] [--cache 1024] [--cursor 640]

R1-Distill-Qwen-1.5B's heads (12 query, 2 key/value, 128 dims), random bf16 caches of ``--cache`` positions,
every slot's cursor at ``--cursor`` (a step's prompt width plus half its 768 new tokens); 28 distinct caches,
so they stream from memory as in a real step (a 64-slot layer's is 67 MB). Each launch (BLOCK, stages, warps)
at each count of programs a full cache may spread over (``cache_splits``: one a multiprocessor, the
shipped choice, and four) is captured as a CUDA graph of 28 calls and replayed; µs are a layer's call, and
GB/s the cache bytes up to the cursor over that time. Writes $OUT/decode_attention_probe.json.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.matmul_4bit_probe import captured, replay_us  # noqa: E402
from grpo.kernels import decode_attention as da  # noqa: E402
from grpo.kernels import fit  # noqa: E402

OUT = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
HEADS, KV_HEADS, HEAD_DIM, LAYERS = 12, 2, 128, 28
OPTIONS = list(itertools.product((64, 128), (2, 3), (4, 8)))  # (BLOCK, stages, warps)


def layer_inputs(slots: int, cache: int, cursor: int) -> list[tuple]:
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.bfloat16)

    angle = torch.rand(slots, 1, HEAD_DIM // 2, generator=gen, device="cuda")
    cos, sin = (torch.cat([f(angle)] * 2, -1).bfloat16() for f in (torch.cos, torch.sin))
    valid = torch.zeros(slots, cache, dtype=torch.bool, device="cuda")
    valid[:, : cursor + 1] = True
    position = torch.full((slots,), cursor, dtype=torch.long, device="cuda")
    return [(randn(slots, 1, (HEADS + 2 * KV_HEADS) * HEAD_DIM), cos, sin, randn(slots, KV_HEADS, cache, HEAD_DIM),
             randn(slots, KV_HEADS, cache, HEAD_DIM), valid, position) for _ in range(LAYERS)]


def time_option(layers: list[tuple], option: tuple[int, int, int], programs: int) -> float:
    fit._CHOSEN.clear()
    da.launch_options = lambda: [option]

    def step() -> list[torch.Tensor]:
        return [da.decode_attention(*inputs, n_heads=HEADS, q_norm=None, k_norm=None, eps=1e-6, programs=programs)
                for inputs in layers]

    graph, _ = captured(step)
    return replay_us(graph, reps=50) / LAYERS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="16,64")
    parser.add_argument("--cache", type=int, default=1024)
    parser.add_argument("--cursor", type=int, default=640)
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for slots in (int(s) for s in args.slots.split(",")):
        layers = layer_inputs(slots, args.cache, args.cursor)
        cache_bytes = slots * KV_HEADS * (args.cursor + 1) * HEAD_DIM * 2 * 2
        for option, programs in itertools.product(OPTIONS, (sms, 4 * sms)):
            try:
                us = time_option(layers, option, programs)
            except Exception as exc:  # an option that does not load here (shared memory) is reported, not fatal
                rows.append({"slots": slots, "option": option, "programs": programs, "error": repr(exc)[:200]})
                continue
            shares = da.cache_splits(slots, KV_HEADS, args.cache, option[0], programs)[1]
            rows.append({"slots": slots, "option": option, "programs": programs, "shares": shares,
                         "us_per_layer": round(us, 2), "GB_per_s": round(cache_bytes / us / 1e3)})
            print(rows[-1], flush=True)
        del layers
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "decode_attention_probe.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(), "cache": args.cache, "cursor": args.cursor, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
