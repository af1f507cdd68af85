"""The decode-attention kernel's launches at a decode step's shape, one layer's kernel over 28 layers' caches
(issue 18: in the 8 GiB step's decode it took 555 µs a step at 64 sequences, twice its caches' read time).

    python3 bench/decode_attention_probe.py [--slots 16,64] [--cache 1024] [--cursor 640] [--shipped]
    python3 bench/decode_attention_probe.py --shipped --cursor 0,128,384,640,1000   # fixed cost + per position

R1-Distill-Qwen-1.5B's heads (12 query, 2 key/value, 128 dims), random bf16 caches of ``--cache`` positions,
every slot's cursor at ``--cursor`` (640: a step's prompt width plus half its 768 new tokens; with several
cursors, a line through each launch's µs gives its fixed cost a layer and its cost a position); 28 distinct caches,
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


def fixed_and_per_position(rows: list[dict]) -> dict:
    """A least-squares line through one (slots, option, programs)'s µs against its cursors: the kernel's
    fixed cost a layer (the intercept) and its cost a cached position (the slope)."""
    xs, ys = [r["cursor"] + 1 for r in rows], [r["us_per_layer"] for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return {"fixed_us": round(my - slope * mx, 2), "ns_per_position": round(slope * 1e3, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="16,64")
    parser.add_argument("--cache", type=int, default=1024)
    parser.add_argument("--cursor", default="640", help="cursors, comma-separated: several fit a line")
    parser.add_argument("--shipped", action="store_true", help="only the first launch option, at one "
                        "program a multiprocessor (the shipped choice on a GPU it loads on)")
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cursors = [int(c) for c in args.cursor.split(",")]
    tries = [(da.launch_options()[0], sms)] if args.shipped else list(itertools.product(OPTIONS, (sms, 4 * sms)))
    rows, lines = [], []
    for slots in (int(s) for s in args.slots.split(",")):
        for cursor in cursors:
            layers = layer_inputs(slots, args.cache, cursor)
            cache_bytes = slots * KV_HEADS * (cursor + 1) * HEAD_DIM * 2 * 2
            for option, programs in tries:
                try:
                    us = time_option(layers, option, programs)
                except Exception as exc:  # an option that does not load here (shared memory) is reported
                    rows.append({"slots": slots, "cursor": cursor, "option": option, "programs": programs,
                                 "error": repr(exc)[:200]})
                    continue
                shares = da.cache_splits(slots, KV_HEADS, args.cache, option[0], programs)[1]
                rows.append({"slots": slots, "cursor": cursor, "option": option, "programs": programs,
                             "shares": shares, "us_per_layer": round(us, 2),
                             "GB_per_s": round(cache_bytes / us / 1e3)})
                print(rows[-1], flush=True)
            del layers
        if len(cursors) > 1:
            for option, programs in tries:
                same = [r for r in rows if r["slots"] == slots and r.get("option") == option
                        and r.get("programs") == programs and "us_per_layer" in r]
                if len(same) > 1:
                    lines.append({"slots": slots, "option": option, "programs": programs,
                                  **fixed_and_per_position(same)})
                    print(lines[-1], flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "decode_attention_probe.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(), "cache": args.cache, "rows": rows, "lines": lines}, indent=1))


if __name__ == "__main__":
    main()
