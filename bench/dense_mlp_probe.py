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
  fallbacks for smaller shared memories) and at ``CANDIDATES``;
- the same maths with its tiles loaded by TMA (``_swiglu_tma_kernel``, ``TMA_OPTIONS``), a candidate.
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
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.matmul_4bit_probe import HIDDEN, INTER, captured, replay_us  # noqa: E402
from grpo.kernels import fit, swiglu_dense  # noqa: E402
from grpo.kernels.matmul_4bit import swiglu_rounded  # noqa: E402

OUT = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
# (BLOCK_K, stages) tried beside the shipped options: deeper pipelines keep more bytes in flight per SM
CANDIDATES = [(64, 5), (64, 6), (64, 8), (128, 3), (32, 4), (32, 6), (32, 8)]
TMA_OPTIONS = [(64, 3), (64, 4), (64, 6), (128, 3), (128, 4)]  # the same maths, its tiles loaded by TMA


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


@triton.jit
def _swiglu_tma_kernel(x_desc, w_desc, out_ptr, stride_om, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    # the shipped kernel's maths with its tiles loaded by TMA (one thread issues a tile, the copy engine fills
    # shared memory): Nsight Compute found the cp.async kernel at 1.07 warps a scheduler and 67% of DRAM's peak
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    gate = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    up = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for kb in range(0, K // BLOCK_K):
        x = x_desc.load([pid_m * BLOCK_M, kb * BLOCK_K])
        gate = tl.dot(w_desc.load([pid_n * BLOCK_N, kb * BLOCK_K]), x.T, gate)
        up = tl.dot(w_desc.load([N + pid_n * BLOCK_N, kb * BLOCK_K]), x.T, up)
    act = swiglu_rounded(gate, up, out_ptr.dtype.element_ty)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + m[None, :] * stride_om + n[:, None], act.to(out_ptr.dtype.element_ty), mask=m[None, :] < M)


def tma_swiglu(option: tuple[int, int]):
    """gate/up + SwiGLU with TMA loads (N a multiple of 64: a gate tile never reaches the up rows)."""
    block_k, stages = option

    def call(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
        rows, (n, k) = x.shape[0], (gate_up.shape[0] // 2, gate_up.shape[1])
        block_m = max(16, triton.next_power_of_2(min(rows, swiglu_dense.MAX_BLOCK_M)))
        out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
        _swiglu_tma_kernel[(n // 64, triton.cdiv(rows, block_m))](
            TensorDescriptor.from_tensor(x, [block_m, block_k]), TensorDescriptor.from_tensor(gate_up, [64, block_k]),
            out, out.stride(0), rows, n, k, BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=block_k, num_warps=4,
            num_stages=stages)
        return out
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
                   for bk, st in dict.fromkeys([*swiglu_dense.OPTIONS, *CANDIDATES])},
                **{f"TMA swiglu K{bk} stages {st}": tma_swiglu((bk, st)) for bk, st in TMA_OPTIONS}}
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
