"""The fused dense gate/up kernel (grpo/kernels/swiglu_dense.py) against ``F.silu(F.linear(x, Wg)) *
F.linear(x, Wu)``: fp32 exactly (IEEE products), bf16 to its rounding; rows and weight rows that do not fill
the tiles, the leading dimensions kept, and a K the kernel's blocks do not divide refused.

On a GPU it runs compiled; on CPU under Triton's interpreter, in a subprocess (tests/kernels/interpreter.py).
The static decoder with it is checked against HF ``generate`` by tests/rollout/test_static_decode.py.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.interpreter import kernel_device, run_under_interpreter

pytest.importorskip("triton", reason="triton is not installed")


def test_kernel_under_interpreter():
    run_under_interpreter(__file__, passed=4)


def _reference(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """In fp32 from the same values, rounded where the decoder rounds (gate and up to x's dtype, then SwiGLU)."""
    gate, up = F.linear(x.float(), gate_up.float()).chunk(2, dim=-1)
    gate, up = gate.to(x.dtype).float(), up.to(x.dtype).float()
    return F.silu(gate).to(x.dtype).float() * up


@pytest.mark.parametrize("rows,n,k,dtype", [
    (3, 80, 128, torch.float32),    # nothing fills a tile: masks on x's rows and on the weight rows
    (40, 192, 256, torch.float32),  # 64-row x tiles, three weight tiles, four K blocks
    (64, 128, 192, torch.bfloat16),  # the decoder's rows and dtype
])
def test_matches_silu_gate_times_up(rows, n, k, dtype):
    from grpo.kernels.swiglu_dense import swiglu_dense

    device = kernel_device()
    g = torch.Generator().manual_seed(0)
    gate_up = (torch.randn(2 * n, k, generator=g) * 0.05).to(device=device, dtype=dtype)
    x = torch.randn(rows, k, generator=g).to(device=device, dtype=dtype)
    got = swiglu_dense(x[:, None], gate_up)  # [B, 1, K] as a decode step passes it
    assert got.shape == (rows, 1, n) and got.dtype == dtype
    close = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(got[:, 0].float(), _reference(x, gate_up), **close)


def test_a_k_its_blocks_do_not_divide_is_refused():
    from grpo.kernels.swiglu_dense import swiglu_dense

    device = kernel_device()
    with pytest.raises(ValueError, match="K 96 must be a multiple of 64"):
        swiglu_dense(torch.zeros(2, 96, device=device), torch.zeros(8, 96, device=device))
