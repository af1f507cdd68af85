"""Per-token log-probabilities and entropies from final hidden states, in chunks of tokens.

A full-vocabulary fp32 logit tensor for a training micro-batch is the largest thing in a GRPO step
(16 × 640 tokens × 151,936 vocab × 4 bytes ≈ 6 GiB for Qwen2), and autograd would keep it (plus the
softmax) alive until backward. Here the LM head runs on ``chunk_size`` tokens at a time and a custom
autograd function saves only the inputs and one logsumexp per token; backward recomputes each
chunk's logits. Peak extra memory is a few ``chunk_size × V`` fp32 buffers, forward and backward.

Precision matches the model's own head followed by TRL's upcast: the matmul runs in the weight's
dtype, its logits are upcast to fp32 (fp64 for fp64 weights, so gradcheck can run) before dividing
by the sampling temperature. Every target id must be a valid vocabulary index; positions outside the
response carry any id and are masked later by the loss.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, inv_temperature: float) -> Tensor:
    """LM head on [n, H] states: [n, V] logits in at least fp32, divided by the temperature."""
    out_dtype = torch.promote_types(weight.dtype, torch.float32)
    logits = F.linear(hidden.to(weight.dtype), weight, bias).to(out_dtype)
    if inv_temperature != 1.0:
        logits.mul_(inv_temperature)
    return logits


class _ChunkedLogprobEntropy(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], bias [V] | None, targets [N]) -> (logprob [N], entropy [N] | None).

    With z the tempered logits, p = softmax(z), lse = logsumexp(z):
        logprob = z_y - lse               d logprob / dz_i = 1[i = y] - p_i
        entropy = lse - sum_i p_i z_i     d entropy / dz_i = -p_i (log p_i + entropy)
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                chunk_size: int, inv_temperature: float, compute_entropy: bool):
        n = hidden.shape[0]
        out_dtype = torch.promote_types(weight.dtype, torch.float32)
        logprobs = torch.empty(n, dtype=out_dtype, device=hidden.device)
        lse = torch.empty_like(logprobs)
        entropy = torch.empty_like(logprobs) if compute_entropy else None
        for start in range(0, n, chunk_size):
            sl = slice(start, start + chunk_size)
            z = _logits(hidden[sl], weight, bias, inv_temperature)
            chunk_lse = torch.logsumexp(z, dim=-1)
            lse[sl] = chunk_lse
            logprobs[sl] = z.gather(1, targets[sl, None]).squeeze(1) - chunk_lse
            if entropy is not None:
                # sum_i p_i z_i as a row-wise dot product, without a second [n, V] temporary
                p = torch.exp(z - chunk_lse[:, None])
                entropy[sl] = chunk_lse - torch.einsum("nv,nv->n", p, z)
                del p
            del z
        ctx.set_materialize_grads(False)  # an unused output arrives as None: skip its gradient
        ctx.chunk_size, ctx.inv_temperature = chunk_size, inv_temperature
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs: Tensor | None, grad_entropy: Tensor | None):
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        # weight/bias grads accumulate in fp32 across chunks, cast once at the end
        grad_weight = torch.zeros_like(weight, dtype=lse.dtype) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=lse.dtype) if need_bias else None
        if grad_logprobs is None and grad_entropy is None:
            return grad_hidden, grad_weight, grad_bias, None, None, None, None
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            sl = slice(start, start + ctx.chunk_size)
            h = hidden[sl]
            log_p = _logits(h, weight, bias, ctx.inv_temperature).sub_(lse[sl, None])
            p = log_p.exp()
            # dL/dz = g_lp * 1[i = y] - p_i * (g_lp + g_H * (log p_i + H)), built in place in log_p
            if grad_entropy is not None:
                grad_z = log_p.add_(entropy[sl, None]).mul_(grad_entropy[sl, None])
                if grad_logprobs is not None:
                    grad_z.add_(grad_logprobs[sl, None])
                grad_z.mul_(p).neg_()
            else:
                grad_z = p.mul_(grad_logprobs[sl, None]).neg_()
            del p, log_p
            if grad_logprobs is not None:
                grad_z.scatter_add_(1, targets[sl, None], grad_logprobs[sl, None])
            if ctx.inv_temperature != 1.0:
                grad_z.mul_(ctx.inv_temperature)  # z = logits / T
            grad_z_w = grad_z.to(weight.dtype)
            if need_hidden:
                grad_hidden[sl] = (grad_z_w @ weight).to(hidden.dtype)
            if need_weight:
                grad_weight.addmm_(grad_z.t(), h.to(grad_weight.dtype))
            if need_bias:
                grad_bias.add_(grad_z.sum(0))
            del grad_z, grad_z_w
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def chunked_token_logprobs_and_entropy(
    hidden: Tensor,
    lm_head_weight: Tensor,
    target_ids: Tensor,
    *,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    compute_entropy: bool = True,
    lm_head_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each target token and the entropy of each next-token distribution.

    hidden [B, T, H] (the states that predict target_ids [B, T]); lm_head_weight [V, H];
    ``chunk_size`` counts tokens of the flattened B·T, so chunks may cross sequence boundaries.
    Returns (logprobs [B, T], entropy [B, T] or None), fp32. Differentiable w.r.t. hidden, and
    w.r.t. the weight and bias when they require grad (a frozen head costs nothing extra).
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if hidden.shape[:-1] != target_ids.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} does not match target_ids {tuple(target_ids.shape)}")
    batch_shape = target_ids.shape
    logprobs, entropy = _ChunkedLogprobEntropy.apply(
        hidden.reshape(-1, hidden.shape[-1]), lm_head_weight, lm_head_bias, target_ids.reshape(-1),
        chunk_size, 1.0 / temperature, compute_entropy,
    )
    return logprobs.view(batch_shape), None if entropy is None else entropy.view(batch_shape)


def naive_token_logprobs_and_entropy(
    hidden: Tensor,
    lm_head_weight: Tensor,
    target_ids: Tensor,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = True,
    lm_head_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The obvious version: full [B, T, V] logits, log_softmax, gather; plain autograd.

    Same inputs, outputs and precision as ``chunked_token_logprobs_and_entropy``; the reference it
    is tested against, and a fallback wherever memory is no concern.
    """
    logits = _logits(hidden, lm_head_weight, lm_head_bias, 1.0 / temperature)
    log_p = logits.log_softmax(dim=-1)
    logprobs = log_p.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1) if compute_entropy else None
    return logprobs, entropy
