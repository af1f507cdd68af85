"""Decode-step matmuls that read bitsandbytes 4-bit weights directly: the static decoder's MLP without a
dense copy of it.

Why: at batch 64 a decode step reads every weight once, and the MLP's gate, up and down projections are
88% of the R1-Distill-1.5B decoder layer's weights. The static decoder (grpo/rollout/static_decode.py)
de-quantises them into a dense bf16 copy, so a step reads 2.3 GB of MLP weights; in 4 bits (a code a
nibble and an absmax a block of 64) it reads 0.65 GB, 3.5× less, and the copy's 2.2 GiB stay free for the
KV cache. cuBLAS's bf16 matmuls at this shape ran at 1.9-2.3 TB/s on an H100 (bench/RESULTS.md, "A decode
step as ~300 kernels"), so the MLP took ~1.1 of a step's 2.7 ms.

Two kernels, each one launch a layer: ``swiglu_4bit`` computes silu(x Wg^T) * (x Wu^T) from both 4-bit
weights in one pass over x (the gate and up outputs never reach memory), and ``matmul_4bit`` computes
x W^T, split along K into partial sums when N alone gives too few programs to fill the GPU (the down
projection: N = 1536 for K = 8960), the partials summed in a fixed order (deterministic). Each program
reads a [BLOCK_N, BLOCK_K / 2] tile of bytes, de-quantises its high and low nibbles as bitsandbytes does
(code[nibble] * its block's absmax, in fp32, rounded to the compute dtype), interleaves them back into the
[BLOCK_N, BLOCK_K] weight tile, and multiplies it on tensor cores with x's [BLOCK_K, rows] tile (fp32
accumulation), so the products are the dense copy's to the summation order. On a GPU the code book is looked
up by a warp shuffle written in inline PTX (``_SHUFFLE_LOOKUP``), elementwise in the tensor cores' own layout;
Triton's interpreter cannot run PTX and looks the same values up with ``tl.gather``. How each call is cut into
programs (``LAUNCHES``) was measured by bench/matmul_4bit_probe.py's sweep.

Layout (bitsandbytes ``quantize_4bit``): the weight [N, K] flattened row-major, two codes a byte, the
first in the high nibble; one absmax per ``blocksize`` consecutive values of a row (K must be a multiple of
it), itself 8-bit quantised in blocks of 256 with an offset (double quantisation), undone once here into an
fp32 absmax per block.

The reference is bitsandbytes' ``dequantize_4bit`` followed by ``F.linear`` (what the decoder's dense
copy computes); tests/kernels/test_matmul_4bit.py compares the two under Triton's interpreter on a CPU (the
algorithm) and on a GPU (the shuffle).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from grpo.kernels.decode_attention import _interpreting, triton
from grpo.kernels.fit import first_that_loads
from grpo.model.dequant import dequantized

if triton is not None:
    import triton.language as tl

MAX_BLOCK_K = 128


@dataclass(frozen=True)
class Launch:
    """How one call is cut into programs."""

    block_n: int = 64  # weight rows a program computes
    max_block_m: int = 64  # rows of x a program computes, at most (fewer: more programs, each tile read again)
    warps: int = 4  # one warpgroup a 64-row tile: at 8 the two each de-quantised the whole tile (PTX, sm_90)
    min_programs: int = 256  # split K until a call has this many programs (not the fused kernel: SwiGLU)


# by (the fused gate/up kernel?, at most 16 rows?): the fastest of bench/matmul_4bit_probe.py's sweep on an
# H100 (RESULTS, tenth session). At 16 rows the fused kernel runs 560 one-warp programs (24.8 us against 33.9 at
# 140 of four warps); at 64 rows more, narrower or row-split programs were all slower (each de-quantises more)
LAUNCHES: dict[tuple[bool, bool], Launch] = {(True, True): Launch(block_n=16, max_block_m=16, warps=1),
                                             (True, False): Launch(),
                                             (False, True): Launch(min_programs=264),
                                             (False, False): Launch(min_programs=264)}
# fp32 (exact IEEE products: the tests' tiny models, never a speed path) keeps the launch its GPU tests passed
# at; at 4 warps its products spilled registers
FP32_LAUNCH = Launch(warps=8)


def launch_for(dtype: torch.dtype, swiglu: bool, rows: int) -> Launch:
    """How a call of ``rows`` rows in ``dtype`` is cut (one source for the launcher, bench/smem_fit.py and
    tests/kernels/test_compile.py)."""
    return FP32_LAUNCH if dtype == torch.float32 else LAUNCHES[(swiglu, rows <= 16)]


@dataclass(frozen=True)
class Weight4bit:
    """One bitsandbytes 4-bit linear layer's weight as the kernels read it."""

    packed: Tensor  # uint8 [N * K / 2]
    absmax: Tensor  # fp32, one a block
    code: Tensor  # fp32 [16]: the code book (NF4's quantiles, or FP4's values)
    quant_type: str  # the code book's name: "nf4" or "fp4"
    out_features: int
    in_features: int
    blocksize: int
    source: torch.nn.Module  # the bitsandbytes layer

    @classmethod
    def of(cls, module: torch.nn.Module) -> "Weight4bit":
        import bitsandbytes.functional as bnbf

        state = module.weight.quant_state
        if module.in_features % state.blocksize:
            # blocks would straddle rows, where bitsandbytes' CPU and CUDA kernels disagree on the layout
            raise ValueError(f"4-bit matmul: in_features {module.in_features} is not a multiple of the "
                             f"block size {state.blocksize}")
        absmax = state.absmax
        if state.nested:  # double quantisation: 8-bit absmax codes, their own absmax, an offset
            absmax = bnbf.dequantize_blockwise(state.absmax, state.state2) + state.offset
        return cls(module.weight.data.view(-1), absmax.float().contiguous(), state.code.float().to(absmax.device),
                   state.quant_type, module.out_features, module.in_features, state.blocksize, module)

    def dense(self, dtype: torch.dtype) -> Tensor:
        """A new de-quantised copy [N, K] (bitsandbytes' own kernel): a prompt's pass over many tokens is a
        large matmul, where one layer's dense copy at a time beats de-quantising each tile per block of rows."""
        return dequantized(self.source).to(dtype)


if triton is not None:

    # The code book's look-up as one shuffle a weight, written out because tl.gather's shuffles force the tile
    # through shared memory into the tensor cores' layout (PTX, sm_90; RESULTS, tenth session). Each lane
    # loads code[lane % 16], so the lane a nibble names holds its code; four bytes (eight weights) a call.
    _SHUFFLE_LOOKUP = tl.constexpr("""{
    .reg .b32 t, l, n<8>;
    .reg .b64 a;
    mov.u32 l, %laneid;
    and.b32 l, l, 15;
    mul.wide.u32 a, l, 4;
    add.s64 a, a, $9;
    ld.global.nc.f32 t, [a];
    bfe.u32 n0, $8, 4, 4;
    bfe.u32 n1, $8, 12, 4;
    bfe.u32 n2, $8, 20, 4;
    bfe.u32 n3, $8, 28, 4;
    bfe.u32 n4, $8, 0, 4;
    bfe.u32 n5, $8, 8, 4;
    bfe.u32 n6, $8, 16, 4;
    bfe.u32 n7, $8, 24, 4;
    shfl.sync.idx.b32 $0, t, n0, 31, -1;
    shfl.sync.idx.b32 $1, t, n1, 31, -1;
    shfl.sync.idx.b32 $2, t, n2, 31, -1;
    shfl.sync.idx.b32 $3, t, n3, 31, -1;
    shfl.sync.idx.b32 $4, t, n4, 31, -1;
    shfl.sync.idx.b32 $5, t, n5, 31, -1;
    shfl.sync.idx.b32 $6, t, n6, 31, -1;
    shfl.sync.idx.b32 $7, t, n7, 31, -1;
    }""")

    @triton.jit
    def _tile(w_ptr, absmax_ptr, code_ptr, n, kb, N, K, BLOCKSIZE: tl.constexpr, BLOCK_K: tl.constexpr, dtype,
              ASM: tl.constexpr):
        """Rows ``n`` of W at this K block, de-quantised as bitsandbytes does (code * absmax in fp32, rounded to
        ``dtype``): [BLOCK_N, BLOCK_K]. A byte holds columns 2j (high nibble) and 2j + 1 (low); the two halves
        are interleaved back by ``join`` + ``reshape``, which puts them where the tensor cores' register operand
        wants them (consecutive K pairs). A tile row has one absmax (BLOCK_K divides the block size). ``ASM``:
        the look-up by ``_SHUFFLE_LOOKUP``; else (Triton's interpreter) ``tl.gather`` from the code book in
        registers. Gathering from memory instead was slower (RESULTS, eighth and tenth sessions)."""
        j = kb * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)  # the tile's byte columns; K is a multiple of BLOCK_K
        byte = tl.load(w_ptr + n[:, None].to(tl.int64) * (K // 2) + j[None, :], mask=n[:, None] < N, other=0)
        scale = tl.load(absmax_ptr + n.to(tl.int64) * (K // BLOCKSIZE) + (kb * BLOCK_K) // BLOCKSIZE, mask=n < N,
                        other=0.0)[:, None]
        if ASM:
            table = tl.zeros_like(byte).to(tl.int64) + code_ptr.to(tl.int64)
            even, odd = tl.inline_asm_elementwise(_SHUFFLE_LOOKUP, "=r,=r,=r,=r,=r,=r,=r,=r,r,l,l,l,l", [byte, table],
                                                  dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
        else:
            codes = tl.broadcast_to(tl.load(code_ptr + tl.arange(0, 16))[None, :], (n.shape[0], 16))
            even = tl.gather(codes, byte.to(tl.int32) >> 4, axis=1)
            odd = tl.gather(codes, byte.to(tl.int32) & 0xF, axis=1)
        return tl.reshape(tl.join((even * scale).to(dtype), (odd * scale).to(dtype)), (n.shape[0], BLOCK_K))

    @triton.jit
    def _dot(w, x_t, acc, IEEE: tl.constexpr):
        """acc + w [BLOCK_N, k] @ x_t [k, BLOCK_M], accumulated in fp32 in place."""
        if IEEE:
            return tl.dot(w.to(tl.float32), x_t.to(tl.float32), acc, input_precision="ieee")
        return tl.dot(w, x_t, acc)

    @triton.jit
    def _matmul_4bit_kernel(x_ptr, stride_xm, out_ptr, stride_om, stride_split, M, N, K,
                            w_ptr, absmax_ptr, up_ptr, up_absmax_ptr, code_ptr, k_blocks_per_split,
                            BLOCKSIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, SWIGLU: tl.constexpr, DOT_IEEE: tl.constexpr, ASM: tl.constexpr):
        # computes out^T = W x^T, so the de-quantised weights are the tensor cores' left operand, which can stay
        # in registers; as the right one (x W^T) every tile went through shared memory value by value (RESULTS)
        pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        dtype = x_ptr.dtype.element_ty
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        acc_up = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        first = pid_k * k_blocks_per_split
        for kb in range(first, tl.minimum(first + k_blocks_per_split, K // BLOCK_K)):
            k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
            x_t = tl.load(x_ptr + m[None, :].to(tl.int64) * stride_xm + k[:, None], mask=m[None, :] < M, other=0.0)
            acc = _dot(_tile(w_ptr, absmax_ptr, code_ptr, n, kb, N, K, BLOCKSIZE, BLOCK_K, dtype, ASM), x_t, acc,
                       DOT_IEEE)
            if SWIGLU:
                acc_up = _dot(_tile(up_ptr, up_absmax_ptr, code_ptr, n, kb, N, K, BLOCKSIZE, BLOCK_K, dtype, ASM),
                              x_t, acc_up, DOT_IEEE)
        out = out_ptr + pid_k * stride_split + m[None, :].to(tl.int64) * stride_om + n[:, None]
        if SWIGLU:  # F.silu(gate) * up on the compute dtype's values, as the dense decoder rounds them
            gate = acc.to(dtype).to(tl.float32)
            act = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
            acc = act * acc_up.to(dtype).to(tl.float32)
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(n[:, None] < N) & (m[None, :] < M))


def block_k(blocksize: int) -> int:
    """Columns a tile covers: at most 128, and never across an absmax block, so a tile row has one absmax."""
    return min(blocksize, MAX_BLOCK_K)


def launch_options(block_n: int) -> list[tuple[int, int]]:
    """(BLOCK_N, Triton's num_stages) to try in turn (grpo/kernels/fit.py): the fused gate/up kernel holds
    two weights' tiles in every pipeline stage (when it gathered its code book from memory, 208 KiB in bf16
    at three stages and 288 in fp32, against an H100's 227 and an RTX card's 99; bench/smem_fit.py prints
    today's), so fewer stages and then narrower tiles follow."""
    options = [(block_n, 3), (block_n, 2), (max(16, block_n // 2), 2), (max(16, block_n // 2), 1), (16, 1)]
    return list(dict.fromkeys(options))  # in order, once each


def _launch(x: Tensor, w: Weight4bit, up: Weight4bit | None) -> Tensor:
    """The kernel at ``launch_for``'s cut and the first of its ``launch_options`` that loads on this GPU
    (remembered)."""
    launch = launch_for(x.dtype, up is not None, x.shape[0])
    block_m = max(16, triton.next_power_of_2(min(x.shape[0], launch.max_block_m)))
    key = ("matmul_4bit", x.device, x.dtype, up is not None, block_m, launch, w.blocksize)
    return first_that_loads(key, launch_options(launch.block_n),
                            lambda option: _run(x, w, up, block_m, launch, *option))


def _run(x: Tensor, w: Weight4bit, up: Weight4bit | None, block_m: int, launch: Launch, block_n: int,
         stages: int) -> Tensor:
    rows = x.shape[0]
    tiles = triton.cdiv(w.out_features, block_n) * triton.cdiv(rows, block_m)
    k_blocks = w.in_features // block_k(w.blocksize)
    split = 1 if up is not None else min(k_blocks, triton.cdiv(launch.min_programs, tiles))
    per_split = triton.cdiv(k_blocks, split)
    split = triton.cdiv(k_blocks, per_split)
    out = (torch.empty(rows, w.out_features, dtype=x.dtype, device=x.device) if split == 1 else
           torch.empty(split, rows, w.out_features, dtype=torch.float32, device=x.device))
    up_weight = up or w
    _matmul_4bit_kernel[(triton.cdiv(w.out_features, block_n), triton.cdiv(rows, block_m), split)](
        x, x.stride(0), out, out.stride(-2), out.stride(0) if split > 1 else 0, rows, w.out_features, w.in_features,
        w.packed, w.absmax, up_weight.packed, up_weight.absmax, w.code, per_split,
        BLOCKSIZE=w.blocksize, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k(w.blocksize), SWIGLU=up is not None,
        # fp32 gets exact (not TF32) products; so does everything under the interpreter, whose bf16 tl.dot
        # is wrong (numpy has no bf16)
        DOT_IEEE=x.dtype == torch.float32 or _interpreting(), ASM=not _interpreting(), num_stages=stages,
        num_warps=launch.warps)
    return out if split == 1 else out.sum(0).to(x.dtype)


def matmul_4bit(x: Tensor, w: Weight4bit) -> Tensor:
    """``x [..., K] @ W^T`` for a 4-bit ``w`` [N, K]: [..., N] in x's dtype."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return _launch(rows, w, None).view(*x.shape[:-1], w.out_features)


def swiglu_4bit(x: Tensor, gate: Weight4bit, up: Weight4bit) -> Tensor:
    """``F.silu(x @ Wg^T) * (x @ Wu^T)`` for 4-bit gate and up weights of one shape: [..., N]."""
    # the check reads Python values only: comparing the code books' tensors on a GPU waits for it, which a
    # CUDA graph capture forbids (the decoder's capture failed so on the H100, 2026-12-05)
    if (gate.out_features, gate.in_features, gate.blocksize, gate.quant_type) \
            != (up.out_features, up.in_features, up.blocksize, up.quant_type):
        raise ValueError("swiglu_4bit: gate and up must share their shape, block size and code book")
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return _launch(rows, gate, up).view(*x.shape[:-1], gate.out_features)


def reference_mlp(h: Tensor, gate: Weight4bit, up: Weight4bit, down: Weight4bit) -> Tensor:
    """The same MLP from de-quantised weights, one layer's copy at a time (a prompt's pass)."""
    dt = h.dtype
    return F.linear(F.silu(F.linear(h, gate.dense(dt))) * F.linear(h, up.dense(dt)), down.dense(dt))
