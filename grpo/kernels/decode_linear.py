"""A decode step's small matmul, ``x @ W^T + b`` for a few rows of x, as one Triton kernel whose programs split
K and whose last program of each weight tile adds the partial sums.

Why: at a decode step's rows a projection streams its weights once, but the R1-Distill-1.5B decoder's q/k/v
(N 2048) and output (N 1536) projections are 32 and 24 tiles of 64 weight rows: cuBLAS took 5.9 and 5.2 µs a
layer for 6.3 and 4.7 MB on an H100, 1.1 and 0.9 of its 3.35 TB/s. Here each tile's K is cut into shares, as many
as leave about one program a multiprocessor, and the program that finishes a tile's last share sums the shares'
fp32 partials in share order (the CUDA threadfence-reduction pattern: every thread's stores, a barrier, one
release-acquire count), so the result does not depend on which share finished first and no second kernel runs;
the down projection (K 8960: cuBLAS splits K too, then sums in a second kernel) takes it as well.
Measured on an H100 (bench/RESULTS.md, eighteenth session): the shares did not turn the q/k/v and output
projections bandwidth-bound (5.86 and 5.16 µs at 16 rows), a few percent faster than cuBLAS at 16 rows and 8-28%
slower at 64. So ``decode_linear`` runs the kernel at up to ``MAX_ROWS`` rows where K splits, and cuBLAS otherwise
(the 8 GB preset's 64 sequences keep cuBLAS; SENT's and evaluation's smaller batches take the kernel).

The count a tile keeps is reset by the program that read it last, so a captured CUDA graph replays with
counts at zero; the counts are allocated once per device outside any capture (the decoder's warm-up).
Products are bf16 on tensor cores accumulated in fp32 (fp32 inputs: exact IEEE products, the tests' tiny
models); the bias is added in fp32 and the sum rounded once, as cuBLAS's bias epilogue does.
tests/kernels/test_decode_linear.py compares it with ``F.linear``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# _programs_wanted: a program a multiprocessor, eight under the interpreter (so the CPU's tests split K too)
from grpo.kernels.decode_attention import _interpreting, _programs_wanted, dependent_launch, triton
from grpo.kernels.fit import first_that_loads, k_blocks_divide
from grpo.kernels.matmul_4bit import block_m_for

if triton is not None:
    import triton.language as tl

    from grpo.kernels.matmul_4bit import dot_acc

    @triton.jit
    def _decode_linear_kernel(x_ptr, stride_xm, w_ptr, bias_ptr, out_ptr, stride_om, part_ptr, count_ptr, M, N, K,
                              blocks_per_share, SHARES: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_IEEE: tl.constexpr,
                              PDL: tl.constexpr = False):
        # out^T = W x^T: W is the tensor cores' left operand, a program streams its 64 weight rows' share of K once
        if PDL:  # x is the kernel before's output (decode_attention.dependent_launch)
            tl.extra.cuda.gdc_wait()
        pid_n, share, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        first = share * blocks_per_share
        for kb in range(first, tl.minimum(first + blocks_per_share, K // BLOCK_K)):
            k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
            x_t = tl.load(x_ptr + m[None, :].to(tl.int64) * stride_xm + k[:, None], mask=m[None, :] < M, other=0.0)
            w = tl.load(w_ptr + n[:, None].to(tl.int64) * K + k[None, :], mask=n[:, None] < N, other=0.0)
            acc = dot_acc(w, x_t, acc, DOT_IEEE)
        out = out_ptr + m[None, :].to(tl.int64) * stride_om + n[:, None]
        inside = (n[:, None] < N) & (m[None, :] < M)
        if SHARES == 1:
            _finish(acc, bias_ptr, n, N, out, inside, HAS_BIAS)
        else:
            # partials [tiles, SHARES, BLOCK_N, BLOCK_M]: a tile's shares side by side
            tile = pid_m * tl.num_programs(0) + pid_n
            tile_at = (tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :])
            tl.store(part_ptr + (tile * SHARES + share).to(tl.int64) * BLOCK_N * BLOCK_M + tile_at, acc)
            tl.debug_barrier()  # every thread's stores issued before the count that releases them
            if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu") == SHARES - 1:
                tl.debug_barrier()
                tl.store(count_ptr + tile, 0)  # ready for the next launch (the next layer's, the next replay)
                total = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
                for s in range(SHARES):  # in share order, this program's own too: deterministic
                    # .cg: the other shares' lines were written by other multiprocessors, never through this L1
                    total += tl.load(part_ptr + (tile * SHARES + s).to(tl.int64) * BLOCK_N * BLOCK_M + tile_at,
                                     cache_modifier=".cg")
                _finish(total, bias_ptr, n, N, out, inside, HAS_BIAS)

    @triton.jit
    def _finish(acc, bias_ptr, n, N, out, inside, HAS_BIAS: tl.constexpr):
        if HAS_BIAS:
            acc += tl.load(bias_ptr + n, mask=n < N, other=0.0).to(tl.float32)[:, None]
        tl.store(out, acc.to(out.dtype.element_ty), mask=inside)

BLOCK_N = 64  # weight rows a program (one warpgroup's wgmma tile)
MAX_BLOCK_M = 64  # rows of x a program; more rows: more tiles, each streaming its weights again
# (BLOCK_K, pipeline stages) from the fastest guess down to what a 99 KiB card holds in fp32 (grpo/kernels/fit.py)
OPTIONS = [(64, 4), (64, 3), (64, 2), (32, 2)]
# the most rows the kernel takes: on an H100 it beat cuBLAS at 16 rows (q/k/v 6.04 -> 5.86 µs a layer, output
# 5.36 -> 5.16, down 14.6 -> 14.10; a decode step 1.980 -> 1.902 ms) and lost at 64 (6.24 -> 7.70, 5.54 -> 7.08,
# 15.24 -> 16.43; 2.326 -> 2.477 ms): bench/RESULTS.md, eighteenth session
MAX_ROWS = 16

# above MAX_ROWS the down projection is cuBLAS's matmul over K's parts in one batched call, the parts' fp32 sums left
# to the next layer's compiled residual add (grpo/rollout/static_layers.residual) instead of cuBLAS's split-K
# reduction kernel: the down projection with the next layer's add, norm and q/k/v 23.49 -> 22.22 µs a layer at 64
# rows on an H100 (2 parts: 22.38, 5: 22.59, 10: 27.28; bench/down_partials_probe.py, RESULTS nineteenth session)
PARTS = 4

_COUNTS: dict[torch.device, Tensor] = {}  # each tile's count of shares done, zero between launches


def shares_for(tiles: int, k_blocks: int, programs: int) -> tuple[int, int]:
    """(shares a tile's K is cut into, K blocks a share): as many as leave at most ``programs`` programs (at
    least one share a tile), none empty."""
    per_share = -(-k_blocks // max(1, min(k_blocks, programs // tiles)))
    return -(-k_blocks // per_share), per_share


def partial_bytes(rows: int, n: int, k: int, programs: int) -> int:
    """The fp32 partial sums one ``decode_linear`` call allocates while it runs on ``programs`` multiprocessors (0
    where it runs cuBLAS or does not split), at the kernel's first launch option (grpo/memory_plan.py bounds them
    in its generation margin)."""
    if not takes(rows, n, k, programs):
        return 0
    block_m = block_m_for(rows, MAX_BLOCK_M)
    tiles = -(-n // BLOCK_N) * -(-rows // block_m)
    return tiles * shares_for(tiles, k // OPTIONS[0][0], programs)[0] * BLOCK_N * block_m * 4


def takes(rows: int, n: int, k: int, programs: int) -> bool:
    """Whether ``decode_linear`` runs the kernel: at most ``MAX_ROWS`` rows, a width it takes, and K cut into
    shares on this many multiprocessors (unsplit it would be cuBLAS's tiles without cuBLAS's tuning)."""
    if rows > MAX_ROWS or not k_blocks_divide(k, OPTIONS):
        return False
    return shares_for(-(-n // BLOCK_N), k // OPTIONS[0][0], programs)[0] > 1


def _counts(device: torch.device, tiles: int) -> Tensor:
    """At least ``tiles`` zeroed counts on ``device``, made once (and grown) outside a graph capture."""
    counts = _COUNTS.get(device)
    if counts is None or counts.numel() < tiles:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("decode_linear: first call at this size inside a CUDA graph capture; warm up first")
        counts = _COUNTS[device] = torch.zeros(max(tiles, 256), dtype=torch.int32, device=device)
    return counts


def decode_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` for a decode step's rows: the split-K kernel where it ``takes`` them, else
    ``F.linear`` itself."""
    n, k = weight.shape
    rows = x.reshape(-1, k)
    if not weight.is_contiguous() or not takes(rows.shape[0], n, k, _programs_wanted(x.device)):
        return F.linear(x, weight, bias)
    return split_k_linear(rows.contiguous(), weight, bias).view(*x.shape[:-1], n)


def down_projection(x: Tensor, weight: Tensor) -> Tensor:
    """A decode step's down projection ``x @ weight^T``: ``decode_linear``'s [..., N] at up to ``MAX_ROWS`` rows (or
    where K does not cut into ``PARTS``); above, its fp32 partial sums over ``PARTS`` consecutive parts of K
    [PARTS, ..., N], for the caller to add (their sum rounded once, as a matmul rounds its output)."""
    k = weight.shape[1]
    if x.numel() // k <= MAX_ROWS or k % PARTS:
        return decode_linear(x, weight)
    return part_sums(x, weight, PARTS)


def part_sums(x: Tensor, weight: Tensor, parts: int) -> Tensor:
    """The fp32 partial sums of ``x @ weight^T`` over ``parts`` consecutive parts of K [parts, ..., N] (``parts``
    divides K), as one cuBLAS strided-batched matmul."""
    n, k = weight.shape
    rows = x.reshape(-1, k)
    cut = rows.reshape(rows.shape[0], parts, k // parts).transpose(0, 1)  # [parts, M, K / parts], row stride K
    w = weight.view(n, parts, k // parts).permute(1, 2, 0)  # [parts, K / parts, N]: each part's W^T
    out = torch.bmm(cut, w) if x.dtype == torch.float32 else torch.bmm(cut, w, out_dtype=torch.float32)
    return out.view(parts, *x.shape[:-1], n)


def split_k_linear(rows: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """The kernel: ``rows`` [M, K] @ ``weight``^T (+ ``bias``) for a contiguous ``weight`` [N, K] whose K
    every option's K block divides."""
    n, k = weight.shape
    block_m = block_m_for(rows.shape[0], MAX_BLOCK_M)
    tiles = triton.cdiv(n, BLOCK_N) * triton.cdiv(rows.shape[0], block_m)
    out = torch.empty(rows.shape[0], n, dtype=rows.dtype, device=rows.device)
    pdl = dependent_launch(rows.device)

    def launch(option: tuple[int, int]) -> Tensor:
        block_k, stages = option
        shares, per_share = shares_for(tiles, k // block_k, _programs_wanted(rows.device))
        part = out if shares == 1 else torch.empty(tiles * shares * BLOCK_N * block_m, dtype=torch.float32,
                                                   device=rows.device)  # partial_bytes
        _decode_linear_kernel[(triton.cdiv(n, BLOCK_N), shares, triton.cdiv(rows.shape[0], block_m))](
            rows, rows.stride(0), weight, out if bias is None else bias, out, out.stride(0), part,
            _counts(rows.device, tiles), rows.shape[0], n, k, per_share, SHARES=shares, HAS_BIAS=bias is not None,
            BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=block_k,
            # fp32: exact (not TF32) products; so does everything under the interpreter (numpy has no bf16)
            DOT_IEEE=rows.dtype == torch.float32 or _interpreting(), PDL=bool(pdl), num_warps=4, num_stages=stages,
            **pdl)
        return out

    return first_that_loads(("decode_linear", rows.device, rows.dtype, block_m), OPTIONS, launch)


@torch.library.custom_op("grpo::decode_linear", mutates_args=())
def decode_linear_op(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``decode_linear`` as one opaque call inside a torch.compile'd decoder part (inductor would otherwise trace
    into the launcher's host code); inductor fuses the elementwise work around it as it did around cuBLAS's."""
    return decode_linear(x, weight, bias)


@decode_linear_op.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])
