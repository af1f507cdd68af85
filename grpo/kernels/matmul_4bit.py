"""Decode-step matmuls that read bitsandbytes 4-bit weights directly: the static decoder's MLP without a
dense copy of it.

Why: at batch 64 a decode step reads every weight once, and the MLP's gate, up and down projections are
88% of the R1-Distill-1.5B decoder layer's weights. The static decoder (grpo/rollout/static_decode.py)
de-quantises them into a dense bf16 copy, so a step reads 2.3 GB of MLP weights; in 4 bits (a code a
nibble and an absmax a block of 64) it reads 0.65 GB, 3.5× less, and the copy's 2.2 GiB stay free for the
KV cache. cuBLAS's bf16 matmuls at this shape ran at 1.9-2.3 TB/s on an H100 (bench/RESULTS.md, "A decode
step as ~300 kernels"), so the MLP took ~1.1 of a step's 2.7 ms.

Two kernels: ``swiglu_4bit`` computes silu(x Wg^T) * (x Wu^T) from both 4-bit weights in one pass over x,
and ``matmul_4bit`` computes x W^T. Either is split along K into fp32 partial sums when its tiles alone give too
few programs to keep the GPU's schedulers busy (``Launch.min_programs``; a program is latency-bound, so one
warp a scheduler issues only every ~4 cycles: Nsight Compute, RESULTS), and a second small kernel adds the
partials in a fixed order (deterministic) and, for the fused kernel, applies SwiGLU. Each program
reads a [BLOCK_N, BLOCK_K / 2] tile of bytes and looks the codes of their high and low nibbles up as two
[BLOCK_N, BLOCK_K / 2] tiles in the compute dtype; the high nibbles hold the even columns of W, the low ones
the odd, so they multiply x's even and odd columns (x's tile split in registers) on tensor cores, fp32
accumulation, and the tile's sum is scaled by its rows' absmax in fp32 (BLOCK_K never crosses an absmax block).
So a weight is bf16(code) * absmax where bitsandbytes' de-quantised copy has bf16(code * absmax): a rounding
as fine, at another point (a bf16 code is off by at most 2^-9 of itself, as is the rounded product). Why
not the copy's own products: scaling each weight needs its row's absmax in the look-up, and Triton only
builds the look-up's result in the tensor cores' register layout (no trip through shared memory; PTX,
sm_90, RESULTS eleventh session) when the look-up is a one-operand elementwise op on the loaded bytes. On a
GPU the code book is looked up by a warp shuffle written in inline PTX (``code_lookup``), the book itself
written into the instructions; Triton's interpreter cannot run PTX, and fp32 (the tests' exact path) looks the
same values up with ``tl.gather``. How each call is cut into programs (``LAUNCHES``) was measured by
bench/matmul_4bit_probe.py's sweep.

Layout (bitsandbytes ``quantize_4bit``): the weight [N, K] flattened row-major, two codes a byte, the
first in the high nibble; one absmax per ``blocksize`` consecutive values of a row (K must be a multiple of
it), itself 8-bit quantised in blocks of 256 with an offset (double quantisation), undone once here into an
fp32 absmax per block.

The reference is bitsandbytes' ``dequantize_4bit`` followed by ``F.linear`` (what the decoder's dense
copy computes); tests/kernels/test_matmul_4bit.py compares the two under Triton's interpreter on a CPU (the
algorithm) and on a GPU (the shuffle), exactly in fp32 and to bf16's rounding in bf16.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from grpo.kernels.decode_attention import _interpreting, triton
from grpo.kernels.fit import first_that_loads
from grpo.model.dequant import dequantized

if triton is not None:
    import triton.language as tl

MAX_BLOCK_K = 128
SUM_BLOCK = 1024  # values a program of _sum_splits_kernel adds up


@dataclass(frozen=True)
class Launch:
    """How one call is cut into programs."""

    block_n: int = 64  # weight rows a program computes
    max_block_m: int = 64  # rows of x a program computes, at most (fewer: more programs, each tile read again)
    warps: int = 4  # one warpgroup a 64-row tile: at 8 the two each de-quantised the whole tile (PTX, sm_90)
    min_programs: int = 256  # split K until a call has this many programs (fp32 sums, then one kernel adds them)


# by (the fused gate/up kernel?, at most 16 rows?): the fastest of bench/matmul_4bit_probe.py's sweep on an
# H100 (RESULTS, eleventh session). Splitting K gains little (gate/up at 64 rows 35.8 -> 33.1 us in three
# ranges, slower in two or four): more warps a scheduler, but each program's pipeline fills and drains more often
LAUNCHES: dict[tuple[bool, bool], Launch] = {
    (True, True): Launch(block_n=32, max_block_m=16, warps=2, min_programs=560),
    (True, False): Launch(min_programs=420),
    (False, True): Launch(block_n=32, max_block_m=16, warps=2, min_programs=528),
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
    code_values: tuple[float, ...]  # the same, read once here: the look-up's PTX is written from them
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
        code = state.code.float()
        return cls(module.weight.data.view(-1), absmax.float().contiguous(), code.to(absmax.device),
                   tuple(code.tolist()), module.out_features, module.in_features, state.blocksize, module)

    def dense(self, dtype: torch.dtype) -> Tensor:
        """A new de-quantised copy [N, K] (bitsandbytes' own kernel): a prompt's pass over many tokens is a
        large matmul, where one layer's dense copy at a time beats de-quantising each tile per block of rows."""
        return dequantized(self.source).to(dtype)


@lru_cache(maxsize=None)
def code_lookup(code: tuple[float, ...], dtype: torch.dtype, low: bool) -> str:
    """Inline PTX that looks the codes of two bytes' low (or high) nibbles up: a 16-bit pair of bytes in, their
    two codes out as one packed pair of ``dtype`` (bf16 or fp16). Each lane holds code[lane % 16] (a select
    tree over the book's values, written in as immediates: an operand for the book would make the op binary,
    and Triton keeps only one-operand ops in the tensor cores' layout), and a shuffle from lane ``nibble`` is
    the look-up. shfl reads bits 4:0 of the lane index, and lanes 16-31 repeat 0-15, so a nibble needs only
    a shift, no mask. Why a shuffle: tl.gather's shuffles carried the tile through shared memory (PTX, sm_90;
    RESULTS, tenth session), and a table in memory was 2x slower (eighth and tenth sessions)."""
    level = ["0f%08X" % struct.unpack("<I", struct.pack("<f", value))[0] for value in code]
    tree = []
    for bit in range(4):  # halve the candidates on each bit of the lane
        tree += [f"and.b32 q, l, {1 << bit};", "setp.ne.u32 p, q, 0;"]
        tree += [f"selp.b32 s{bit}_{i}, {level[2 * i + 1]}, {level[2 * i]}, p;" for i in range(len(level) // 2)]
        level = [f"s{bit}_{i}" for i in range(len(level) // 2)]
    names = ", ".join(f"s{bit}_{i}" for bit in range(4) for i in range(8 >> bit))
    first, second = (0, 8) if low else (4, 12)
    cvt = {torch.bfloat16: "cvt.rn.bf16x2.f32", torch.float16: "cvt.rn.f16x2.f32"}[dtype]
    lines = ["mov.u32 l, %laneid;", *tree, "cvt.u32.u16 b, $1;", f"shr.b32 n0, b, {first};",
             f"shr.b32 n1, b, {second};", f"shfl.sync.idx.b32 v0, {level[0]}, n0, 31, -1;",
             f"shfl.sync.idx.b32 v1, {level[0]}, n1, 31, -1;", f"{cvt} $0, v1, v0;"]
    body = "\n".join(lines)
    return f"{{\n.reg .b32 l, q, b, n0, n1, v0, v1, {names};\n.reg .pred p;\n{body}\n}}"


if triton is not None:

    @triton.jit
    def _codes(w_ptr, code_ptr, n, kb, N, K, BLOCK_K: tl.constexpr, dtype: tl.constexpr, HIGH: tl.constexpr,
               LOW: tl.constexpr):
        """Rows ``n`` of W at this K block as codes in ``dtype``: the high nibbles' (W's even columns) and the low
        nibbles' (odd), each [BLOCK_N, BLOCK_K / 2]. ``HIGH``/``LOW``: ``code_lookup``'s PTX, or "" for
        ``tl.gather`` from the code book (Triton's interpreter; fp32)."""
        j = kb * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)  # the tile's byte columns; K is a multiple of BLOCK_K
        byte = tl.load(w_ptr + n[:, None].to(tl.int64) * (K // 2) + j[None, :], mask=n[:, None] < N, other=0)
        if HIGH == "":
            codes = tl.broadcast_to(tl.load(code_ptr + tl.arange(0, 16))[None, :], (n.shape[0], 16))
            high = tl.gather(codes, byte.to(tl.int32) >> 4, axis=1).to(dtype)
            low = tl.gather(codes, byte.to(tl.int32) & 0xF, axis=1).to(dtype)
        else:
            high = tl.inline_asm_elementwise(HIGH, "=r,h", [byte], dtype=dtype.value, is_pure=True, pack=2)
            low = tl.inline_asm_elementwise(LOW, "=r,h", [byte], dtype=dtype.value, is_pure=True, pack=2)
        return high, low

    @triton.jit
    def _block(w_ptr, absmax_ptr, code_ptr, n, kb, N, K, x_even, x_odd, acc, BLOCKSIZE: tl.constexpr,
               BLOCK_K: tl.constexpr, dtype: tl.constexpr, HIGH: tl.constexpr, LOW: tl.constexpr,
               IEEE: tl.constexpr):
        """acc + (rows ``n`` of W at K block ``kb``) @ x's tile, the tile's codes multiplied first and its sum
        scaled by the rows' absmax after (fp32)."""
        high, low = _codes(w_ptr, code_ptr, n, kb, N, K, BLOCK_K, dtype, HIGH, LOW)
        scale = tl.load(absmax_ptr + n.to(tl.int64) * (K // BLOCKSIZE) + (kb * BLOCK_K) // BLOCKSIZE, mask=n < N,
                        other=0.0)
        return acc + dot_acc(low, x_odd, dot_acc(high, x_even, None, IEEE), IEEE) * scale[:, None]

    @triton.jit
    def dot_acc(w, x_t, acc, IEEE: tl.constexpr):
        """acc + w [BLOCK_N, k] @ x_t [k, BLOCK_M] in fp32 (acc None: a new sum)."""
        if IEEE:
            return tl.dot(w.to(tl.float32), x_t.to(tl.float32), acc, input_precision="ieee")
        return tl.dot(w, x_t, acc)

    @triton.jit
    def _matmul_4bit_kernel(x_ptr, stride_xm, out_ptr, stride_om, stride_split, stride_up, M, N, K,
                            w_ptr, absmax_ptr, up_ptr, up_absmax_ptr, code_ptr, k_blocks_per_split,
                            BLOCKSIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, SWIGLU: tl.constexpr, SPLIT: tl.constexpr,
                            DOT_IEEE: tl.constexpr, HIGH: tl.constexpr, LOW: tl.constexpr):
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
            # x's even and odd columns, for the high and low nibbles' codes (a thread holds both of a pair)
            x_even, x_odd = tl.split(tl.permute(tl.reshape(x_t, (BLOCK_K // 2, 2, BLOCK_M)), (0, 2, 1)))
            acc = _block(w_ptr, absmax_ptr, code_ptr, n, kb, N, K, x_even, x_odd, acc, BLOCKSIZE, BLOCK_K, dtype,
                         HIGH, LOW, DOT_IEEE)
            if SWIGLU:
                acc_up = _block(up_ptr, up_absmax_ptr, code_ptr, n, kb, N, K, x_even, x_odd, acc_up, BLOCKSIZE,
                                BLOCK_K, dtype, HIGH, LOW, DOT_IEEE)
        out = out_ptr + pid_k * stride_split + m[None, :].to(tl.int64) * stride_om + n[:, None]
        _store_sums(out, (n[:, None] < N) & (m[None, :] < M), acc, acc_up, stride_up, dtype, SWIGLU, SPLIT)

    @triton.jit
    def _store_sums(out, inside, acc, acc_up, stride_up, dtype, SWIGLU: tl.constexpr, SPLIT: tl.constexpr):
        """A program's sums: with ``SPLIT`` its K range's fp32 partials (gate's, then up's at ``stride_up``) for
        ``_sum_splits_kernel``, else the result in ``out``'s dtype (SwiGLU applied)."""
        if SPLIT:
            tl.store(out, acc, mask=inside)
            if SWIGLU:
                tl.store(out + stride_up, acc_up, mask=inside)
        else:
            if SWIGLU:
                acc = swiglu_rounded(acc, acc_up, dtype)
            tl.store(out, acc.to(out.dtype.element_ty), mask=inside)

    @triton.jit
    def swiglu_rounded(gate, up, dtype):
        """F.silu(gate) * up on the compute dtype's values, as the dense decoder rounds them (fp32 out)."""
        gate = gate.to(dtype).to(tl.float32)
        return (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32) * up.to(dtype).to(tl.float32)

    @triton.jit
    def _sum_splits_kernel(partial_ptr, out_ptr, total, stride_split, stride_up, splits, SWIGLU: tl.constexpr,
                           BLOCK: tl.constexpr):
        # the K splits' sums added in split order (deterministic), then SwiGLU where the fused kernel was split
        at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = at < total
        acc = tl.zeros([BLOCK], tl.float32)
        acc_up = tl.zeros([BLOCK], tl.float32)
        for i in range(splits):
            acc += tl.load(partial_ptr + i * stride_split + at, mask=inside, other=0.0)
            if SWIGLU:
                acc_up += tl.load(partial_ptr + i * stride_split + stride_up + at, mask=inside, other=0.0)
        dtype = out_ptr.dtype.element_ty
        if SWIGLU:
            acc = swiglu_rounded(acc, acc_up, dtype)
        tl.store(out_ptr + at, acc.to(dtype), mask=inside)


def block_k(blocksize: int) -> int:
    """Columns a tile covers: at most 128, and never across an absmax block, so a tile row has one absmax."""
    return min(blocksize, MAX_BLOCK_K)


def block_m_for(rows: int, max_block_m: int) -> int:
    """Rows of x a program computes: a power of two, at least 16 (the tensor cores' smallest tile), at most
    ``max_block_m`` (also grpo/kernels/swiglu_dense.py)."""
    return max(16, 1 << (min(rows, max_block_m) - 1).bit_length())


def k_splits(rows: int, n: int, k: int, blocksize: int, block_m: int, block_n: int, launch: Launch) -> tuple[int, int]:
    """(K ranges, K blocks each) of a call: enough ranges for ``launch.min_programs`` programs, none empty."""
    tiles = -(-n // block_n) * -(-rows // block_m)
    k_blocks = k // block_k(blocksize)
    per_split = -(-k_blocks // min(k_blocks, -(-launch.min_programs // tiles)))
    return -(-k_blocks // per_split), per_split


def partial_bytes(rows: int, n: int, k: int, blocksize: int, swiglu: bool, dtype: torch.dtype) -> int:
    """The fp32 partial sums one call allocates while it runs (0 unsplit), at its first launch option
    (grpo/memory_plan.py counts them in a decode step)."""
    if rows <= 0:
        return 0
    launch = launch_for(dtype, swiglu, rows)
    split, _ = k_splits(rows, n, k, blocksize, block_m_for(rows, launch.max_block_m), launch.block_n, launch)
    return 0 if split == 1 else split * (2 if swiglu else 1) * rows * n * 4


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
    block_m = block_m_for(x.shape[0], launch.max_block_m)
    key = ("matmul_4bit", x.device, x.dtype, up is not None, block_m, launch, w.blocksize)
    return first_that_loads(key, launch_options(launch.block_n),
                            lambda option: _run(x, w, up, block_m, launch, *option))


def _run(x: Tensor, w: Weight4bit, up: Weight4bit | None, block_m: int, launch: Launch, block_n: int,
         stages: int) -> Tensor:
    rows = x.shape[0]
    split, per_split = k_splits(rows, w.out_features, w.in_features, w.blocksize, block_m, block_n, launch)
    out = torch.empty(rows, w.out_features, dtype=x.dtype, device=x.device)
    # split: each K range's fp32 sums [split, (gate, up,) rows, N], added by _sum_splits_kernel
    parts = 2 if up is not None else 1
    partial = out if split == 1 else torch.empty(split, parts, rows, w.out_features, dtype=torch.float32,
                                                   device=x.device)
    up_weight = up or w
    _matmul_4bit_kernel[(triton.cdiv(w.out_features, block_n), triton.cdiv(rows, block_m), split)](
        x, x.stride(0), partial, partial.stride(-2), partial.stride(0) if split > 1 else 0,
        partial.stride(1) if split > 1 else 0, rows, w.out_features, w.in_features,
        w.packed, w.absmax, up_weight.packed, up_weight.absmax, w.code, per_split,
        BLOCKSIZE=w.blocksize, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k(w.blocksize), SWIGLU=up is not None,
        SPLIT=split > 1,
        # fp32 gets exact (not TF32) products; so does everything under the interpreter, whose bf16 tl.dot
        # is wrong (numpy has no bf16)
        DOT_IEEE=x.dtype == torch.float32 or _interpreting(), **lookups(w, x.dtype), num_stages=stages,
        num_warps=launch.warps)
    if split > 1:
        _sum_splits_kernel[(triton.cdiv(out.numel(), SUM_BLOCK),)](
            partial, out, out.numel(), partial.stride(0), partial.stride(1), split, SWIGLU=up is not None,
            BLOCK=SUM_BLOCK)
    return out


def lookups(w: Weight4bit, dtype: torch.dtype) -> dict[str, str]:
    """The kernel's ``HIGH``/``LOW``: ``code_lookup``'s PTX on a GPU in bf16 or fp16, else "" (``tl.gather``)."""
    if _interpreting() or dtype == torch.float32:
        return {"HIGH": "", "LOW": ""}
    return {"HIGH": code_lookup(w.code_values, dtype, False), "LOW": code_lookup(w.code_values, dtype, True)}


def matmul_4bit(x: Tensor, w: Weight4bit) -> Tensor:
    """``x [..., K] @ W^T`` for a 4-bit ``w`` [N, K]: [..., N] in x's dtype."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return _launch(rows, w, None).view(*x.shape[:-1], w.out_features)


def swiglu_4bit(x: Tensor, gate: Weight4bit, up: Weight4bit) -> Tensor:
    """``F.silu(x @ Wg^T) * (x @ Wu^T)`` for 4-bit gate and up weights of one shape: [..., N]."""
    # the check reads Python values only: comparing the code books' tensors on a GPU waits for it, which a
    # CUDA graph capture forbids (the decoder's capture failed so on the H100, 2026-12-05)
    if (gate.out_features, gate.in_features, gate.blocksize, gate.code_values) \
            != (up.out_features, up.in_features, up.blocksize, up.code_values):
        raise ValueError("swiglu_4bit: gate and up must share their shape, block size and code book")
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return _launch(rows, gate, up).view(*x.shape[:-1], gate.out_features)


def reference_mlp(h: Tensor, gate: Weight4bit, up: Weight4bit, down: Weight4bit) -> Tensor:
    """The same MLP from de-quantised weights, one layer's copy at a time (a prompt's pass)."""
    dt = h.dtype
    return F.linear(F.silu(F.linear(h, gate.dense(dt))) * F.linear(h, up.dense(dt)), down.dense(dt))
