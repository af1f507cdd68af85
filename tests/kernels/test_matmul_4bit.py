"""The 4-bit decode matmuls (grpo/kernels/matmul_4bit.py) against bitsandbytes' own de-quantisation
followed by a dense matmul, the path the static decoder's dense copy takes: NF4 with and without double
quantisation, FP4, shapes that do not fill the tiles, a K long enough to be split into partial sums, the
fused SwiGLU, fp32 and bf16.

On a GPU it runs compiled; on CPU under Triton's interpreter, in a subprocess (tests/kernels/interpreter.py).
The whole static decoder with these kernels is checked against HF ``generate`` by
tests/rollout/test_static_decode.py under the interpreter.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.interpreter import kernel_device, run_under_interpreter

pytest.importorskip("triton", reason="triton is not installed")
bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")


def test_kernels_under_interpreter():
    run_under_interpreter(__file__, passed=7)


def _layer(out_features: int, in_features: int, device: str, dtype: torch.dtype, *, quant_type: str = "nf4",
           nested: bool = True, seed: int = 0) -> torch.nn.Module:
    """A real bitsandbytes 4-bit linear layer of random weights."""
    weight = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed)) * 0.05
    layer = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=dtype, quant_type=quant_type,
                              compress_statistics=nested)
    layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type=quant_type, compress_statistics=nested)
    layer = layer.to(device)
    if layer.weight.quant_state is None:  # moving to a GPU quantises; on a CPU nothing moves
        layer.weight = layer.weight._quantize("cpu")
    return layer


def _x(rows: int, features: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(rows, features, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)


def _close(dtype: torch.dtype) -> dict:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}


@pytest.mark.parametrize("rows,n,k,dtype,quant_type,nested", [
    (3, 80, 192, torch.float32, "nf4", True),    # nothing fills a tile: masks on rows, N and K (192 = 1.5 tiles)
    (16, 64, 1024, torch.float32, "nf4", False),  # K split into 8 partial sums; single quantisation
    (5, 96, 320, torch.float32, "fp4", True),    # FP4's code book
    (64, 128, 384, torch.bfloat16, "nf4", True),  # the decoder's rows and dtype
])
def test_matmul_matches_dequantise_then_linear(rows, n, k, dtype, quant_type, nested):
    from grpo.kernels.matmul_4bit import Weight4bit, matmul_4bit
    from grpo.model.dequant import dequantized

    device = kernel_device()
    layer = _layer(n, k, device, dtype, quant_type=quant_type, nested=nested)
    x = _x(rows, k, device, dtype)
    weight = Weight4bit.of(layer)
    assert torch.equal(weight.dense(dtype), dequantized(layer).to(dtype))
    got = matmul_4bit(x[None], weight)[0]  # leading dims are kept
    assert got.shape == (rows, n) and got.dtype == dtype
    torch.testing.assert_close(got, F.linear(x, dequantized(layer).to(dtype)), **_close(dtype))


def test_split_k_sums_in_a_fixed_order():
    from grpo.kernels.matmul_4bit import Weight4bit, matmul_4bit

    device = kernel_device()
    weight = Weight4bit.of(_layer(64, 2048, device, torch.float32))
    x = _x(8, 2048, device, torch.float32)
    assert torch.equal(matmul_4bit(x, weight), matmul_4bit(x, weight))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_matches_the_dense_mlp(dtype):
    from grpo.kernels.matmul_4bit import Weight4bit, matmul_4bit, reference_mlp, swiglu_4bit
    from grpo.model.dequant import dequantized

    device = kernel_device()
    gate, up, down = (_layer(*shape, device, dtype, seed=seed)
                      for seed, shape in enumerate([(192, 64), (192, 64), (64, 192)]))
    h = _x(6, 64, device, dtype)
    act = swiglu_4bit(h, Weight4bit.of(gate), Weight4bit.of(up))
    dense = [dequantized(m).to(dtype) for m in (gate, up, down)]
    expected = F.silu(F.linear(h, dense[0])) * F.linear(h, dense[1])
    torch.testing.assert_close(act, expected, **_close(dtype))
    out = matmul_4bit(act, Weight4bit.of(down))
    torch.testing.assert_close(out, reference_mlp(h, *(Weight4bit.of(m) for m in (gate, up, down))), **_close(dtype))
    with pytest.raises(ValueError, match="share their shape"):
        swiglu_4bit(h, Weight4bit.of(gate), Weight4bit.of(_layer(64, 64, device, dtype)))
    with pytest.raises(ValueError, match="in_features 96 is not a multiple of the block size 64"):
        Weight4bit.of(_layer(64, 96, device, dtype))
