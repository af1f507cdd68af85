"""Chunked log-probs and entropies equal the full-logit versions: values and gradients."""
from __future__ import annotations

import pytest
import torch

from grpo.algo.logprobs import chunked_token_logprobs_and_entropy, naive_token_logprobs_and_entropy

B, T, H, V = 3, 7, 16, 50  # B·T = 21 tokens: chunk sizes 4, 5, 8 leave a ragged last chunk


def inputs(dtype=torch.float32, seed: int = 0, bias: bool = False, shape=(B, T, H, V)):
    b_, t_, h_, v_ = shape
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b_, t_, h_, generator=g).to(dtype)
    weight = (torch.randn(v_, h_, generator=g) / h_**0.5 * 3).to(dtype)  # peaked and flat rows alike
    b = torch.randn(v_, generator=g).to(dtype) if bias else None
    targets = torch.randint(0, v_, (b_, t_), generator=g)
    upstream = torch.randn(2, b_, t_, generator=g)  # fixed cotangents for both outputs
    return hidden, weight, b, targets, upstream


def forward_backward(fn, hidden, weight, bias, targets, upstream, **kw):
    """Values and gradients w.r.t. every input that requires grad, under L = <g1, lp> + <g2, H>."""
    leaves = [x for x in (hidden, weight, bias) if x is not None]
    leaves = [x.detach().clone().requires_grad_(x.requires_grad) for x in leaves]
    h, w, *rest = leaves
    lp, ent = fn(h, w, targets, lm_head_bias=rest[0] if rest else None, **kw)
    (upstream[0] * lp).sum().add((upstream[1] * ent).sum()).backward()
    return lp.detach(), ent.detach(), [x.grad for x in leaves if x.requires_grad]


@pytest.mark.parametrize("chunk_size", [1, 4, 5, 8, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fp32_matches_naive(chunk_size, temperature):
    hidden, weight, bias, targets, up = inputs(bias=True)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    bias.requires_grad_(True)
    want = forward_backward(naive_token_logprobs_and_entropy, hidden, weight, bias, targets, up,
                            temperature=temperature)
    got = forward_backward(chunked_token_logprobs_and_entropy, hidden, weight, bias, targets, up,
                           temperature=temperature, chunk_size=chunk_size)
    assert got[0].dtype == got[1].dtype == torch.float32
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)  # fp32 sums over V in another order


def test_bf16_matches_naive_and_returns_fp32():
    hidden, weight, _, targets, up = inputs(torch.bfloat16)
    hidden.requires_grad_(True)  # frozen bf16 head, as with a LoRA-trained model
    want = forward_backward(naive_token_logprobs_and_entropy, hidden, weight, None, targets, up, temperature=0.6)
    got = forward_backward(chunked_token_logprobs_and_entropy, hidden, weight, None, targets, up,
                           temperature=0.6, chunk_size=5)
    assert got[0].dtype == torch.float32 and got[2][0].dtype == torch.bfloat16
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)  # same bf16 logits, fp32 after
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2][0], want[2][0], rtol=2e-2, atol=2e-2)  # bf16 gradient rounding
    # and close to the fp32 computation of the same numbers
    exact = forward_backward(naive_token_logprobs_and_entropy, hidden.float(), weight.float(), None, targets,
                             up, temperature=0.6)
    torch.testing.assert_close(got[0], exact[0], rtol=0.05, atol=0.1)
    torch.testing.assert_close(got[1], exact[1], rtol=0.05, atol=0.1)


@pytest.mark.parametrize("outputs", ["both", "logprobs", "entropy"])
def test_gradcheck_fp64(outputs):
    hidden, weight, bias, targets, _ = inputs(torch.float64, bias=True, shape=(2, 3, 4, 9))  # 6 tokens
    args = tuple(x.requires_grad_(True) for x in (hidden, weight, bias))

    def f(h, w, b):
        lp, ent = chunked_token_logprobs_and_entropy(h, w, targets, lm_head_bias=b, chunk_size=4,
                                                     temperature=0.8, compute_entropy=outputs != "logprobs")
        return {"both": (lp, ent), "logprobs": lp, "entropy": ent}[outputs]

    assert torch.autograd.gradcheck(f, args)


def test_frozen_head_gets_no_gradient_and_entropy_optional():
    hidden, weight, _, targets, _ = inputs()
    hidden = hidden[:, 1:]  # a non-contiguous slice, as the trainer passes
    targets = targets[:, 1:]
    hidden.requires_grad_(True)
    lp, ent = chunked_token_logprobs_and_entropy(hidden, weight, targets, chunk_size=4, compute_entropy=False)
    assert ent is None and lp.shape == (B, T - 1)
    lp.sum().backward()
    assert weight.grad is None
    ref_h = hidden.detach().clone().requires_grad_(True)
    naive_token_logprobs_and_entropy(ref_h, weight, targets, compute_entropy=False)[0].sum().backward()
    torch.testing.assert_close(hidden.grad, ref_h.grad)


def test_no_grad_scoring():
    hidden, weight, _, targets, _ = inputs()
    with torch.no_grad():
        lp, ent = chunked_token_logprobs_and_entropy(hidden, weight, targets, chunk_size=6)
    want_lp, want_ent = naive_token_logprobs_and_entropy(hidden, weight, targets)
    torch.testing.assert_close(lp, want_lp)
    torch.testing.assert_close(ent, want_ent)
    assert (lp <= 0).all() and (ent >= 0).all() and (ent <= torch.log(torch.tensor(V)) + 1e-5).all()


def test_bad_arguments():
    hidden, weight, _, targets, _ = inputs()
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_token_logprobs_and_entropy(hidden, weight, targets, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        chunked_token_logprobs_and_entropy(hidden, weight, targets, temperature=0.0)
    with pytest.raises(ValueError, match="does not match"):
        chunked_token_logprobs_and_entropy(hidden, weight, targets[:, 1:])
