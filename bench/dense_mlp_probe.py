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
- ``tiled``: the same maths over a tile-major copy (``tile_major``: each program's gate and up tiles of one K
  step one contiguous run of bytes, instead of BLOCK_N rows' 128-byte pieces 3 KB apart), at ``TILED``'s
  launches (weight rows a program, K block, stages, warps): does the DRAM read faster in long runs?
- ``tiled down``: the down projection over its tile-major copy, K split over programs (``TILED_DOWN``), each
  split's fp32 partial sums written for a sum after; timed alone ("partials", what a caller would pay if the
  next layer's compiled norm added the splits) and with an eager sum and cast (comparable to cuBLAS's
  matmul plus its split-K reduction).
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.matmul_4bit_probe import HIDDEN, INTER, captured, replay_us  # noqa: E402
from grpo.kernels import fit, swiglu_dense  # noqa: E402
from grpo.kernels.matmul_4bit import block_m_for, swiglu_rounded  # noqa: E402

OUT = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
# (BLOCK_K, stages) tried beside the shipped options: deeper pipelines keep more bytes in flight per SM
CANDIDATES = [(64, 5), (64, 6), (64, 8), (128, 3), (32, 4), (32, 6), (32, 8)]
# (BLOCK_N, BLOCK_K, stages, warps) over the tile-major copy; 32 weight rows: 280 programs, two an SM
TILED = [(64, 64, 4, 4), (64, 64, 3, 4), (64, 128, 3, 4), (64, 64, 4, 8), (32, 64, 4, 4), (32, 64, 6, 4),
         (32, 128, 4, 4), (32, 64, 4, 2)]

# (BLOCK_N, BLOCK_K, K splits, stages, warps) for down (N 1536: 24 tiles of 64 rows, so K is split)
TILED_DOWN = [(64, 64, 7, 4, 4), (64, 64, 10, 4, 4), (64, 64, 14, 3, 4), (32, 64, 7, 4, 4), (64, 128, 7, 3, 4),
              (64, 64, 5, 4, 4)]


@triton.jit
def _down_tiled_kernel(x_ptr, stride_xm, w_ptr, part_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, K_BLOCKS: tl.constexpr):
    # partial[split, m, n] = sum over this split's K blocks of W[n, k] x[m, k]; W's tiles one run per program
    pid_n, split = tl.program_id(0), tl.program_id(1)
    m = tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tile = BLOCK_N * BLOCK_K
    within = tl.arange(0, BLOCK_N)[:, None] * BLOCK_K + tl.arange(0, BLOCK_K)[None, :]
    w = w_ptr + (pid_n.to(tl.int64) * (K // BLOCK_K) + split * K_BLOCKS) * tile + within
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for kb in range(0, K_BLOCKS):
        k = (split * K_BLOCKS + kb) * BLOCK_K + tl.arange(0, BLOCK_K)
        x_t = tl.load(x_ptr + m[None, :].to(tl.int64) * stride_xm + k[:, None], mask=m[None, :] < M, other=0.0)
        acc = tl.dot(tl.load(w + kb * tile), x_t, acc)
    tl.store(part_ptr + (split * M + m[None, :]).to(tl.int64) * N + n[:, None], acc, mask=m[None, :] < M)


@triton.jit
def _swiglu_tiled_kernel(x_ptr, stride_xm, w_ptr, out_ptr, stride_om, M, N, K, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tile = BLOCK_N * BLOCK_K
    within = tl.arange(0, BLOCK_N)[:, None] * BLOCK_K + tl.arange(0, BLOCK_K)[None, :]
    w = w_ptr + pid_n.to(tl.int64) * (K // BLOCK_K) * 2 * tile + within
    gate = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    up = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for kb in range(0, K // BLOCK_K):
        k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        x_t = tl.load(x_ptr + m[None, :].to(tl.int64) * stride_xm + k[:, None], mask=m[None, :] < M, other=0.0)
        gate = tl.dot(tl.load(w + kb * 2 * tile), x_t, gate)
        up = tl.dot(tl.load(w + kb * 2 * tile + tile), x_t, up)
    act = swiglu_rounded(gate, up, x_ptr.dtype.element_ty)
    tl.store(out_ptr + m[None, :].to(tl.int64) * stride_om + n[:, None], act.to(out_ptr.dtype.element_ty),
             mask=m[None, :] < M)


def tiles(weight: torch.Tensor, block_n: int, block_k: int) -> torch.Tensor:
    """[N, K] as [N / block_n, K / block_k, block_n, block_k]: a program's tiles one after another."""
    n, k = weight.shape
    return weight.view(n // block_n, block_n, k // block_k, block_k).permute(0, 2, 1, 3).contiguous()


def tile_major(gate_up: torch.Tensor, block_n: int, block_k: int) -> torch.Tensor:
    """[2N, K] (gate rows, then up) as [N / block_n, K / block_k, 2, block_n, block_k]: a program's gate and up
    tiles of one K step side by side, its K steps one after another."""
    return torch.stack([tiles(half, block_n, block_k) for half in gate_up.chunk(2)], dim=2)


def tiled_swiglu(option: tuple[int, int, int, int]):
    block_n, block_k, stages, warps = option

    def call(x: torch.Tensor, tiled: torch.Tensor) -> torch.Tensor:
        n, k = tiled.shape[0] * block_n, tiled.shape[1] * block_k
        block_m = block_m_for(x.shape[0], swiglu_dense.MAX_BLOCK_M)
        out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
        _swiglu_tiled_kernel[(n // block_n, triton.cdiv(x.shape[0], block_m))](
            x, x.stride(0), tiled, out, out.stride(0), x.shape[0], n, k, BLOCK_M=block_m, BLOCK_N=block_n,
            BLOCK_K=block_k, num_warps=warps, num_stages=stages)
        return out
    return call


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


def chosen(name: str, wanted: list[str]) -> bool:
    """Whether ``--ways`` asks for the way ``name`` (any of its pieces in the name; none given: every way)."""
    return not wanted or any(piece in name for piece in wanted)


def tiled_down_runs(rows: int, layers: list[tuple[torch.Tensor, torch.Tensor]], wanted: list[str]) -> list[dict]:
    """Each ``TILED_DOWN`` launch ``--ways`` asks for against ``F.linear`` (µs a layer, streamed over the
    layers' copies). A program's rows of x are all of them (no tile index on M): ``rows`` at most 64."""
    act = torch.randn(rows, INTER, device="cuda", dtype=torch.bfloat16)
    expected = F.linear(act, layers[0][1]).float()
    runs = []
    for block_n, block_k, splits, stages, warps in TILED_DOWN:
        name = f"tiled down N{block_n} K{block_k} splits {splits} stages {stages} warps {warps}"
        if not chosen(name, wanted):
            continue
        weights = [tiles(down, block_n, block_k) for _, down in layers]
        block_m = max(16, triton.next_power_of_2(rows))
        part = torch.empty(splits, rows, HIDDEN, device="cuda", dtype=torch.float32)

        def partials(w: torch.Tensor) -> torch.Tensor:
            _down_tiled_kernel[(HIDDEN // block_n, splits)](
                act, act.stride(0), w, part, rows, HIDDEN, INTER, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                K_BLOCKS=INTER // block_k // splits, num_warps=warps, num_stages=stages)
            return part

        res: dict = {"rows": rows, "way": name}
        try:
            res["max_err"] = (partials(weights[0]).sum(0) - expected).abs().max().item()
        except Exception as exc:  # noqa: BLE001 - a launch that does not fit this card is a finding
            runs.append({**res, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
            continue
        for label, fn in (("partials", partials), ("summed", lambda w: partials(w).sum(0).to(act.dtype))):
            graph, _ = captured(lambda: [fn(w) for w in weights][-1])
            res[f"us_{label}"] = round(replay_us(graph) / len(layers), 1)
            del graph
        runs.append(res)
        print(res, flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="dense")
    parser.add_argument("--rows", default="16,64")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--max-block-m", type=int, default=swiglu_dense.MAX_BLOCK_M,
                        help="x's rows a program at most (fewer: more programs, each streaming its tile again)")
    parser.add_argument("--ways", default="", help="comma-separated pieces of the ways' names to time (default all)")
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
        for bn, bk, st, wp in TILED:
            ways[f"tiled N{bn} K{bk} stages {st} warps {wp}"] = ((bn, bk, st, wp), tiled_swiglu((bn, bk, st, wp)))
        wanted = [piece for piece in args.ways.split(",") if piece]
        for name, fn in ways.items():
            if not chosen(name, wanted):
                continue
            res: dict = {"rows": rows, "way": name}
            weights = [gate_up for gate_up, _ in layers]
            if isinstance(fn, tuple):  # the tile-major copy of every layer, made for this launch's tiles
                (block_n, block_k, *_), fn = fn
                weights = [tile_major(gate_up, block_n, block_k) for gate_up in weights]
            if fn is None:  # down, as the decoder runs it after either gate/up
                act = torch.randn(rows, INTER, device="cuda", dtype=dt)
                graph, _ = captured(lambda: [F.linear(act, down) for _, down in layers][-1])
            else:
                try:
                    res["max_err"] = (fn(x, weights[0]).float() - expected).abs().max().item()
                except Exception as exc:  # noqa: BLE001 - an option that does not fit this card is a finding
                    res["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    print(res, flush=True)
                    found["runs"].append(res)
                    continue
                graph, _ = captured(lambda: [fn(x, w) for w in weights][-1])
            res["us"] = round(replay_us(graph) / args.layers, 1)
            del graph, weights
            print(res, flush=True)
            found["runs"].append(res)
        found["runs"] += tiled_down_runs(rows, layers, wanted)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"dense_mlp_probe_{args.label}.json").write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
