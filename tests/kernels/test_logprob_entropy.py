"""The fused Triton log-prob/entropy kernel against the obvious PyTorch version, forward and backward,
with batch > 1, masked positions, a temperature and a vocabulary spanning several kernel blocks.

On a GPU it runs compiled; on CPU under Triton's interpreter, in a subprocess (tests/kernels/interpreter.py).
"""
from __future__ import annotations

import pytest
import torch

from grpo.algo.logprobs import naive_token_logprobs_and_entropy
from tests.kernels.interpreter import kernel_device, run_under_interpreter

pytest.importorskip("triton", reason="triton is not installed")


@pytest.fixture(scope="module")
def kernel():
    import grpo.kernels.logprob_entropy as module

    return module, kernel_device()


def test_kernel_under_interpreter():
    run_under_interpreter(__file__, passed=3)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_forward_and_backward_match_reference(kernel, temperature):
    module, device = kernel
    gen = torch.Generator().manual_seed(int(temperature * 10))
    b, t, h = 3, 5, 32
    v = module.BLOCK_V + 300  # two blocks, the second partial
    hidden = (torch.randn(b, t, h, generator=gen) * 2).to(device=device, dtype=torch.bfloat16)
    weight = torch.randn(v, h, generator=gen).to(device=device, dtype=torch.bfloat16)
    targets = torch.randint(0, v, (b, t), generator=gen).to(device)
    mask = (torch.rand(b, t, generator=gen) > 0.3).float().to(device)
    adv = torch.randn(b, 1, generator=gen).to(device)

    def loss_of(fn, **kw):
        x = hidden.clone().requires_grad_(True)
        lp, ent = fn(x, weight, targets, temperature=temperature, **kw)
        loss = ((lp * adv - 0.1 * ent) * mask).sum() / mask.sum()
        loss.backward()
        return lp.detach(), ent.detach(), x.grad

    lp, ent, grad = loss_of(module.fused_token_logprobs_and_entropy, chunk_size=4)  # chunks cross rows
    ref_lp, ref_ent, ref_grad = loss_of(naive_token_logprobs_and_entropy)
    torch.testing.assert_close(lp, ref_lp, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(ent, ref_ent, atol=2e-4, rtol=1e-4)
    assert (grad[mask == 0] == 0).all() and grad.abs().sum() > 0
    # both cast dL/dz to bf16 before the matmul with the weight: bf16-level agreement
    rel = (grad.float() - ref_grad.float()).norm() / ref_grad.float().norm()
    assert rel < 1e-2, rel


def test_refuses_trainable_head(kernel):
    module, device = kernel
    weight = torch.randn(8, 4, dtype=torch.bfloat16, device=device, requires_grad=True)
    with pytest.raises(ValueError, match="frozen lm_head"):
        module.fused_token_logprobs_and_entropy(torch.randn(1, 2, 4, device=device), weight,
                                                torch.zeros(1, 2, dtype=torch.long, device=device))
