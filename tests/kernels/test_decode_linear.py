"""The split-K decode matmul (grpo/kernels/decode_linear.py) against ``F.linear``: fp32 to IEEE rounding, bf16 to its
rounding; rows and weight rows that do not fill the tiles, K cut into shares that the last program adds, a bias,
bitwise the same result on a second call (the shares' sum has a fixed order) with every tile's count back at zero;
and ``decode_linear``'s choice: the kernel at up to 16 rows where K splits, ``F.linear`` itself otherwise.

On a GPU it runs compiled; on CPU under Triton's interpreter, in a subprocess (tests/kernels/interpreter.py), whose
programs run one after another, so the last share is always the last program (the GPU's concurrent shares are
checked by the static decoder's CUDA-graph tests in tests/rollout/test_static_decode.py and on the device).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.interpreter import kernel_device, run_under_interpreter

pytest.importorskip("triton", reason="triton is not installed")


def test_kernel_under_interpreter():
    run_under_interpreter(__file__, passed=9)


@pytest.mark.parametrize("rows,n,k,bias,dtype", [
    (3, 80, 128, False, torch.float32),    # nothing fills a tile: masks on x's rows and weight rows; 2 shares
    (40, 192, 256, True, torch.float32),   # three weight tiles, four K blocks in shares, a bias
    (100, 64, 512, True, torch.float32),   # two tiles of x's rows, each with its own count
    (64, 128, 192, True, torch.bfloat16),  # the decoder's rows and dtype, three shares of one K block
])
def test_matches_f_linear(rows, n, k, bias, dtype):
    from grpo.kernels.decode_linear import split_k_linear

    device = kernel_device()
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(n, k, generator=g) * 0.05).to(device=device, dtype=dtype)
    b = torch.randn(n, generator=g).to(device=device, dtype=dtype) if bias else None
    x = torch.randn(rows, k, generator=g).to(device=device, dtype=dtype)
    got = split_k_linear(x, w, b)
    assert got.shape == (rows, n) and got.dtype == dtype
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    close = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    torch.testing.assert_close(got.float(), want, **close)
    assert torch.equal(split_k_linear(x, w, b), got)  # the shares added in the same order again


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_down_projection_above_max_rows_leaves_each_parts_sum_for_the_residual_add(dtype):
    """Above ``MAX_ROWS`` rows: part p is x[:, part p] @ W[:, part p]^T in fp32 (K cut in ``PARTS`` by hand), and
    ``static_layers.residual`` adds them as ``x + F.linear``; at up to ``MAX_ROWS`` rows, or a K that does not cut,
    ``decode_linear``'s own output. No kernel above ``MAX_ROWS``: runs on a CPU too (bf16: a GPU's batched matmul
    with fp32 outputs)."""
    from grpo.kernels.decode_linear import MAX_ROWS, PARTS, down_projection
    from grpo.rollout.static_layers import residual

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == torch.bfloat16 and device == "cpu":
        pytest.skip("bf16 partials: cuBLAS's fp32-output batched matmul")
    g = torch.Generator().manual_seed(2)
    h = torch.randn(MAX_ROWS + 1, 1, 512, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(96, 512, generator=g) * 0.05).to(device=device, dtype=dtype)
    parts = down_projection(h, w)
    assert parts.shape == (PARTS, MAX_ROWS + 1, 1, 96) and parts.dtype == torch.float32
    per = 512 // PARTS
    for p in range(PARTS):
        want = F.linear(h[..., p * per:(p + 1) * per].float(), w[:, p * per:(p + 1) * per].float())
        torch.testing.assert_close(parts[p], want, rtol=1e-4, atol=1e-4)
    x = torch.randn(MAX_ROWS + 1, 1, 96, generator=g).to(device=device, dtype=dtype)
    close = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(residual(x, parts), x + F.linear(h, w), **close)
    assert down_projection(h[..., :510], w[:, :510].contiguous()).shape == (MAX_ROWS + 1, 1, 96)  # 510: no 4 parts


def test_counts_are_back_at_zero_after_a_split_call():
    from grpo.kernels import decode_linear as module

    device = kernel_device()
    x, w = torch.randn(16, 512, device=device), torch.randn(128, 512, device=device)
    tiles = 2
    assert module.shares_for(tiles, 512 // 64, module._programs_wanted(torch.device(device)))[0] > 1  # it did split
    module.split_k_linear(x, w)
    assert not module._COUNTS[x.device].any()


def test_decode_linear_takes_the_kernel_where_it_won_and_f_linear_elsewhere(monkeypatch):
    """At 16 rows with K split (the interpreter's 8 "multiprocessors"): the kernel's result; at 17 rows, at a K its
    blocks do not divide, and on as many multiprocessors as tiles (no split, as an RTX 3060 Ti's 38 against q/k/v's
    32 tiles): ``F.linear``'s, bitwise."""
    from grpo.kernels import decode_linear as module

    device = kernel_device()
    w, b = torch.randn(128, 512, device=device), torch.randn(128, device=device)
    x = torch.randn(16, 1, 512, device=device)
    assert module.takes(16, 128, 512, module._programs_wanted(x.device))
    assert torch.equal(module.decode_linear(x, w, b), module.split_k_linear(x[:, 0], w, b)[:, None])
    for rows, width in ((17, 512), (4, 96)):
        x, w = torch.randn(rows, 1, width, device=device), torch.randn(128, width, device=device)
        assert torch.equal(module.decode_linear(x, w, b), F.linear(x, w, b)), (rows, width)
    monkeypatch.setattr(module, "_programs_wanted", lambda device: 2)  # two tiles, two programs: K stays whole
    x, w = torch.randn(16, 1, 512, device=device), torch.randn(128, 512, device=device)
    assert torch.equal(module.decode_linear(x, w, b), F.linear(x, w, b))


def test_shares_leave_one_program_a_multiprocessor_none_empty():
    """By hand, on an H100's 132 multiprocessors at R1-Distill-1.5B's shapes (K blocks of 64)."""
    from grpo.kernels.decode_linear import shares_for

    assert shares_for(32, 24, 132) == (4, 6)     # q/k/v: 2048 rows in 32 tiles, K 1536: 128 programs
    assert shares_for(24, 24, 132) == (5, 5)     # output: 24 tiles, 24 blocks in shares of 5 (the last of 4): 120
    assert shares_for(24, 140, 132) == (5, 28)   # down: K 8960
    assert shares_for(280, 24, 132) == (1, 24)   # more tiles than multiprocessors: no split
    for tiles in range(1, 40):
        for k_blocks in range(1, 30):
            shares, per = shares_for(tiles, k_blocks, 132)
            assert 1 <= shares and (shares - 1) * per < k_blocks <= shares * per  # the last share not empty
            assert shares == 1 or tiles * shares <= 132


def test_partials_stay_within_16_kib_a_program():
    """The bound grpo/memory_plan.py's GENERATION_MARGIN counts them by: a split call's partials are its tiles x
    shares (at most the programs) x one 64-row tile of 16 fp32 columns; by hand, q/k/v at 16 rows on an H100's
    132: 32 tiles x 4 shares x 4 KiB = 512 KiB."""
    from grpo.kernels.decode_linear import partial_bytes

    assert partial_bytes(16, 2048, 1536, 132) == 32 * 4 * 64 * 16 * 4
    assert partial_bytes(16, 1536, 8960, 132) == 24 * 5 * 64 * 16 * 4
    assert partial_bytes(64, 2048, 1536, 132) == 0  # cuBLAS at 64 rows
    assert partial_bytes(16, 17920, 1536, 132) == 0  # 280 tiles: no split, cuBLAS
    assert partial_bytes(16, 2048, 96, 132) == 0  # a width the kernel does not take
    for rows in (1, 16, 33, 64, 100, 256):
        for n, k in ((2048, 1536), (1536, 1536), (1536, 8960), (256, 128)):
            assert partial_bytes(rows, n, k, 192) <= 192 * 64 * 64 * 4
