"""Tokens/s of the static decoder (grpo/rollout/static_decode.py) on a mixed-length workload, with and
without continuous batching.

    python bench/generation_bench.py --model DIR [--rows 256 --slots 64 --max-new 4096 --cap-gib 8]
    python bench/generation_bench.py --smoke    # CPU, the tiny test model: checks that the script runs

The workload is an evaluation's: random-token prompts of mixed lengths whose responses end at very
different lengths, forced by per-row limits because random weights never emit a stop id on their own
(limit = max_new * u**3 for uniform u, at least 16: mostly short, a tail up to max_new). Every row
decodes its full limit, so each mode does exactly the same work and tokens/s compares them directly:

- ``continuous``: ``slots`` rows in flight; a row that ends hands its slot to the next waiting one;
- ``static``: waves of ``slots`` rows, each held until its longest row ends (the decoder before
  continuous batching, at the same memory);
- ``all_at_once`` (``--all-at-once``): one wave of every row (the old engine with batch_size = rows;
  its cache is rows x (longest prompt + max_new), so leave it off where memory is short).

One untimed continuous call warms up (torch.compile of every length bucket, cuBLAS), then each mode
runs ``--repeats`` timed calls (the fastest is reported). A call includes capturing its CUDA graphs
(one per cache-length bucket, captured on first use), reported apart as ``capture_s``. ``identical_rows`` counts rows whose tokens equal the continuous mode's (greedy by
default; bf16 near-ties on random weights may flip a few, which is rounding, not a bug).

The model folder is loaded as the engine loads it (grpo.model.loading: ``--quantization``, ``--dtype``)
and decoded with the same defaults as the engine (CUDA graphs and compile on CUDA, eager on CPU).
Writes ``$OUT/generation_bench.json`` (default bench/results/; ``--smoke``: generation_bench_smoke.json).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo.model.loading import load_policy_model  # noqa: E402
from grpo.rollout.static_decode import StaticDecoder  # noqa: E402

GIB = 2**30


def workload(rows: int, prompt_min: int, prompt_max: int, max_new: int, vocab: int,
             seed: int) -> tuple[list[list[int]], list[int]]:
    """Random prompts of lengths in [prompt_min, prompt_max] and skewed per-row limits (see above)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(prompt_min, prompt_max + 1, (rows,), generator=gen).tolist()
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]
    limits = (max_new * torch.rand(rows, generator=gen) ** 3).long().clamp(min=min(16, max_new)).tolist()
    return prompts, limits


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_call(decoder: StaticDecoder, prompts: list[list[int]], limits: list[int], *, slots: int,
               refill: bool, temperature: float) -> tuple[list[list[int]], float, float]:
    """(outputs, seconds, of which graph capture) of one generate call."""
    capture: list[float] = []
    graph = decoder._graph

    def timed_graph(length: int):  # capture happens on a graph's first use: time it apart
        if decoder.graph_key(length) in decoder._graphs:
            return graph(length)
        sync(decoder.device)
        start = time.perf_counter()
        result = graph(length)
        sync(decoder.device)
        capture.append(time.perf_counter() - start)
        return result

    decoder._graph = timed_graph
    try:
        sync(decoder.device)
        start = time.perf_counter()
        out = decoder.generate(prompts, max_new_tokens=limits, stop_ids=[], pad_id=0, temperature=temperature,
                               slots=slots, refill=refill)
        sync(decoder.device)
        seconds = time.perf_counter() - start
    finally:
        del decoder._graph
    assert [len(ids) for ids in out] == limits, "every row must decode exactly its limit"
    return out, seconds, sum(capture)


def run_mode(decoder: StaticDecoder, prompts, limits, *, slots: int, refill: bool, temperature: float,
             repeats: int) -> tuple[dict, list[list[int]]]:
    if decoder.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(decoder.device)
    runs = [timed_call(decoder, prompts, limits, slots=slots, refill=refill, temperature=temperature)
            for _ in range(repeats)]
    out, seconds, capture = min(runs, key=lambda r: r[1])
    tokens = sum(limits)
    result = {"slots": slots, "refill": refill, "tokens": tokens, "s": round(seconds, 3),
              "capture_s": round(capture, 3), "tok_per_s": round(tokens / seconds, 1),
              "tok_per_s_excl_capture": round(tokens / max(seconds - capture, 1e-9), 1),
              "all_s": [round(r[1], 3) for r in runs]}
    if decoder.device.type == "cuda":
        result["peak_GiB"] = round(torch.cuda.max_memory_allocated(decoder.device) / GIB, 2)
    return result, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="an HF model folder (required unless --smoke)")
    parser.add_argument("--smoke", action="store_true", help="CPU, the tiny test model, a tiny workload")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--prompt-min", type=int, default=64)
    parser.add_argument("--prompt-max", type=int, default=256)
    parser.add_argument("--max-new", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    parser.add_argument("--quantization", choices=["none", "nf4"], default="none")
    parser.add_argument("--dtype", default="auto", help="compute dtype (auto: bf16 on CUDA, fp32 on CPU)")
    parser.add_argument("--sync-every", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--all-at-once", action="store_true", help="also one wave of every row")
    parser.add_argument("--cap-gib", type=float, help="cap this process's CUDA memory (an 8 GB card: 8)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.smoke:
        from tests.tiny_model import make_tiny_model_dir

        args.model = make_tiny_model_dir(Path(tempfile.mkdtemp(prefix="generation_bench_")))
        args.rows, args.slots, args.prompt_min, args.prompt_max, args.max_new = 12, 4, 4, 24, 40
        args.repeats, args.sync_every, args.dtype, args.all_at_once = 1, 8, "float32", True
    if args.model is None:
        parser.error("--model is required (or --smoke)")
    device = torch.device("cpu") if args.smoke or not torch.cuda.is_available() else torch.device("cuda", 0)
    if args.cap_gib and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(args.cap_gib * GIB / total, device)
    model = load_policy_model(args.model, quantization=args.quantization, compute_dtype=args.dtype,
                              device=device.type, gradient_checkpointing=False).eval()
    decoder = StaticDecoder(model, sync_every=args.sync_every)
    prompts, limits = workload(args.rows, args.prompt_min, args.prompt_max, args.max_new,
                               model.config.vocab_size, args.seed)
    res = {"model": str(args.model), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()},
           "workload": {"rows": len(prompts), "tokens": sum(limits), "limit_mean": round(sum(limits) / len(limits), 1),
                        "limit_max": max(limits), "prompt_mean": round(sum(map(len, prompts)) / len(prompts), 1)}}
    modes = {"continuous": (args.slots, True), "static": (args.slots, False)}
    if args.all_at_once:
        modes["all_at_once"] = (len(prompts), False)
    timed_call(decoder, prompts, limits, slots=args.slots, refill=True, temperature=args.temperature)  # warm-up
    reference = None
    for name, (slots, refill) in modes.items():
        res[name], out = run_mode(decoder, prompts, limits, slots=slots, refill=refill,
                                  temperature=args.temperature, repeats=args.repeats)
        reference = reference or out
        res[name]["identical_rows"] = sum(a == b for a, b in zip(out, reference))
        print(f"{name}: {res[name]}", flush=True)
    res["speedup_continuous_over_static"] = round(res["continuous"]["tok_per_s"] / res["static"]["tok_per_s"], 2)
    out_dir = Path(os.environ.get("OUT") or ROOT / "bench" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ("generation_bench_smoke.json" if args.smoke else "generation_bench.json")
    path.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    print(f"speedup (continuous / static): {res['speedup_continuous_over_static']}x; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
