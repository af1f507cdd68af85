"""Static-decoder speed at the R1-Distill-Qwen-1.5B shape (random weights from bench/r1_model.py: speed
does not depend on the values), nf4 base + LoRA r16 on q/k/v/o merged, 128-token prompts, forced new
tokens (no stop ids), sampling at temperature 1 (issue 18).

    python3 bench/decode_speed.py [--label new] [--batches 16,64] [--profile] [--compile-mode max-autotune-no-cudagraphs]
    GRPO_TREE=/path/to/old/tree python3 bench/decode_speed.py --label old   # the baseline, same call

For batch 16 and 64 (``--batches``) it times whole generate calls (compile warm-up excluded by a first,
untimed call of each shape; each call captures its graph again) of 256 and 768 new tokens: whole-call
tokens/s, the capture time, and one decode step's time from the difference of the two without their
captures (512 steps). ``--profile`` adds a kernel
table of one 64-row, 128-token call from torch.profiler (CUPTI records the kernels a graph replay runs):
kernels per decode step, their summed time per step and the top kernels. Writes
$OUT/decode_speed_<label>.json (default bench/results/). ``--compile-mode`` recompiles the decoder's layer
parts in another torch.compile mode (an experiment: max-autotune lets inductor time Triton matmul templates
against cuBLAS for the skinny decode matmuls). ``--read-4bit-mlp`` decodes with the MLP read in 4 bits
(grpo/kernels/matmul_4bit.py) instead of a dense copy.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, os.environ.get("GRPO_TREE", str(Path(__file__).resolve().parent.parent)))
from bench.gpu_bench import V, add_lora, fast_rollout, load_base  # noqa: E402

OUT = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
PROFILE_TOKENS = 128


def kernel_table(decoder, batch: int = 64, new: int = PROFILE_TOKENS) -> dict:
    """Device kernels of one generate call (prefill and capture included, shown per decode step)."""
    from torch.profiler import ProfilerActivity, profile

    prompts = torch.randint(100, 150000, (batch, 128)).tolist()
    decoder.generate(prompts, max_new_tokens=new, stop_ids=[], pad_id=V - 2, temperature=1.0)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decoder.generate(prompts, max_new_tokens=new, stop_ids=[], pad_id=V - 2, temperature=1.0)
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if device_us and event.count:
            rows.append((event.key, event.count, device_us))
    rows.sort(key=lambda r: -r[2])
    kernels = [r for r in rows if not r[0].startswith(("Memcpy", "Memset"))]
    return {"calls_per_step": round(sum(r[1] for r in kernels) / new, 1),
            "kernel_ms_per_step": round(sum(r[2] for r in kernels) / new / 1000, 3),
            "top": [{"kernel": k[:90], "per_step": round(c / new, 2), "us_per_step": round(us / new, 1)}
                    for k, c, us in kernels[:60]]}


def time_batches(decoder, label: str, batches: tuple[int, ...] = (16, 64)) -> dict:
    """Whole calls of 256 and 768 new tokens at each batch (each shape once untimed first), and the
    decode step from their difference, each call's graph capture left out (a capture once took 0.094 s
    where others took 0.046, which moved the step of that difference by 0.1 ms)."""
    res = {}
    for batch in batches:
        runs = {}
        for new in (256, 768):
            fast_rollout(decoder, batch, new)  # compiles and tunes for this shape: not timed
            runs[new] = fast_rollout(decoder, batch, new)
            print(f"{label} B{batch} N{new}: {runs[new]}", flush=True)
        step_ms = ((runs[768]["s"] - runs[768]["capture_s"]) - (runs[256]["s"] - runs[256]["capture_s"])) / 512 * 1000
        res[f"B{batch}"] = {"N256": runs[256], "N768": runs[768], "decode_step_ms": round(step_ms, 3),
                            "decode_tok_per_s": round(batch / step_ms * 1000)}
        print(f"{label} B{batch}: decode step {step_ms:.3f} ms", flush=True)
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="new")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--batches", default="16,64", help="comma-separated batch sizes to time")
    parser.add_argument("--compile-mode", default=None)
    parser.add_argument("--read-4bit-mlp", action="store_true",
                        help="the MLP read in 4 bits (train.generation_mlp_4bit)")
    parser.add_argument("--launches", type=Path, default=None,
                        help="with --read-4bit-mlp, the 4-bit kernels' cut by part and rows: a probe file's 'best' "
                        "(bench/matmul_4bit_probe.py)")
    args = parser.parse_args()
    from grpo.rollout.static_decode import StaticDecoder

    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "label": args.label,
                 "tree": os.environ.get("GRPO_TREE", "this")}
    if args.launches:
        from bench.matmul_4bit_probe import install_best

        res["launches"] = install_best(args.launches)
    policy = add_lora(load_base("nf4"))
    decoder = StaticDecoder(policy, merge_lora=True, **({"read_4bit_mlp": True} if args.read_4bit_mlp else {}))
    res["fused_attention"] = getattr(decoder, "fused", False)
    res["read_4bit_mlp"] = getattr(decoder, "read_4bit_mlp", False)
    if args.compile_mode:
        from grpo.rollout.static_layers import output_and_mlp, qkv_projection

        res["compile_mode"] = args.compile_mode
        decoder._part1 = torch.compile(qkv_projection, dynamic=False, mode=args.compile_mode)
        decoder._part2 = torch.compile(output_and_mlp, dynamic=False, mode=args.compile_mode)
    OUT.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after each part: a call cut by its time limit keeps what it measured
        (OUT / f"decode_speed_{args.label}.json").write_text(json.dumps(res, indent=1))

    res.update(time_batches(decoder, args.label, tuple(int(b) for b in args.batches.split(","))))
    save()
    if args.profile:
        res["kernels_B64"] = kernel_table(decoder)
        print(json.dumps(res["kernels_B64"], indent=1), flush=True)
        save()


if __name__ == "__main__":
    main()
