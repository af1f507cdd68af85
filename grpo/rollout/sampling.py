"""Next-token sampling keyed by counters, so that a sample never depends on the batch it is drawn in.

Why: a request may be cut into batches differently from one run to the next (an out-of-memory retry
halves the batch; continuous batching puts a row into whichever slot frees first). With torch's
generators a row's draw depends on how many numbers the rows and steps before it consumed, so any
re-split changes the samples. Here every random number is a pure function of

    (seed, prompt index in the request, sample index, position in the response, vocabulary index),

as vLLM's per-request seeds and counter-based generators (Philox, threefry) make it: an integer hash
of those counters gives a uniform ``u``, ``G = -log(-log u)`` is Gumbel noise, and the next token is

    argmax(processed logits + G)

which is an exact sample of ``softmax(processed logits)`` (the Gumbel-max trick). Processed means
temperature, then top-k, then top-p, in HF's warper order; what they remove is ``-inf`` and never
wins. Temperature 0 is a plain argmax: greedy stays exactly greedy.

Why Gumbel-max rather than inverse-CDF sampling (one uniform per row and a cumulative sum over the
vocabulary, cheaper to hash): a float32 cumulative sum over ~150k probabilities drops every token
below its rounding step once the sum nears 1 and depends on the vocabulary's order; Gumbel-max has
neither problem, and is one elementwise pass that torch.compile fuses on a GPU (where the static decoder
draws at a plain temperature, grpo/kernels/keyed_sample.py computes the same numbers in one Triton kernel).
Everything is a pure tensor op with no torch.Generator, so the sampler can be captured in a CUDA graph.

The hash: keys are 32-bit values held in int64 tensors; the mixer (the xorshift-multiply form of
Wellons's lowbias32, a bijection on 32 bits) runs on their int32 bit patterns, where sums and products
wrap mod 2**32.
Counters are chained (``mix``) into one key per row and one per (row, position); vocabulary entry v
hashes ``key + v * GOLDEN``. The uniform takes the top 24 bits, exact in float32 and strictly inside
(0, 1), so the noise is finite; its resolution bounds the bias by about 2**-24 per token.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
# 2**32 - 2**32 / golden ratio (0x9E3779B9), odd: v * GOLDEN visits every 32-bit value once; below
# 2**31, like the mixer's multipliers
GOLDEN = 0x61C88647
MIX_M1, MIX_M2 = 0x7FEB352D, 0x21F0AAAD  # the mixer's multipliers: odd, below 2**31 (int32 constants)


def as_bits(x: Tensor) -> Tensor:
    """int64 values in [0, 2**32) as the int32 tensor of the same 32 bits."""
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


def hash_bits(x: Tensor) -> Tensor:
    """The mixer on int32 bit patterns: int32 sums and products wrap mod 2**32 as unsigned ones do, and a
    logical right shift is the arithmetic one with the sign's copies masked off. In int32, not int64:
    the per-token noise hashes every vocabulary entry of every row, and 64-bit integer products are
    several instructions each on a GPU (the compiled sampler of a 64-row step: 84 µs on an H100 in int64,
    78 in int32, bench/RESULTS.md)."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * MIX_M1
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * MIX_M2
    return x ^ ((x >> 15) & 0x1FFFF)


def hash32(x: Tensor) -> Tensor:
    """A bijective mixer of 32-bit values (int64 tensors holding values in [0, 2**32))."""
    return hash_bits(as_bits(x)).long() & MASK32


def mix(key: Tensor, value: Tensor | int) -> Tensor:
    """Fold ``value`` (taken mod 2**32) into ``key``: distinct values give distinct keys."""
    return hash32(((key ^ (value & MASK32)) + GOLDEN) & MASK32)


def row_keys(seed: int, prompt_index: Tensor, sample_index: Tensor) -> Tensor:
    """One key per row of a request: rows are (prompt index within the request, sample index)."""
    seed &= (1 << 64) - 1
    key = hash32(torch.full_like(prompt_index, seed & MASK32, dtype=torch.long))
    key = mix(key, seed >> 32)
    return mix(mix(key, prompt_index.long()), sample_index.long())


def vocab_offsets(vocab: int, device: torch.device | str = "cpu") -> Tensor:
    """``v * GOLDEN mod 2**32`` for every vocabulary index v [vocab] as int32 bits (``as_bits``): what
    ``gumbel_noise`` adds to a row's stream. A running sum, not ``arange * GOLDEN``: inductor folds the
    latter into an int32 index expression on CUDA, where the product overflows (it failed to compile at
    151,936 ids). Made once per decoder and passed in: inside the compiled sampler the running sum was
    recomputed by every step's kernel."""
    step = torch.full((vocab,), GOLDEN, device=device, dtype=torch.long)
    return as_bits((step.cumsum(0) - GOLDEN) & MASK32)


def noise_streams(keys: Tensor, positions: Tensor) -> Tensor:
    """Each row's noise stream at its response position [B] (int32 bits): vocabulary entry v's noise hashes
    stream + ``vocab_offsets``[v]."""
    return as_bits(mix(keys, positions.long()))


def gumbel_noise(keys: Tensor, positions: Tensor, offsets: Tensor) -> Tensor:
    """Gumbel(0, 1) noise [B, V] float32 for rows with ``keys`` [B] at response ``positions`` [B];
    ``offsets`` [V] is ``vocab_offsets(V)``."""
    h = hash_bits(noise_streams(keys, positions)[:, None] + offsets[None])
    u = (((h >> 8) & 0xFFFFFF).float() + 0.5) * 2.0**-24
    return -torch.log(-torch.log(u))


def warp(logits: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """Temperature, then top-k (0: off), then top-p (1: off), as HF's warpers order them; removed
    tokens get ``-inf``. Ties at the k-th value stay in, and top-p always keeps the likeliest token."""
    logits = logits / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, order = logits.sort(-1)  # ascending, as HF's TopPLogitsWarper
        drop_sorted = sorted_logits.softmax(-1).cumsum(-1) <= 1 - top_p
        drop_sorted[:, -1] = False
        logits = logits.masked_fill(drop_sorted.scatter(1, order, drop_sorted), -math.inf)
    return logits


def keyed_scores(logits: Tensor, keys: Tensor, positions: Tensor, *, temperature: float, top_k: int = 0,
                 top_p: float = 1.0, offsets: Tensor | None = None) -> Tensor:
    """The warped ``logits`` [B, V] plus each row's Gumbel noise: their argmax is the keyed sample.
    ``offsets``: ``vocab_offsets(V)``, made here when not given."""
    logits = logits.float()
    if offsets is None:
        offsets = vocab_offsets(logits.shape[-1], logits.device)
    return warp(logits, temperature, top_k, top_p) + gumbel_noise(keys, positions, offsets)


def sample(logits: Tensor, keys: Tensor, positions: Tensor, *, temperature: float, top_k: int = 0,
           top_p: float = 1.0, offsets: Tensor | None = None) -> Tensor:
    """The next ids [B] from ``logits`` [B, V]: the argmax when ``temperature`` is 0, else the sample
    keyed by ``keys`` [B] (``row_keys``) at response ``positions`` [B]. The static decoder compiles it
    whole on a GPU (one fused pass over the logits and the noise), with ``offsets`` made once."""
    if temperature == 0:
        return logits.argmax(-1)
    return keyed_scores(logits, keys, positions, temperature=temperature, top_k=top_k, top_p=top_p,
                        offsets=offsets).argmax(-1)
