"""A static decode step's edges, around the layers (grpo/rollout/static_layers.py): the embedding and RoPE tables
in, the last residual add, final norm, LM head and keyed sample out, and the slots' bookkeeping after it. Plain
functions the decoder (grpo/rollout/static_decode.py) compiles, so that each is a few kernels inside the captured
step (in eager they were ~40 one-off kernels a step)."""
from __future__ import annotations

import torch
from torch import Tensor

from grpo.kernels.keyed_sample import keyed_best_op, keyed_sample
from grpo.kernels.keyed_sample import takes as keyed_takes
from grpo.rollout.sampling import sample
from grpo.rollout.static_layers import residual


def step_inputs(body: torch.nn.Module, ids: Tensor, positions: Tensor, dtype: torch.dtype
                ) -> tuple[Tensor, Tensor, Tensor]:
    """The embedded ``ids`` [B, T] and the RoPE tables at ``positions`` [B, T]."""
    x = body.embed_tokens(ids).to(dtype)
    cos, sin = body.rotary_emb(x, positions)
    return x, cos, sin


def next_token(norm: torch.nn.Module, lm_head: torch.nn.Module, x: Tensor, delta: Tensor, keys: Tensor,
               positions: Tensor, offsets: Tensor, *, temperature: float, top_k: int, top_p: float,
               kernel: bool = False) -> Tensor:
    """The last layer's residual add (``residual(x, delta)`` [B, T, H], last position), the final norm, the LM head
    and the keyed sampler (grpo.rollout.sampling; with ``kernel``, at a plain temperature, its Triton kernel:
    the same ids)."""
    logits = lm_head(norm(residual(x, delta)[:, -1]))
    if kernel and keyed_takes(temperature, top_k, top_p):
        return keyed_sample(logits, keys, positions, offsets, temperature, keyed_best_op)
    return sample(logits, keys, positions, temperature=temperature, top_k=top_k, top_p=top_p, offsets=offsets)


def stops(token: Tensor, stop_ids: Tensor) -> Tensor:
    """Which of ``token`` [B] are stop ids."""
    return (token[:, None] == stop_ids[None]).any(-1)


def advance(sampled: Tensor, finished: Tensor, out: Tensor, count: Tensor, limit: Tensor, tokens: Tensor,
            cursor: Tensor, positions: Tensor, stop_ids: Tensor, pad_id: Tensor) -> None:
    """A decode step's bookkeeping, in place: a live slot keeps its ``sampled`` token and moves on, an
    ended one writes its pad into ``out``'s spare last column and stays put."""
    token = torch.where(finished, pad_id, sampled)
    live = (~finished).long()
    column = torch.where(finished, out.shape[1] - 1, count)
    out.scatter_(1, column[:, None], token[:, None])
    count += live
    finished |= stops(token, stop_ids) | (count >= limit)
    tokens.copy_(token)
    cursor += live  # an ended slot stays put: its writes never leave the cache
    positions += live
