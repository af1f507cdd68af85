"""One decode step's attention for one layer in Triton: RoPE (and Qwen3's q/k norms) on the step's fused
q/k/v projection, the new key and value written into the static KV cache at each slot's cursor, and
grouped-query attention over that slot's cache, with an online softmax; where the cache is long against
the number of slots, its shares are read by separate programs and combined by a second small kernel.

Why: in the static decoder (grpo/rollout/static_decode.py) the same work in PyTorch is about ten kernels
a layer (RoPE, two cache scatters, head permutes, two batched matmuls, the masked softmax), each moving
a few kilobytes, and at the R1-Distill-1.5B shape a decode step was bound by the ~525 kernels it ran one
after another, not by the ~3 GB of weights it must read (bench/RESULTS.md). Each program here handles
one (slot, kv head, share of the cache): it reads only its slot's cache up to the slot's own cursor, so the
step no longer depends on a cache-length bucket and one captured graph serves a whole generate call.

The PyTorch reference is ``torch_decode_attention`` in grpo/rollout/static_layers.py (the path a CPU
runs); tests/kernels/test_decode_attention.py compares the two, and the static decoder's tests compare
the whole decoder with HF ``generate`` under Triton's interpreter.
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

from grpo.kernels.fit import first_that_loads

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without triton: the PyTorch reference is used
    triton = None

BLOCK_L = 128  # the most cache positions an iteration reads: [BLOCK_L, head_dim] keys and values in registers


def launch_options() -> list[tuple[int, int, int]]:
    """(BLOCK, Triton's num_stages, num_warps) to try in turn (grpo/kernels/fit.py), fastest first: 128
    positions an iteration in two stages (R1-Distill-1.5B's heads on an H100, a layer's call at 640 cached
    positions: 25.0 -> 21.2 µs at 64 slots, 16.3 -> 15.2 at 16 slots, against 64 positions in three stages:
    bench/decode_attention_probe.py, bench/RESULTS.md sixteenth session). bf16 asks 72 KiB of shared memory a
    program there; an fp32 cache asks 144 KiB, and 140 at the second option, more than an RTX card's 99 KiB a
    block, so it runs the third (76; bench/smem_fit.py)."""
    return [(BLOCK_L, 2, 4), (BLOCK_L // 2, 3, 4), (BLOCK_L // 2, 2, 4), (BLOCK_L // 4, 2, 4), (BLOCK_L // 4, 1, 4)]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def layout_supported(head_dim: int, group: int) -> bool:
    """Whether the kernel handles this head layout (``group``: query heads per key/value head)."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0 and group <= 64


def triton_runs(device: torch.device) -> bool:
    """Whether the decoder's Triton kernels run on ``device``: an Ampere or newer GPU (bf16 tensor-core
    products; older cards keep the PyTorch paths, which no test here could cover), or Triton's interpreter."""
    on_device = _interpreting() or (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0))
    return triton is not None and on_device


def fused_supported(device: torch.device, head_dim: int, group: int) -> bool:
    """Whether the kernel can run here (``triton_runs``) for this head layout."""
    return triton_runs(device) and layout_supported(head_dim, group)


def dependent_launch(device: torch.device) -> dict[str, bool]:
    """Triton launch options for programmatic dependent launch where it exists (a Hopper or newer GPU; not the
    interpreter): the kernel may be scheduled while the one before it still runs, and waits (``gdc_wait``,
    under its ``PDL`` flag) before it reads anything that kernel may have written. Inductor's kernels in the
    decoder launch so (grpo/rollout/static_decode.compile_options); launched the same way, ours start without
    their launch latency after one of them."""
    hopper = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)
    return {"launch_pdl": True} if triton is not None and hopper and not _interpreting() else {}


if triton is not None:

    @triton.jit
    def _decode_attention_kernel(
            qkv_ptr, qkv_stride, cos_ptr, sin_ptr, cs_stride, qn_ptr, kn_ptr, eps,
            kc_ptr, vc_ptr, c_stride_s, c_stride_h, c_stride_l, valid_ptr, valid_stride, cursor_ptr,
            out_ptr, out_stride, part_ptr, stat_ptr, scale,
            HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
            BLOCK: tl.constexpr, CHUNK: tl.constexpr, SPLITS: tl.constexpr, HAS_NORM: tl.constexpr,
            DOT_FP32: tl.constexpr, PDL: tl.constexpr = False):
        slot = tl.program_id(0)
        head = tl.program_id(1)
        split = tl.program_id(2)
        d = tl.arange(0, D)
        # rotate_half(x)[d] = -x[d + D/2] for the first half, x[d - D/2] for the second
        rot = (d + D // 2) % D
        sign = tl.where(d < D // 2, -1.0, 1.0)
        if PDL:  # before any load: whatever this reads, the kernel before may have written (q/k/v are its output)
            tl.extra.cuda.gdc_wait()
        cos = tl.load(cos_ptr + slot * cs_stride + d).to(tl.float32)
        sin = tl.load(sin_ptr + slot * cs_stride + d).to(tl.float32)
        row = qkv_ptr + slot.to(tl.int64) * qkv_stride
        dtype = kc_ptr.dtype.element_ty

        # the new key (normed, rotated) and value go into the cache at the slot's cursor
        k_at = row + (HQ + head) * D
        k = tl.load(k_at + d)[None, :].to(tl.float32)
        k_rot = tl.load(k_at + rot)[None, :].to(tl.float32)
        if HAS_NORM:
            kw = tl.load(kn_ptr + d).to(tl.float32)
            kw_rot = tl.load(kn_ptr + rot).to(tl.float32)
            inv = tl.rsqrt(tl.sum(k * k, axis=1) / D + eps)[:, None]
            k, k_rot = k * inv * kw[None, :], k_rot * inv * kw_rot[None, :]
        k = k * cos[None, :] + k_rot * sign[None, :] * sin[None, :]
        v = tl.load(row + (HQ + HKV + head) * D + d)
        cursor = tl.load(cursor_ptr + slot)
        lo = split * CHUNK  # this program's share of the slot's cache: [lo, hi), empty past the cursor
        hi = tl.minimum(lo + CHUNK, cursor + 1)
        # only the share holding the cursor reads the new entry; one comparison of a [D] tensor (the
        # interpreter turns a bool tensor & a bool scalar into integers, which it refuses as a mask)
        holds_cursor = (d * 0 + cursor // CHUNK) == split
        cache_row = slot.to(tl.int64) * c_stride_s + head * c_stride_h
        tl.store(kc_ptr + cache_row + cursor * c_stride_l + d[None, :], k.to(dtype), mask=holds_cursor[None, :])
        tl.store(vc_ptr + cache_row + cursor * c_stride_l + d, v.to(dtype), mask=holds_cursor)
        tl.debug_barrier()  # the block's loads below must see the key and value just stored

        # this kv head's G query heads (padded to GP rows for the matmul), rotated like the key
        g = tl.arange(0, GP)
        q_at = row + (head * G + g)[:, None] * D
        q = tl.load(q_at + d[None, :], mask=g[:, None] < G, other=0.0).to(tl.float32)
        q_rot = tl.load(q_at + rot[None, :], mask=g[:, None] < G, other=0.0).to(tl.float32)
        if HAS_NORM:
            qw = tl.load(qn_ptr + d).to(tl.float32)
            qw_rot = tl.load(qn_ptr + rot).to(tl.float32)
            inv = tl.rsqrt(tl.sum(q * q, axis=1) / D + eps)[:, None]
            q, q_rot = q * inv * qw[None, :], q_rot * inv * qw_rot[None, :]
        q = (q * cos[None, :] + q_rot * sign[None, :] * sin[None, :]).to(dtype)

        m = tl.full([GP], float("-inf"), tl.float32)
        total = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        for start in range(lo, hi, BLOCK):  # every valid entry of a slot sits at or before its cursor
            pos = start + tl.arange(0, BLOCK)
            inside = pos < hi
            ok = tl.load(valid_ptr + slot * valid_stride + pos, mask=inside, other=0) != 0
            at = kc_ptr + cache_row + pos[:, None] * c_stride_l + d[None, :]
            keys = tl.load(at, mask=inside[:, None], other=0.0)
            if DOT_FP32:
                s = tl.dot(q.to(tl.float32), tl.trans(keys.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(keys))
            s = tl.where(ok[None, :], s * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no entry yet: nothing to rescale
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m - m_safe)
            values = tl.load(vc_ptr + cache_row + pos[:, None] * c_stride_l + d[None, :], mask=inside[:, None],
                             other=0.0)
            if DOT_FP32:
                pv = tl.dot(p.to(dtype).to(tl.float32), values.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(dtype), values)
            acc = acc * alpha[:, None] + pv
            total = total * alpha + tl.sum(p, axis=1)
            m = m_new
        if SPLITS == 1:
            out = acc / total[:, None]
            tl.store(out_ptr + slot.to(tl.int64) * out_stride + (head * G + g)[:, None] * D + d[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=g[:, None] < G)
        else:  # unnormalised, with its running max and sum: _combine_splits_kernel weighs the shares
            row_at = (slot.to(tl.int64) * HQ + head * G + g) * SPLITS + split
            tl.store(part_ptr + row_at[:, None] * D + d[None, :], acc, mask=g[:, None] < G)
            tl.store(stat_ptr + row_at * 2, m, mask=g < G)
            tl.store(stat_ptr + row_at * 2 + 1, total, mask=g < G)

    @triton.jit
    def _combine_splits_kernel(part_ptr, stat_ptr, out_ptr, out_stride, HQ: tl.constexpr, D: tl.constexpr,
                               SPLITS: tl.constexpr, SP: tl.constexpr, PDL: tl.constexpr = False):
        """One (slot, query head): the shares' outputs rescaled to their common maximum and summed, then
        divided by the summed softmax denominators (an empty share, max -inf and sums 0, weighs nothing)."""
        if PDL:  # the shares are the kernel before's output
            tl.extra.cuda.gdc_wait()
        slot = tl.program_id(0)
        qhead = tl.program_id(1)
        j = tl.arange(0, SP)
        d = tl.arange(0, D)
        row_at = (slot.to(tl.int64) * HQ + qhead) * SPLITS + j
        m = tl.load(stat_ptr + row_at * 2, mask=j < SPLITS, other=float("-inf"))
        total = tl.load(stat_ptr + row_at * 2 + 1, mask=j < SPLITS, other=0.0)
        acc = tl.load(part_ptr + row_at[:, None] * D + d[None, :], mask=(j < SPLITS)[:, None], other=0.0)
        weight = tl.exp(m - tl.max(m, axis=0))  # exp(-inf) = 0; some share holds the cursor, so max is finite
        out = tl.sum(acc * weight[:, None], axis=0) / tl.sum(total * weight, axis=0)
        tl.store(out_ptr + slot.to(tl.int64) * out_stride + qhead * D + d, out.to(out_ptr.dtype.element_ty))


def cache_splits(slots: int, n_kv: int, cache_len: int, block: int, programs: int) -> tuple[int, int]:
    """(positions a program reads, programs a (slot, kv head)) for a cache of ``cache_len``: the cache cut
    into shares of whole blocks, as many as leave at most ``programs`` programs (the multiprocessors).
    Why: one program a (slot, kv head) is 32 programs at 16 slots and 2 kv heads (R1-Distill-1.5B) on an
    H100's 132 multiprocessors; shares read in parallel and ``_combine_splits_kernel`` weighs them
    (flash-decoding): a decode step at 16 slots 2.256 -> 2.125 ms with 16 shares (four shares, this rule's:
    2.164 on another H100). At 64 slots (128 programs) five shares made it slower, 2.512 -> 2.633 ms (the
    combine kernel alone 91 µs a step), so a full GPU reads whole caches (bench/RESULTS.md, fourteenth
    session). Fixed by the cache's length, not the cursors, so one captured graph serves a whole generate
    call; shares past a slot's cursor read nothing."""
    blocks = triton.cdiv(cache_len, block)
    splits = min(blocks, max(1, programs // (slots * n_kv)))
    chunk = triton.cdiv(blocks, splits) * block
    return chunk, triton.cdiv(cache_len, chunk)


def shares_bytes(slots: int, n_heads: int, cache_len: int, head_dim: int) -> int:
    """The most memory a step's shares take (their fp32 outputs and (max, sum) pairs, one layer's at a time),
    whatever the GPU: one share a block of the leanest launch option (grpo.memory_plan's bound)."""
    shares = -(-cache_len // min(option[0] for option in launch_options()))
    return slots * n_heads * shares * (head_dim + 2) * 4


def _programs_wanted(device: torch.device) -> int:
    """A program a streaming multiprocessor; under Triton's interpreter as on a GPU of eight, so that the
    CPU's tests of the whole decoder read their caches in shares too."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8


def decode_attention(qkv: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor, valid: Tensor,
                     cursor: Tensor, *, n_heads: int, q_norm: Tensor | None, k_norm: Tensor | None,
                     eps: float, programs: int | None = None) -> Tensor:
    """Attention output [S, n_heads * D] of one decode step for every slot.

    ``qkv`` [S, 1, (n_heads + 2 n_kv) D]: the step's q/k/v projection (q heads, then k, then v, as
    grpo.rollout.static_layers.heads splits it); ``cos``/``sin`` [S, 1, D] at each slot's position; ``k_cache``/``v_cache``
    [S, n_kv, L, D]; ``valid`` [S, L] which cache entries count (the cursor's already set); ``cursor`` [S]
    where each slot's new key and value go (written here, in place). ``q_norm``/``k_norm``: Qwen3's
    per-head RMSNorm weights, or None. ``programs``: how many programs a full cache may spread over
    (``cache_splits``; default one a multiprocessor)."""
    slots, n_kv, cache_len, d = k_cache.shape
    group = n_heads // n_kv
    qkv = qkv.reshape(slots, -1)
    cos, sin = cos.reshape(slots, d), sin.reshape(slots, d)
    out = torch.empty(slots, n_heads * d, dtype=qkv.dtype, device=qkv.device)
    has_norm = q_norm is not None
    dot_fp32 = k_cache.dtype == torch.float32 or _interpreting()
    wanted = programs if programs is not None else _programs_wanted(qkv.device)
    pdl = dependent_launch(qkv.device)

    def launch(option: tuple[int, int, int]) -> None:
        block, stages, warps = option
        chunk, splits = cache_splits(slots, n_kv, cache_len, block, wanted)
        # the shares' unnormalised outputs and (max, sum) pairs; unused (never touched) with one share
        part = torch.empty(slots * n_heads * splits * d if splits > 1 else 1, dtype=torch.float32, device=qkv.device)
        stat = torch.empty(slots * n_heads * splits * 2 if splits > 1 else 1, dtype=torch.float32, device=qkv.device)
        _decode_attention_kernel[(slots, n_kv, splits)](
            qkv, qkv.stride(0), cos, sin, cos.stride(0), q_norm if has_norm else cos, k_norm if has_norm else cos,
            eps, k_cache, v_cache, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), valid.view(torch.uint8),
            valid.stride(0), cursor, out, out.stride(0), part, stat, d ** -0.5,
            HQ=n_heads, HKV=n_kv, G=group, GP=max(16, triton.next_power_of_2(group)), D=d, BLOCK=block,
            CHUNK=chunk, SPLITS=splits, HAS_NORM=has_norm, DOT_FP32=dot_fp32, PDL=bool(pdl), num_stages=stages,
            num_warps=warps, **pdl)
        if splits > 1:
            _combine_splits_kernel[(slots, n_heads)](part, stat, out, out.stride(0), HQ=n_heads, D=d, SPLITS=splits,
                                                     SP=triton.next_power_of_2(splits), PDL=bool(pdl), **pdl)

    # fp32 caches get exact (not TF32) products; so does every dtype under Triton's interpreter, whose bf16
    # tl.dot returns garbage (Triton 3.9: numpy has no bf16), the only place the kernel's code differs
    key = ("decode_attention", qkv.device, k_cache.dtype, n_heads, n_kv, d, has_norm, dot_fp32)
    first_that_loads(key, launch_options(), launch)
    return out
