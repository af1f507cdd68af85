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
    run_under_interpreter(__file__, passed=15)


def _layer(out_features: int, in_features: int, device: str, dtype: torch.dtype, *, quant_type: str = "nf4",
           nested: bool = True, seed: int = 0, blocksize: int = 64) -> torch.nn.Module:
    """A real bitsandbytes 4-bit linear layer of random weights."""
    weight = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed)) * 0.05
    layer = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=dtype, quant_type=quant_type,
                              compress_statistics=nested)
    layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type=quant_type, compress_statistics=nested,
                                     blocksize=blocksize)
    layer = layer.to(device)
    if layer.weight.quant_state is None:  # moving to a GPU quantises; on a CPU nothing moves
        layer.weight = layer.weight._quantize("cpu")
    return layer


def _x(rows: int, features: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(rows, features, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)


def _close(dtype: torch.dtype) -> dict:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}


@pytest.mark.parametrize("rows,n,k,dtype,quant_type,nested,blocksize", [
    (3, 80, 192, torch.float32, "nf4", True, 64),     # nothing fills a tile: masks on rows and N
    (16, 64, 1024, torch.float32, "nf4", False, 64),  # K split into 16 partial sums; single quantisation
    (5, 96, 320, torch.float32, "fp4", True, 64),     # FP4's code book
    (64, 128, 384, torch.bfloat16, "nf4", True, 64),  # the decoder's rows and dtype
    (7, 64, 512, torch.float32, "nf4", True, 256),    # 128-column tiles, two to an absmax block
])
def test_matmul_matches_dequantise_then_linear(rows, n, k, dtype, quant_type, nested, blocksize):
    from grpo.kernels.matmul_4bit import Weight4bit, matmul_4bit
    from grpo.model.dequant import dequantized

    device = kernel_device()
    layer = _layer(n, k, device, dtype, quant_type=quant_type, nested=nested, blocksize=blocksize)
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


@pytest.mark.parametrize("hidden", [64, 256])  # one K block: SwiGLU in the kernel; four: split K, SwiGLU after
@pytest.mark.parametrize("rows", [6, 40])  # each of matmul_4bit.LAUNCHES' cuts: up to 16 rows, and more
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_matches_the_dense_mlp(dtype, rows, hidden):
    from grpo.kernels.matmul_4bit import Weight4bit, matmul_4bit, reference_mlp, swiglu_4bit
    from grpo.model.dequant import dequantized

    device = kernel_device()
    gate, up, down = (_layer(*shape, device, dtype, seed=seed)
                      for seed, shape in enumerate([(192, hidden), (192, hidden), (hidden, 192)], start=2))
    h = _x(rows, hidden, device, dtype)
    act = swiglu_4bit(h, Weight4bit.of(gate), Weight4bit.of(up))
    dense = [dequantized(m).to(dtype) for m in (gate, up, down)]
    # seeds 2-4: up's rows are not x's (_x's seed is 1), whose products all add up (up ~ 14 on the diagonal
    # scaled the gate's rounding error past the tolerance, bd0e6ab's kernel too); the reference in fp32
    expected = F.silu(F.linear(h.float(), dense[0].float())) * F.linear(h.float(), dense[1].float())
    torch.testing.assert_close(act.float(), expected, **_close(dtype))
    out = matmul_4bit(act, Weight4bit.of(down))
    torch.testing.assert_close(out.float(), F.linear(expected, dense[2].float()), **_close(dtype))
    # the decoder's prompt pass (de-quantised copies) agrees with the same reference
    prefill = reference_mlp(h, *(Weight4bit.of(m) for m in (gate, up, down)))
    torch.testing.assert_close(prefill.float(), F.linear(expected, dense[2].float()), **_close(dtype))
    with pytest.raises(ValueError, match="share their shape"):
        swiglu_4bit(h, Weight4bit.of(gate), Weight4bit.of(_layer(64, hidden, device, dtype)))
    with pytest.raises(ValueError, match="code book"):
        swiglu_4bit(h, Weight4bit.of(gate), Weight4bit.of(_layer(192, hidden, device, dtype, quant_type="fp4")))
    with pytest.raises(ValueError, match="in_features 96 is not a multiple of the block size 64"):
        Weight4bit.of(_layer(64, 96, device, dtype))


def test_a_launch_that_needs_more_shared_memory_than_the_gpu_has_falls_back_and_is_remembered(monkeypatch):
    """On the H100 the fp32 fused kernel at three pipeline stages asked for 240 KiB of shared memory (227 KiB
    there). Triton raises OutOfResources when it loads such a kernel, before any launch; the launcher tries
    fewer stages, then narrower tiles, and remembers what loaded. A CPU has no shared-memory limit, so the
    kernel launch is replaced here by one that refuses what would need more than 100 KiB (an RTX card's 99)."""
    from triton.runtime.errors import OutOfResources

    from grpo.kernels import fit
    from grpo.kernels import matmul_4bit as mk

    tried = []

    def run(x, w, up, block_m, launch, block_n, stages):
        tried.append((block_n, stages))
        need = 2 * stages * block_n * 1024 + 60 * 1024  # a made-up size that grows with tiles and stages
        if need > 99 * 1024:
            raise OutOfResources(need, 99 * 1024, "shared memory")
        return torch.full((x.shape[0], w.out_features), float(block_n * 10 + stages))

    monkeypatch.setattr(mk, "_run", run)
    monkeypatch.setattr(fit, "_CHOSEN", {})
    weight = mk.Weight4bit.of(_layer(64, 128, "cpu", torch.float32))
    x = torch.ones(4, 128)
    assert mk._launch(x, weight, None)[0, 0].item() == 16 * 10 + 1  # (64, 3) ... (32, 1) refused; (16, 1) fits
    assert tried == mk.launch_options(64)
    tried.clear()
    mk._launch(x, weight, None)
    assert tried == [(16, 1)]  # remembered: nothing is compiled again, e.g. inside a CUDA graph capture
    tried.clear()
    mk._launch(torch.ones(64, 128), weight, None)  # another tile of rows: its own search
    assert tried == mk.launch_options(64)

    monkeypatch.setattr(fit, "_CHOSEN", {})
    monkeypatch.setattr(mk, "launch_options", lambda block_n: [(block_n, 3), (block_n, 2)])
    with pytest.raises(OutOfResources):  # nothing fits: the last option's error reaches the caller
        mk._launch(x, weight, None)
