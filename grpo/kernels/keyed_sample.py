"""A decode step's keyed sample (grpo/rollout/sampling.py) at a plain temperature as one Triton kernel: each
program hashes its part of the vocabulary's Gumbel noise, adds it to the scaled logits and keeps the best
entry; a second pass over the programs' bests picks each row's token.

Why: torch.compile fused the sampler into one reduction kernel that took 78 µs of a 64-row decode step on an
H100 (bench/RESULTS.md, thirteenth session), for 19.5 MB of bf16 logits: a few µs of bytes. Here the hash and the
logs run once an entry with the logits read once, a row's vocabulary spread over ``CHUNKS`` programs.

The same numbers as ``sampling.keyed_scores(...).argmax(-1)`` (the tests compare them): the noise's int32 hash op
for op (``hash_bits``), ``u`` and ``-log(-log u)`` as written there, ``logits / temperature``; ties go to the
smallest id, as ``argmax`` does (a program keeps the first of equal scores, the second pass the first program).
Only temperature sampling: top-k and top-p keep the PyTorch path (``takes``).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from grpo.kernels.decode_attention import dependent_launch, triton
from grpo.rollout.sampling import MIX_M1, MIX_M2, noise_streams

if triton is not None:
    import triton.language as tl

    M1, M2 = tl.constexpr(MIX_M1), tl.constexpr(MIX_M2)  # sampling.hash_bits's multipliers, as constexprs

    @triton.jit
    def _hash_bits(x):
        # sampling.hash_bits: int32 products wrap; a logical shift is the arithmetic one with the sign masked off
        x = x ^ ((x >> 16) & 0xFFFF)
        x = x * M1
        x = x ^ ((x >> 15) & 0x1FFFF)
        x = x * M2
        return x ^ ((x >> 15) & 0x1FFFF)

    @triton.jit
    def _keyed_best_kernel(logits_ptr, stride_row, streams_ptr, offsets_ptr, best_ptr, at_ptr, V, chunk, temperature,
                           BLOCK: tl.constexpr, PDL: tl.constexpr = False):
        row, part = tl.program_id(0), tl.program_id(1)
        if PDL:  # the logits are the kernel before's output (decode_attention.dependent_launch)
            tl.extra.cuda.gdc_wait()
        stream = tl.load(streams_ptr + row)
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        at = tl.zeros([BLOCK], tl.int32)
        start = part * chunk
        end = tl.minimum(start + chunk, V)
        for first in range(start, end, BLOCK):
            v = first + tl.arange(0, BLOCK)
            inside = v < end
            logit = tl.load(logits_ptr + row.to(tl.int64) * stride_row + v, mask=inside, other=0.0).to(tl.float32)
            h = _hash_bits(stream + tl.load(offsets_ptr + v, mask=inside, other=0))
            u = (((h >> 8) & 0xFFFFFF).to(tl.float32) + 0.5) * 5.9604644775390625e-08  # 2**-24
            score = tl.where(inside, logit / temperature + -tl.log(-tl.log(u)), float("-inf"))
            better = score > best  # strictly: a lane keeps its first (smallest) id among equal scores
            best = tl.where(better, score, best)
            at = tl.where(better, v, at)
        top = tl.max(best, 0)
        tl.store(best_ptr + row * tl.num_programs(1) + part, top)
        tl.store(at_ptr + row * tl.num_programs(1) + part, tl.min(tl.where(best == top, at, V), 0))

BLOCK = 1024  # vocabulary entries a program's iteration
CHUNKS = 32  # programs a row: 64 rows x 32 = 2,048 programs, ~15 a multiprocessor of an H100


def takes(temperature: float, top_k: int, top_p: float) -> bool:
    """Whether the kernel draws these samples: temperature sampling without top-k or top-p."""
    return temperature > 0 and top_k == 0 and top_p >= 1.0


def keyed_best(logits: Tensor, streams: Tensor, offsets: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """The kernel: each row's best score and its id in each of ``CHUNKS`` parts of the vocabulary ([B, CHUNKS]
    fp32 and int32), for ``logits`` [B, V], the rows' ``sampling.noise_streams`` [B] and ``offsets``
    (``sampling.vocab_offsets``)."""
    logits = logits.contiguous()  # a no-op for the LM head's output; the kernel reads a row's ids at stride 1
    rows, vocab = logits.shape
    best = torch.empty(rows, CHUNKS, dtype=torch.float32, device=logits.device)
    at = torch.empty(rows, CHUNKS, dtype=torch.int32, device=logits.device)
    pdl = dependent_launch(logits.device)
    _keyed_best_kernel[(rows, CHUNKS)](logits, logits.stride(0), streams, offsets, best, at, vocab,
                                       -(-vocab // CHUNKS), float(temperature), BLOCK=BLOCK, PDL=bool(pdl),
                                       num_warps=4, **pdl)
    return best, at


@torch.library.custom_op("grpo::keyed_best", mutates_args=())
def keyed_best_op(logits: Tensor, streams: Tensor, offsets: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """``keyed_best`` as one opaque call inside the decoder's compiled sampler part, whose inductor kernels make
    the streams before it and pick the rows' tokens after it."""
    return keyed_best(logits, streams, offsets, temperature)


@keyed_best_op.register_fake
def _(logits: Tensor, streams: Tensor, offsets: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    rows = logits.shape[0]
    return logits.new_empty(rows, CHUNKS, dtype=torch.float32), logits.new_empty(rows, CHUNKS, dtype=torch.int32)


def keyed_sample(logits: Tensor, keys: Tensor, positions: Tensor, offsets: Tensor, temperature: float,
                 best: Callable[[Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor]] = keyed_best) -> Tensor:
    """``sampling.sample(logits, keys, positions, temperature=temperature, offsets=offsets)`` [B] (int64): the
    programs' bests (``best``: ``keyed_best``, or ``keyed_best_op`` where compiled), then the first best of each
    row's programs."""
    scores, at = best(logits, noise_streams(keys, positions), offsets, temperature)
    return at.gather(1, scores.argmax(-1, keepdim=True))[:, 0].long()
