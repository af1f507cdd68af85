"""The fused decode-attention kernel (grpo/kernels/decode_attention.py) against the PyTorch decode step
it replaces (``torch_decode_attention``): the cache it writes and the attention it returns, for slots at
different cursors, cache entries masked out (left pads, a refilled slot's stale row), a query group that
is not a power of two, Qwen3's q/k norms, fp32 and bf16; and the cache read in shares by separate programs
(flash-decoding), whose outputs a second kernel combines.

On a GPU it runs compiled; on CPU under Triton's interpreter, in a subprocess (tests/kernels/interpreter.py).
The whole static decoder with this kernel is checked against HF ``generate`` by
tests/rollout/test_static_decode.py, which also reruns under the interpreter.
"""
from __future__ import annotations

import pytest
import torch

from grpo.rollout.static_layers import torch_decode_attention
from tests.kernels.interpreter import kernel_device, run_under_interpreter

pytest.importorskip("triton", reason="triton is not installed")


def test_kernel_under_interpreter():
    run_under_interpreter(__file__, passed=11)


def _case(device: str, dtype: torch.dtype, n_heads: int, n_kv: int, d: int, norms: bool, seed: int = 0,
          cursors: tuple[int, ...] = (0, 5, 140, 159)):
    gen = torch.Generator().manual_seed(seed)
    slots, cache_len = 4, cursors[-1] + 1  # 160 by default > BLOCK_L: two blocks, the second partial

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    qkv = randn(slots, 1, (n_heads + 2 * n_kv) * d)
    angle = torch.rand(slots, 1, d // 2, generator=gen) * 6
    cos = torch.cat([angle.cos()] * 2, -1).to(device=device, dtype=dtype)
    sin = torch.cat([angle.sin()] * 2, -1).to(device=device, dtype=dtype)
    k_cache, v_cache = randn(slots, n_kv, cache_len, d), randn(slots, n_kv, cache_len, d)
    cursor = torch.tensor(cursors, device=device)
    valid = torch.zeros(slots, cache_len, dtype=torch.bool)
    for s, c in enumerate(cursor.tolist()):
        valid[s, : c + 1] = True
    valid[1, :3] = False  # left pads
    valid[2, 10:40] = False  # a hole
    valid = valid.to(device)
    w1 = (None,) * 5 + ((randn(d) + 1, randn(d) + 1) if norms else (None, None))
    return qkv, cos, sin, k_cache, v_cache, valid, cursor, w1


@pytest.mark.parametrize("dtype,n_heads,n_kv,d,norms", [
    (torch.float32, 2, 1, 64, False),  # the tiny test model's layout
    (torch.float32, 6, 2, 32, True),   # a group of 3, Qwen3's norms
    (torch.bfloat16, 12, 2, 128, False),  # the R1-Distill-1.5B layout
    (torch.bfloat16, 4, 4, 64, True),  # no grouping
])
def test_matches_the_pytorch_decode_step(dtype, n_heads, n_kv, d, norms):
    from grpo.kernels.decode_attention import decode_attention

    device = kernel_device()
    qkv, cos, sin, k_cache, v_cache, valid, cursor, w1 = _case(device, dtype, n_heads, n_kv, d, norms)
    eps = 1e-6
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    ref = torch_decode_attention(qkv, cos, sin, ref_k, ref_v, valid, cursor, k_cache.shape[2], w1,
                                 (n_heads, n_kv, d, eps))
    out = decode_attention(qkv, cos, sin, k_cache, v_cache, valid, cursor, n_heads=n_heads, q_norm=w1[5],
                           k_norm=w1[6], eps=eps)
    assert out.shape == (4, n_heads * d) and out.dtype == dtype
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    # the written keys: the kernel rotates in fp32 and rounds once, the reference rounds each bf16 op
    torch.testing.assert_close(k_cache, ref_k, **tol)
    assert torch.equal(v_cache, ref_v)
    torch.testing.assert_close(out, ref[:, 0], **tol)


@pytest.mark.parametrize("option", [0, -1])
def test_the_leanest_launch_computes_the_same_step(option, monkeypatch):
    """A card with less shared memory a block falls back to fewer pipeline stages and fewer cache positions
    an iteration (grpo/kernels/fit.py; an fp32 cache at the first option asks 144 KiB, an RTX card
    allows 99): the first and the last option both match the PyTorch step (160 cached positions: two
    blocks of 128, five of 32)."""
    from grpo.kernels import decode_attention as da
    from grpo.kernels import fit

    monkeypatch.setattr(fit, "_CHOSEN", {})
    chosen = da.launch_options()[option]
    monkeypatch.setattr(da, "launch_options", lambda: [chosen])
    device = kernel_device()
    qkv, cos, sin, k_cache, v_cache, valid, cursor, w1 = _case(device, torch.float32, 6, 2, 32, True)
    ref = torch_decode_attention(qkv, cos, sin, k_cache.clone(), v_cache.clone(), valid, cursor, k_cache.shape[2],
                                 w1, (6, 2, 32, 1e-6))
    out = da.decode_attention(qkv, cos, sin, k_cache, v_cache, valid, cursor, n_heads=6, q_norm=w1[5],
                              k_norm=w1[6], eps=1e-6)
    torch.testing.assert_close(out, ref[:, 0], atol=1e-5, rtol=1e-5)


def test_cache_splits_by_hand():
    """Shares of whole blocks, as many as leave at most the programs asked, never more shares than blocks."""
    from grpo.kernels.decode_attention import cache_splits

    assert cache_splits(64, 2, 1024, 64, 132) == (1024, 1)  # 128 programs on an H100's 132: whole caches
    assert cache_splits(16, 2, 1024, 64, 132) == (256, 4)   # 32 programs: 4 shares of 4 blocks
    assert cache_splits(16, 2, 1000, 64, 132) == (256, 4)   # 16 blocks, the last partial
    assert cache_splits(1, 1, 200, 64, 132) == (64, 4)      # never more shares than blocks
    assert cache_splits(4, 2, 200, 64, 24) == (128, 2)      # 3 wanted of 4 blocks: shares of 2 blocks, so 2
    assert cache_splits(4, 2, 200, 64, 32) == (64, 4)


@pytest.mark.parametrize("dtype,n_heads,n_kv,d,norms,programs", [
    (torch.float32, 6, 2, 32, True, 32),      # four shares of one block (cache of 400: the last share partial)
    (torch.float32, 2, 1, 64, False, 8),      # two shares of two blocks
    (torch.bfloat16, 12, 2, 128, False, 32),  # the R1-Distill-1.5B layout, four shares
    (torch.bfloat16, 4, 4, 64, True, 10_000),  # more programs asked than blocks: one share a block
])
def test_shares_of_the_cache_match_the_pytorch_decode_step(dtype, n_heads, n_kv, d, norms, programs):
    """Cursors in the first share, mid-share, at a share's first entry and at the cache's end; a slot whose
    first share is all pads (its weight in the combination must be zero, not NaN); the new key and value
    written once, by the share that holds the cursor."""
    from grpo.kernels.decode_attention import decode_attention

    device = kernel_device()
    qkv, cos, sin, k_cache, v_cache, valid, cursor, w1 = _case(device, dtype, n_heads, n_kv, d, norms, seed=1,
                                                               cursors=(3, 200, 256, 399))
    valid[1, :128] = False  # slot 1's first block all pads
    eps = 1e-6
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    ref = torch_decode_attention(qkv, cos, sin, ref_k, ref_v, valid, cursor, k_cache.shape[2], w1,
                                 (n_heads, n_kv, d, eps))
    out = decode_attention(qkv, cos, sin, k_cache, v_cache, valid, cursor, n_heads=n_heads, q_norm=w1[5],
                           k_norm=w1[6], eps=eps, programs=programs)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(k_cache, ref_k, **tol)
    assert torch.equal(v_cache, ref_v)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref[:, 0], **tol)
