"""Fused LoRA branch (Triton), forward and backward, for a frozen base layer's output.

The PyTorch path in grpo.model.lora computes, in fp32 for the trainable A and B,

    out = y + (x.float() @ A^T @ B^T * scaling).to(y.dtype)        y = base(x), x and y bf16

which costs an fp32 copy of x, an fp32 [N, out] product, a scaled copy of it, a bf16 cast and the add:
five passes over activation-sized tensors and six kernel launches per layer, twice that in backward.
Here each product is one Triton kernel that loads bf16 activations and converts them in registers, with
fp32 products (``input_precision="ieee"``, as torch's fp32 matmul) and the scale and the add folded in:

    forward   xa = x @ A^T                 (shrink, [N, r] fp32, saved for backward)
              out = y + scaling * xa @ B^T (expand, one read of y, one write of out)
    backward  dxa = scaling * g @ B        (shrink of the output gradient g)
              dB  = scaling * g^T @ xa     (row reduction, split over row blocks, summed in torch:
              dA  = dxa^T @ x               deterministic, no atomics)
              dx  = dxa @ A                (expand without y; autograd adds the base's dx)

The gradient of y is g itself. Dropout, a disabled adapter or tensors off the GPU use the PyTorch path
(``fused_lora_supported``); tests/kernels/test_lora_kernel.py checks both against each other.
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without triton: the PyTorch path is used
    triton = None

BLOCK_N = 32  # rows (tokens) per program: 112 programs for 3,584 tokens
BLOCK_D = 64  # columns of the wide (in/out features) dimension per program or loop step
SPLIT_ROWS = 512  # rows each program of the row reductions (dA, dB) sums before torch adds the parts
DOT_PRECISION = "ieee"  # fp32 products like torch's default fp32 matmul; "tf32" uses tensor cores


def fused_lora_supported(x: Tensor) -> bool:
    """Whether the Triton path can run on activations ``x`` (else use the PyTorch branch)."""
    on_device = x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"  # the interpreter runs on CPU
    return triton is not None and on_device and x.dtype in (torch.bfloat16, torch.float16, torch.float32)


if triton is not None:

    @triton.jit
    def _shrink_kernel(x_ptr, w_ptr, out_ptr, N, D, R, sx_n, sx_d, sw_d, sw_r, scale,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, PRECISION: tl.constexpr):
        """out[n, r] = scale * sum_d x[n, d] * w[d, r]: a wide input reduced to the rank (fp32 out)."""
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        ranks = tl.arange(0, BLOCK_R)
        acc = tl.zeros([BLOCK_N, BLOCK_R], tl.float32)
        for start in range(0, D, BLOCK_D):
            cols = start + tl.arange(0, BLOCK_D)
            x = tl.load(x_ptr + rows[:, None].to(tl.int64) * sx_n + cols[None, :] * sx_d,
                        mask=(rows[:, None] < N) & (cols[None, :] < D), other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols[:, None] * sw_d + ranks[None, :] * sw_r,
                        mask=(cols[:, None] < D) & (ranks[None, :] < R), other=0.0).to(tl.float32)
            acc += tl.dot(x, w, input_precision=PRECISION)
        tl.store(out_ptr + rows[:, None] * R + ranks[None, :], acc * scale,
                 mask=(rows[:, None] < N) & (ranks[None, :] < R))

    @triton.jit
    def _expand_kernel(p_ptr, w_ptr, y_ptr, out_ptr, N, D, R, sw_r, sw_d, scale, HAS_Y: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, PRECISION: tl.constexpr):
        """out[n, d] = y[n, d] + scale * sum_r p[n, r] * w[r, d]: the rank expanded to a wide output
        (y, out contiguous [N, D]; p contiguous [N, R] fp32)."""
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        ranks = tl.arange(0, BLOCK_R)
        p = tl.load(p_ptr + rows[:, None] * R + ranks[None, :], mask=(rows[:, None] < N) & (ranks[None, :] < R),
                    other=0.0)
        w = tl.load(w_ptr + ranks[:, None] * sw_r + cols[None, :] * sw_d,
                    mask=(ranks[:, None] < R) & (cols[None, :] < D), other=0.0).to(tl.float32)
        acc = tl.dot(p, w, input_precision=PRECISION) * scale
        offsets = rows[:, None].to(tl.int64) * D + cols[None, :]
        inside = (rows[:, None] < N) & (cols[None, :] < D)
        if HAS_Y:
            acc += tl.load(y_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def _row_reduce_kernel(g_ptr, p_ptr, out_ptr, N, D, R, sg_n, sg_d, scale, SPLIT_ROWS: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, PRECISION: tl.constexpr):
        """out[split, d, r] = scale * sum over this split's rows n of g[n, d] * p[n, r] (p contiguous fp32)."""
        cols = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
        split = tl.program_id(1)
        ranks = tl.arange(0, BLOCK_R)
        acc = tl.zeros([BLOCK_D, BLOCK_R], tl.float32)
        for start in range(split * SPLIT_ROWS, split * SPLIT_ROWS + SPLIT_ROWS, BLOCK_N):
            rows = start + tl.arange(0, BLOCK_N)
            g = tl.load(g_ptr + cols[:, None] * sg_d + rows[None, :].to(tl.int64) * sg_n,
                        mask=(cols[:, None] < D) & (rows[None, :] < N), other=0.0).to(tl.float32)
            p = tl.load(p_ptr + rows[:, None] * R + ranks[None, :], mask=(rows[:, None] < N) & (ranks[None, :] < R),
                        other=0.0)
            acc += tl.dot(g, p, input_precision=PRECISION)
        tl.store(out_ptr + split * D * R + cols[:, None] * R + ranks[None, :], acc * scale,
                 mask=(cols[:, None] < D) & (ranks[None, :] < R))


def _block_r(r: int) -> int:
    return max(16, triton.next_power_of_2(r))  # tl.dot needs every dimension >= 16


def _shrink(x: Tensor, w_dr: Tensor, scale: float) -> Tensor:
    """[N, D] @ [D, R] (w given as any strided view) -> [N, R] fp32."""
    n, d = x.shape
    r = w_dr.shape[1]
    out = torch.empty(n, r, dtype=torch.float32, device=x.device)
    _shrink_kernel[(triton.cdiv(n, BLOCK_N),)](x, w_dr, out, n, d, r, x.stride(0), x.stride(1), w_dr.stride(0),
                                               w_dr.stride(1), scale, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
                                               BLOCK_R=_block_r(r), PRECISION=DOT_PRECISION)
    return out


def _expand(p: Tensor, w_rd: Tensor, scale: float, y: Tensor | None, dtype: torch.dtype) -> Tensor:
    """(y +) scale * [N, R] @ [R, D] -> [N, D] in ``dtype``."""
    n, r = p.shape
    d = w_rd.shape[1]
    out = torch.empty(n, d, dtype=dtype, device=p.device)
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(d, BLOCK_D))
    _expand_kernel[grid](p, w_rd, out if y is None else y, out, n, d, r, w_rd.stride(0), w_rd.stride(1), scale,
                         HAS_Y=y is not None, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, BLOCK_R=_block_r(r), PRECISION=DOT_PRECISION)
    return out


def _row_reduce(g: Tensor, p: Tensor, scale: float) -> Tensor:
    """scale * g^T @ p for g [N, D], p [N, R] fp32 -> [D, R] fp32, summed over row splits in a fixed order."""
    n, d = g.shape
    r = p.shape[1]
    splits = triton.cdiv(n, SPLIT_ROWS)
    parts = torch.empty(splits, d, r, dtype=torch.float32, device=g.device)
    _row_reduce_kernel[(triton.cdiv(d, BLOCK_D), splits)](g, p, parts, n, d, r, g.stride(0), g.stride(1), scale,
                                                         SPLIT_ROWS=SPLIT_ROWS, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
                                                         BLOCK_R=_block_r(r), PRECISION=DOT_PRECISION)
    return parts.sum(0)


class _FusedLoRA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor, lora_a: Tensor, lora_b: Tensor, scaling: float) -> Tensor:
        xa = _shrink(x, lora_a.t(), 1.0)
        ctx.save_for_backward(x, xa, lora_a, lora_b)
        ctx.scaling = scaling
        return _expand(xa, lora_b.t(), scaling, y.contiguous(), y.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, xa, lora_a, lora_b = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        dxa = _shrink(grad_out, lora_b, ctx.scaling)
        grad_b = _row_reduce(grad_out, xa, ctx.scaling) if ctx.needs_input_grad[3] else None
        grad_a = _row_reduce(x, dxa, 1.0).t().contiguous() if ctx.needs_input_grad[2] else None
        grad_x = _expand(dxa, lora_a, 1.0, None, x.dtype) if ctx.needs_input_grad[0] else None
        return grad_x, grad_out if ctx.needs_input_grad[1] else None, grad_a, grad_b, None


def fused_lora(x: Tensor, y: Tensor, lora_a: Tensor, lora_b: Tensor, scaling: float) -> Tensor:
    """``y + (x @ lora_a^T @ lora_b^T) * scaling`` for x [..., in], y [..., out] (the base layer's output),
    lora_a [r, in], lora_b [out, r] fp32; differentiable in x, y, lora_a and lora_b. Returns y's dtype."""
    if not fused_lora_supported(x):
        raise ValueError("fused LoRA needs triton and CUDA (or TRITON_INTERPRET=1); use the PyTorch branch")
    lead = x.shape[:-1]
    out = _FusedLoRA.apply(x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1]), lora_a, lora_b, scaling)
    return out.view(*lead, out.shape[-1])
