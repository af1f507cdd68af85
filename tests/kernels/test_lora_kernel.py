"""The fused Triton LoRA branch against LoRALinear's PyTorch branch (the reference: fp32 products, then a
bf16 add), forward and the gradients of x, the base output, A and B, with batch > 1, shapes that leave
partial blocks in every dimension, a rank below tl.dot's minimum of 16, and row reductions split in parts.

On a GPU it runs compiled; on CPU under Triton's interpreter in a subprocess (tests/kernels/interpreter.py).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from grpo.model.lora import LoRALinear, set_lora_backend
from tests.kernels.interpreter import kernel_device, run_under_interpreter

pytest.importorskip("triton", reason="triton is not installed")


@pytest.fixture(scope="module")
def device():
    return kernel_device()


def test_kernel_under_interpreter():
    run_under_interpreter(__file__, passed=5)


def make_layer(in_features: int, out_features: int, r: int, device: str, seed: int, dropout: float = 0.0):
    gen = torch.Generator().manual_seed(seed)
    base = nn.Linear(in_features, out_features, bias=True)
    with torch.no_grad():
        base.weight.copy_(torch.randn(base.weight.shape, generator=gen) * 0.1)
        base.bias.copy_(torch.randn(base.bias.shape, generator=gen))
    layer = LoRALinear(base.to(device=device, dtype=torch.bfloat16), r=r, alpha=2 * r, dropout=dropout,
                       generator=gen)
    with torch.no_grad():  # a trained-looking B: a zero B would hide every error in A's gradient
        layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=gen) * 0.3)
    return layer


def run(layer: LoRALinear, x0: torch.Tensor, grad_out: torch.Tensor):
    layer.zero_grad(set_to_none=True)
    x = x0.clone().requires_grad_(True)
    out = layer(x)
    out.backward(grad_out)
    return out.detach(), x.grad, layer.lora_A.grad.clone(), layer.lora_B.grad.clone()


def exact_values(layer: LoRALinear, x: torch.Tensor, grad_out: torch.Tensor):
    """fp64 out and dx around the base's own bf16 results (shared by both paths), with the LoRA terms."""
    x_leaf = x.clone().requires_grad_(True)
    layer.disabled = True
    y = layer(x_leaf)
    y.backward(grad_out)
    layer.disabled = False
    a, b = layer.lora_A.detach().double(), layer.lora_B.detach().double()
    out_lora = x.double() @ a.T @ b.T * layer.scaling
    dx_lora = grad_out.double() @ b @ a * layer.scaling
    return y.detach().double() + out_lora, out_lora, x_leaf.grad.double() + dx_lora, dx_lora


@pytest.mark.parametrize("in_features, out_features, r", [(88, 70, 16), (64, 136, 8)])
def test_forward_and_backward_match_torch_branch(device, monkeypatch, in_features, out_features, r):
    import grpo.kernels.lora as kernels

    monkeypatch.setattr(kernels, "SPLIT_ROWS", 64)  # 150 rows: three parts in dA and dB
    layer = make_layer(in_features, out_features, r, device, seed=r)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 50, in_features, generator=gen).to(device=device, dtype=torch.bfloat16)
    grad_out = torch.randn(3, 50, out_features, generator=gen).to(device=device, dtype=torch.bfloat16)

    ref = run(layer, x, grad_out)
    set_lora_backend(layer, "triton")
    fused = run(layer, x, grad_out)
    assert fused[0].dtype == ref[0].dtype == torch.bfloat16
    # out and dx are bf16, so both paths are judged against the exact (fp64) value: torch rounds the LoRA
    # term to bf16 and then the sum; the kernel sums in fp32 and rounds once (on a GPU to nearest, under
    # the interpreter by truncation: up to one bf16 step, 2^-7 relative, hence the kernel's wider bound)
    out_exact, out_lora, dx_exact, dx_lora = exact_values(layer, x, grad_out)
    for exact, lora, got, want in ((out_exact, out_lora, fused[0], ref[0]), (dx_exact, dx_lora, fused[1], ref[1])):
        size = exact.abs() + lora.abs()
        assert ((want.double() - exact).abs() <= 2**-8 * size + 1e-6).all()  # the bound is right for torch
        assert ((got.double() - exact).abs() <= 2**-7 * size + 1e-6).all()
    # dA and dB: fp32 end to end in both, only summation order differs
    torch.testing.assert_close(fused[2], ref[2], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fused[3], ref[3], rtol=1e-4, atol=1e-4)
    assert ref[2].abs().max() > 1e-2 and ref[3].abs().max() > 1e-2  # the gradients are not trivially zero


def test_against_the_formula_by_hand(device):
    """Independent of LoRALinear: out = y + s·x·Aᵀ·Bᵀ and its four gradients written out in fp64."""
    from grpo.kernels.lora import fused_lora

    gen = torch.Generator().manual_seed(7)
    n, k, m, r, s = 70, 40, 24, 4, 0.5
    x = torch.randn(n, k, generator=gen, dtype=torch.float64)
    y = torch.randn(n, m, generator=gen, dtype=torch.float64)
    a = torch.randn(r, k, generator=gen, dtype=torch.float64)
    b = torch.randn(m, r, generator=gen, dtype=torch.float64)
    g = torch.randn(n, m, generator=gen, dtype=torch.float64)
    leaves = [t.float().to(device).requires_grad_(True) for t in (x, y, a, b)]
    out = fused_lora(*leaves, s)
    out.backward(g.float().to(device))
    xa = x @ a.T
    expected = {"out": y + s * xa @ b.T, "dx": s * g @ b @ a, "dy": g, "dA": s * (g @ b).T @ x, "dB": s * g.T @ xa}
    got = {"out": out, "dx": leaves[0].grad, "dy": leaves[1].grad, "dA": leaves[2].grad, "dB": leaves[3].grad}
    for key, value in expected.items():
        torch.testing.assert_close(got[key].detach().double().cpu(), value, rtol=1e-4, atol=1e-4, msg=key)


def test_dropout_and_disabled_use_the_torch_branch(device):
    """The kernel has no dropout: such a layer must take the PyTorch path (same RNG draws as torch)."""
    layer = make_layer(32, 16, 4, device, seed=3, dropout=0.5).train()
    x = torch.randn(2, 8, 32).to(device=device, dtype=torch.bfloat16)
    torch.manual_seed(0)
    ref = layer(x)
    set_lora_backend(layer, "triton")
    torch.manual_seed(0)
    assert torch.equal(layer(x), ref)
    layer.disabled = True
    assert torch.equal(layer(x), layer.base(x))


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="LoRA backend"):
        set_lora_backend(nn.Sequential(), "cuda")
