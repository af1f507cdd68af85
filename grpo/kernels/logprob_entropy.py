"""Fused per-token log-prob and entropy (Triton), forward and backward, from hidden states and lm_head.

The PyTorch reference is grpo.algo.logprobs (``chunked_token_logprobs_and_entropy``); this computes the
same function with the same precision: each chunk's logits come from one matmul in the weight's dtype
(cuBLAS), exactly as the reference computes them before its fp32 upcast. Then one Triton pass per row
reads those logits once and returns logsumexp, the target's log-prob and the entropy (an online
logsumexp that also carries sum(e^z z)); the reference instead makes an fp32 copy of the chunk, its
softmax and a product with it, several [chunk, V] fp32 buffers. In backward one Triton pass turns the
recomputed logits into dL/dz in place (still the weight's dtype, as the reference casts it before its
matmul), so a chunk costs one [chunk, V] buffer in bf16 instead of several in fp32.

Only the hidden states get a gradient: the LM head is frozen in LoRA training. A trainable head (or an
fp64/fp32 weight used by gradchecks) goes to the reference implementation (``fused_supported``).
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without triton: the PyTorch reference is used
    triton = None

BLOCK_V = 2048


def fused_supported(hidden: Tensor, weight: Tensor) -> bool:
    """Whether the Triton path can run these inputs (else use grpo.algo.logprobs)."""
    on_device = hidden.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"  # the interpreter runs on CPU
    return (triton is not None and on_device and weight.dtype in (torch.bfloat16, torch.float16)
            and not weight.requires_grad)


if triton is not None:

    @triton.jit
    def _stats_kernel(logits_ptr, targets_ptr, lse_ptr, logprob_ptr, entropy_ptr, stride, V, inv_t,
                      BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = logits_ptr + row.to(tl.int64) * stride
        m = tl.full([BLOCK], float("-inf"), tl.float32)  # per-lane running max
        s = tl.zeros([BLOCK], tl.float32)  # sum e^(z - m)
        w = tl.zeros([BLOCK], tl.float32)  # sum e^(z - m) * z
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            z = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32) * inv_t
            m_new = tl.maximum(m, z)
            scale = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
            e = tl.where(cols < V, tl.exp(z - m_new), 0.0)
            s = s * scale + e
            w = w * scale + e * tl.where(cols < V, z, 0.0)
            m = m_new
        m_row = tl.max(m, 0)
        lane = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_row))
        s_row = tl.sum(s * lane, 0)
        w_row = tl.sum(w * lane, 0)
        lse = m_row + tl.log(s_row)
        target = tl.load(targets_ptr + row)
        z_y = tl.load(base + target).to(tl.float32) * inv_t
        tl.store(lse_ptr + row, lse)
        tl.store(logprob_ptr + row, z_y - lse)
        tl.store(entropy_ptr + row, lse - w_row / s_row)

    @triton.jit
    def _grad_kernel(logits_ptr, targets_ptr, lse_ptr, entropy_ptr, g_lp_ptr, g_ent_ptr, stride, V, inv_t,
                     BLOCK: tl.constexpr):
        """In place: z -> dL/dz = inv_t * (g_lp * (1[i=y] - p_i) - g_H * p_i * (log p_i + H))."""
        row = tl.program_id(0)
        base = logits_ptr + row.to(tl.int64) * stride
        lse = tl.load(lse_ptr + row)
        ent = tl.load(entropy_ptr + row)
        g_lp = tl.load(g_lp_ptr + row)
        g_h = tl.load(g_ent_ptr + row)
        target = tl.load(targets_ptr + row)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            valid = cols < V
            log_p = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32) * inv_t - lse
            p = tl.exp(log_p)
            grad = -p * (g_lp + g_h * (log_p + ent)) + tl.where(cols == target, g_lp, 0.0)
            tl.store(base + cols, (grad * inv_t).to(logits_ptr.dtype.element_ty), mask=valid)


def _chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.nn.functional.linear(hidden.to(weight.dtype), weight, bias).contiguous()


class _FusedLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, chunk_size: int,
                inv_temperature: float):
        n, v = hidden.shape[0], weight.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        logprobs, entropy = torch.empty_like(lse), torch.empty_like(lse)
        for start in range(0, n, chunk_size):
            sl = slice(start, start + chunk_size)
            z = _chunk_logits(hidden[sl], weight, bias)
            _stats_kernel[(z.shape[0],)](z, targets[sl], lse[sl], logprobs[sl], entropy[sl], z.stride(0), v,
                                         inv_temperature, BLOCK=BLOCK_V)
            del z
        ctx.set_materialize_grads(False)
        ctx.chunk_size, ctx.inv_temperature = chunk_size, inv_temperature
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs: Tensor | None, grad_entropy: Tensor | None):
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        if grad_logprobs is None and grad_entropy is None or not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        n, v = hidden.shape[0], weight.shape[0]
        zeros = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        g_lp = zeros if grad_logprobs is None else grad_logprobs.float().contiguous()
        g_ent = zeros if grad_entropy is None else grad_entropy.float().contiguous()
        grad_hidden = torch.empty_like(hidden)
        for start in range(0, n, ctx.chunk_size):
            sl = slice(start, start + ctx.chunk_size)
            z = _chunk_logits(hidden[sl], weight, bias)
            _grad_kernel[(z.shape[0],)](z, targets[sl], lse[sl], entropy[sl], g_lp[sl], g_ent[sl], z.stride(0), v,
                                        ctx.inv_temperature, BLOCK=BLOCK_V)
            grad_hidden[sl] = (z @ weight).to(hidden.dtype)
            del z
        return grad_hidden, None, None, None, None, None


def fused_token_logprobs_and_entropy(
    hidden: Tensor,
    lm_head_weight: Tensor,
    target_ids: Tensor,
    *,
    chunk_size: int = 4096,
    temperature: float = 1.0,
    lm_head_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Same contract as grpo.algo.logprobs.chunked_token_logprobs_and_entropy (entropy always computed):
    hidden [B, T, H], target_ids [B, T] -> (logprobs [B, T], entropy [B, T]) fp32, differentiable in
    ``hidden``. ``chunk_size`` tokens of logits (in the weight's dtype) exist at a time."""
    if not fused_supported(hidden, lm_head_weight):
        raise ValueError("fused log-prob kernel needs triton, CUDA (or TRITON_INTERPRET=1), a bf16/fp16 "
                         "frozen lm_head; use grpo.algo.logprobs otherwise")
    if hidden.shape[:-1] != target_ids.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} does not match target_ids {tuple(target_ids.shape)}")
    shape = target_ids.shape
    logprobs, entropy = _FusedLogprobEntropy.apply(
        hidden.reshape(-1, hidden.shape[-1]), lm_head_weight, lm_head_bias, target_ids.reshape(-1).contiguous(),
        chunk_size, 1.0 / temperature)
    return logprobs.view(shape), entropy.view(shape)
