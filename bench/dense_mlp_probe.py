"""The decoder's fused dense gate/up + SwiGLU kernel (grpo/kernels/swiglu_dense.py) against cuBLAS at a
decode step's few rows (issue 18: cuBLAS ran the gate/up matmul at 2.3 TB/s and down at 1.9 on an H100).

    python3 bench/dense_mlp_probe.py [--label L] [--rows 16,64] [--layers 8]

One decode step's MLP at the R1-Distill-Qwen-1.5B shape (random bf16 weights, gate and up concatenated as the
static decoder keeps them) over ``--layers`` distinct layers' weights, so that they stream from memory as in a
real step (one layer's 82 MB would partly stay in an H100's 50 MB L2 between replays), each way captured as a
CUDA graph and replayed; µs are per layer:
- cuBLAS: ``F.linear`` for gate/up, then SwiGLU (eager here: two small kernels where the decoder's compiled part
  fuses one), and ``F.linear`` for down, which the decoder keeps;
- the Triton kernel at each of its launch options (``swiglu_dense.OPTIONS``: K block and pipeline stages, the
  fallbacks for smaller shared memories) and at ``CANDIDATES``.
A TMA-loaded variant tied with it (call 10; the kernel is in git at 5c4fe60).
The eleventh session's first version (call 4) carried its own kernel and swept tile widths, warps and K splits
for gate/up and for a Triton down projection (16.7 µs at best against cuBLAS's 15.4; RESULTS,
bench/results/gpu_4bit_h100/eleventh/call4_dense_mlp_probe.json); this one times what shipped.
Writes $OUT/dense_mlp_probe_LABEL.json (default bench/results/).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.matmul_4bit_probe import HIDDEN, INTER, captured, replay_us  # noqa: E402
from grpo.kernels import fit, swiglu_dense  # noqa: E402

OUT = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
# (BLOCK_K, stages) tried beside the shipped options: deeper pipelines keep more bytes in flight per SM
CANDIDATES = [(64, 5), (64, 6), (64, 8), (128, 3), (32, 4), (32, 6), (32, 8)]


def cublas_swiglu(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.silu(gate) * up


def triton_swiglu(option: tuple[int, int]):
    """The shipped kernel with its launch fixed to ``option`` (fit.py remembers the option a key loaded)."""
    def call(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
        fit._CHOSEN.clear()
        original, swiglu_dense.OPTIONS = swiglu_dense.OPTIONS, [option]
        try:
            return swiglu_dense.swiglu_dense(x, gate_up)
        finally:
            swiglu_dense.OPTIONS = original
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="dense")
    parser.add_argument("--rows", default="16,64")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--max-block-m", type=int, default=swiglu_dense.MAX_BLOCK_M,
                        help="x's rows a program at most (fewer: more programs, each streaming its tile again)")
    args = parser.parse_args()
    swiglu_dense.MAX_BLOCK_M = args.max_block_m
    torch.manual_seed(0)
    dt = torch.bfloat16
    layers = [(torch.randn(2 * INTER, HIDDEN, device="cuda", dtype=dt) * 0.02,
               torch.randn(HIDDEN, INTER, device="cuda", dtype=dt) * 0.02) for _ in range(args.layers)]
    found: dict = {"device": torch.cuda.get_device_name(), "layers": args.layers, "max_block_m": args.max_block_m,
                   "runs": []}
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, HIDDEN, device="cuda", dtype=dt)
        ways = {"cublas swiglu": cublas_swiglu, "cublas down": None,
                **{f"triton swiglu K{bk} stages {st}": triton_swiglu((bk, st))
                   for bk, st in dict.fromkeys([*swiglu_dense.OPTIONS, *CANDIDATES])}}
        expected = cublas_swiglu(x, layers[0][0]).float()
        for name, fn in ways.items():
            res: dict = {"rows": rows, "way": name}
            if fn is None:  # down, as the decoder runs it after either gate/up
                act = torch.randn(rows, INTER, device="cuda", dtype=dt)
                graph, _ = captured(lambda: [F.linear(act, down) for _, down in layers][-1])
            else:
                try:
                    res["max_err"] = (fn(x, layers[0][0]).float() - expected).abs().max().item()
                except Exception as exc:  # noqa: BLE001 - an option that does not fit this card is a finding
                    res["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    print(res, flush=True)
                    found["runs"].append(res)
                    continue
                graph, _ = captured(lambda: [fn(x, gate_up) for gate_up, _ in layers][-1])
            res["us"] = round(replay_us(graph) / args.layers, 1)
            print(res, flush=True)
            found["runs"].append(res)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"dense_mlp_probe_{args.label}.json").write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
