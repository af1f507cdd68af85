"""A decode step's gate and up projections and SwiGLU as one Triton kernel over the static decoder's dense
copy: silu(x Wg^T) * (x Wu^T), the gate and up outputs never written.

Why: at a decode step's few rows (16-64 sequences) the matmul streams the weights once and is bound by memory.
cuBLAS read the R1-Distill-1.5B gate/up copy (55 MB a layer) in 24 µs plus a SwiGLU kernel; this kernel, one
program a 64-row tile of W (the tensor cores' left operand) over all of x's rows, four pipeline stages, takes
23.5 µs for both at 64 rows and 21.3 at 16 on an H100, against 30.2 and 28.7 for cuBLAS's matmul and an eager
SwiGLU, with the weights streamed from memory over eight layers (bench/dense_mlp_probe.py, RESULTS eleventh
session). The down projection stays cuBLAS's: 15.4 µs against this structure's 16.7 at its best (split K).

The gate and up weights are the decoder's concatenated copy [2I, H] (gate rows first); the products are
bf16 on tensor cores accumulated in fp32 (fp32 inputs: exact IEEE products, the tests' tiny models), then
rounded to the compute dtype before SwiGLU as the dense decoder rounds them (``matmul_4bit.swiglu_rounded``).
tests/kernels/test_swiglu_dense.py compares it with ``F.silu(F.linear(...)) * F.linear(...)``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from grpo.kernels.decode_attention import _interpreting, dependent_launch, triton
from grpo.kernels.fit import first_that_loads, k_blocks_divide
from grpo.kernels.matmul_4bit import block_m_for

if triton is not None:
    import triton.language as tl

    from grpo.kernels.matmul_4bit import dot_acc, swiglu_rounded

    @triton.jit
    def _swiglu_dense_kernel(x_ptr, stride_xm, w_ptr, out_ptr, stride_om, M, N, K, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_IEEE: tl.constexpr,
                             PDL: tl.constexpr = False):
        # out^T = W x^T, so W is the left operand: a program streams its 64 weight rows once for all of x's rows
        if PDL:  # x is the kernel before's output (decode_attention.dependent_launch)
            tl.extra.cuda.gdc_wait()
        pid_n, pid_m = tl.program_id(0), tl.program_id(1)
        m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        gate = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        up = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        for kb in range(0, K // BLOCK_K):
            k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
            x_t = tl.load(x_ptr + m[None, :].to(tl.int64) * stride_xm + k[:, None], mask=m[None, :] < M, other=0.0)
            w = w_ptr + n[:, None].to(tl.int64) * K + k[None, :]
            w_gate = tl.load(w, mask=n[:, None] < N, other=0.0)
            w_up = tl.load(w + N * K, mask=n[:, None] < N, other=0.0)
            gate = dot_acc(w_gate, x_t, gate, DOT_IEEE)
            up = dot_acc(w_up, x_t, up, DOT_IEEE)
        act = swiglu_rounded(gate, up, x_ptr.dtype.element_ty)
        out = out_ptr + m[None, :].to(tl.int64) * stride_om + n[:, None]
        tl.store(out, act.to(out_ptr.dtype.element_ty), mask=(n[:, None] < N) & (m[None, :] < M))

BLOCK_N = 64  # weight rows a program (one warpgroup's wgmma tile)
MAX_BLOCK_M = 64  # rows of x a program; more rows: more programs, each streaming its tile again
# (BLOCK_K, pipeline stages) from the fastest on an H100 down to what a 99 KiB card holds (grpo/kernels/fit.py)
OPTIONS = [(64, 4), (64, 3), (64, 2), (32, 2)]


def block_k_divides(k: int) -> bool:
    """Whether K fits the kernel's K blocks (the loop has no tail: every option's BLOCK_K divides K)."""
    return k_blocks_divide(k, OPTIONS)


def swiglu_dense(x: Tensor, gate_up: Tensor) -> Tensor:
    """``F.silu(x @ Wg^T) * (x @ Wu^T)`` for ``gate_up`` = [Wg; Wu] ([2I, K], row-major): [..., I]."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    n, k = gate_up.shape[0] // 2, gate_up.shape[1]
    if not block_k_divides(k) or not gate_up.is_contiguous():
        raise ValueError(f"swiglu_dense: K {k} must be a multiple of 64 and the weights contiguous")
    block_m = block_m_for(rows.shape[0], MAX_BLOCK_M)
    out = torch.empty(rows.shape[0], n, dtype=x.dtype, device=x.device)
    pdl = dependent_launch(x.device)

    def launch(option: tuple[int, int]) -> Tensor:
        block_k, stages = option
        _swiglu_dense_kernel[(triton.cdiv(n, BLOCK_N), triton.cdiv(rows.shape[0], block_m))](
            rows, rows.stride(0), gate_up, out, out.stride(0), rows.shape[0], n, k, BLOCK_M=block_m, BLOCK_N=BLOCK_N,
            # fp32: exact (not TF32) products; so does everything under the interpreter (numpy has no bf16)
            BLOCK_K=block_k, DOT_IEEE=x.dtype == torch.float32 or _interpreting(), PDL=bool(pdl), num_warps=4,
            num_stages=stages, **pdl)
        return out

    first_that_loads(("swiglu_dense", x.device, x.dtype, block_m), OPTIONS, launch)
    return out.view(*x.shape[:-1], n)
