"""Where a long static-decoder call's memory goes, against the plan (issue 13: evaluate at 8,192 tokens
measured 1.06 GiB above the plan's own components under the 8 GiB cap).

    python bench/decode_memory.py                # one GPU: R1-shape random model (bench/r1_model.py)
    python bench/decode_memory.py --smoke        # a CPU: the tiny model, checks that the script runs

For each mode (CUDA graphs + torch.compile as shipped, compile without graphs, eager) and each length
it runs one generate call of ``--rows`` random prompts of ``--prompt`` tokens, sampled as aime24 is
(temperature 0.6, top-p 0.95), every row decoding its full limit, in a fresh StaticDecoder. It records
the allocated memory before the call (weights and the decoder's copies), the call's peak above that, the
plan's cache + decode step + prefill (grpo.memory_plan.plan_generation) and, with graphs, the memory
held after each captured length bucket (the graphs share one pool). Writes ``$OUT/decode_memory.json``.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.r1_model import build_model_dir  # noqa: E402
from grpo.memory_plan import GIB, Arch, plan_generation  # noqa: E402
from grpo.model.loading import load_policy_model  # noqa: E402
from grpo.rollout.static_decode import StaticDecoder  # noqa: E402

MODES = {"graphs+compile": (True, True), "compile": (False, True), "eager": (False, False)}


def one_call(model, arch: Arch, mode: str, rows: int, prompt: int, new: int) -> dict:
    graphs, compiled = MODES[mode]
    device = model.device
    decoder = StaticDecoder(model, cuda_graphs=graphs and device.type == "cuda", compile=compiled)
    gc.collect()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    held: list[tuple[int, float]] = []
    capture = decoder._graph

    def watched(length: int):  # the pool after each newly captured length
        new_length = decoder.graph_key(length) not in decoder._graphs
        graph = capture(length)
        if new_length and cuda:
            held.append((length, round((torch.cuda.memory_allocated() - before) / GIB, 4)))
        return graph

    decoder._graph = watched
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, arch.vocab_size, (prompt,), generator=gen).tolist() for _ in range(rows)]
    start = time.perf_counter()
    out = decoder.generate(prompts, max_new_tokens=new, stop_ids=[], pad_id=0, temperature=0.6, top_p=0.95)
    seconds = time.perf_counter() - start
    assert all(len(ids) == new for ids in out)
    planned = plan_generation(arch, dtype="bfloat16" if cuda else "float32", quantised=False, sequences=rows,
                              prompt_tokens=prompt, new_tokens=new, static_decoder=True, top_p=0.95)
    result = {"mode": mode, "rows": rows, "prompt": prompt, "new_tokens": new, "s": round(seconds, 1),
              "plan_GiB": {k: round(v / GIB, 4) for k, v in planned.items() if k != "decoder_copy"},
              "plan_call_GiB": round((planned["kv_cache"] + planned["decode_step"] + planned["prefill"]) / GIB, 4)}
    if cuda:
        result.update(weights_and_copies_GiB=round(before / GIB, 4),
                      peak_above_GiB=round((torch.cuda.max_memory_allocated() - before) / GIB, 4),
                      after_call_above_GiB=round((torch.cuda.memory_allocated() - before) / GIB, 4),
                      graphs=len(decoder._graphs), held_after_capture_GiB=held[:: max(1, len(held) // 12)] + held[-1:])
    decoder.release()
    del decoder
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=163)
    parser.add_argument("--runs", default="graphs+compile:1024,graphs+compile:4096,graphs+compile:8192,"
                                          "compile:1024,compile:4096,eager:1024",
                        help="mode:new_tokens, comma-separated")
    args = parser.parse_args(argv)
    model_dir = Path("/tmp/decode_memory_model" + ("_smoke" if args.smoke else ""))
    build_model_dir(model_dir, smoke=args.smoke, device="cpu" if args.smoke else "cuda")
    model = load_policy_model(model_dir, quantization="none", compute_dtype="float32" if args.smoke else "bfloat16",
                              device="cpu" if args.smoke else "cuda", gradient_checkpointing=False)
    arch = Arch.from_config(model.config.to_dict())
    out = Path(os.environ.get("OUT") or ROOT / "bench" / "results")
    out.mkdir(parents=True, exist_ok=True)
    results = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
               "torch": torch.__version__, "model": "random weights at the R1-Distill-Qwen-1.5B config"
               if not args.smoke else "tiny random model", "runs": []}
    for item in args.runs.split(","):
        mode, new = item.split(":")
        new_tokens = 8 if args.smoke else int(new)
        result = one_call(model, arch, mode, args.rows, args.prompt if not args.smoke else 5, new_tokens)
        print(json.dumps(result), flush=True)
        results["runs"].append(result)
        name = "decode_memory_smoke.json" if args.smoke else "decode_memory.json"
        (out / name).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
