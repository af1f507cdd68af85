"""Counter-keyed sampling (grpo.rollout.sampling) against independent references: the empirical
distribution of many draws against softmax and against top-k / top-p worked out by hand (chi-square,
fixed keys, so each test is deterministic), uniform hashes, and draws that depend on their own
counters only, never on the batch around them."""
from __future__ import annotations

import math

import pytest
import torch

from grpo.rollout.sampling import (MASK32, as_bits, gumbel_noise, hash32, hash_bits, mix, row_keys, sample,
                                   vocab_offsets)

LOGITS = [1.2, -0.4, 0.3, 2.0, -1.5, 0.9]  # distinct, so top-k and top-p have no ties
# chi-square quantiles at 0.999, by degrees of freedom
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 63: 103.4}
DRAWS = 40_000


def chi_square(counts: list[int], probs: list[float]) -> float:
    total = sum(counts)
    return sum((c - total * p) ** 2 / (total * p) for c, p in zip(counts, probs) if p > 0)


def draw(logits: list[float], n: int = DRAWS, **warp) -> list[int]:
    """``n`` draws from one distribution: rows with distinct keys (prompt index i), and positions that
    vary too, so both counters feed the stream."""
    index = torch.arange(n)
    keys = row_keys(11, index, index % 3)
    ids = sample(torch.tensor([logits]).expand(n, -1), keys, index % 7, **warp)
    return torch.bincount(ids, minlength=len(logits)).tolist()


def test_hash_is_a_uniform_bijection_on_32_bits():
    x = torch.arange(1 << 16, dtype=torch.long) * 65_537 % (1 << 32)  # 65,536 distinct 32-bit values
    h = hash32(x)
    assert h.min() >= 0 and h.max() <= MASK32 and len(torch.unique(h)) == len(x)
    counts = torch.bincount(h >> 26, minlength=64).tolist()  # top 6 bits: 64 equal bins expected
    assert chi_square(counts, [1 / 64] * 64) < CHI2_999[63]


def test_gumbel_max_draws_follow_softmax():
    probs = torch.tensor(LOGITS).softmax(-1).tolist()
    assert chi_square(draw(LOGITS, temperature=1.0), probs) < CHI2_999[5]


def test_temperature_top_k_top_p_follow_the_distribution_worked_out_by_hand():
    temperature, top_k, top_p = 0.7, 4, 0.9
    # by hand: softmax at temperature, the 4 likeliest renormalised, then the likeliest tokens until
    # the mass before the next one reaches top_p (HF's rule: drop a token once the less likely mass
    # including it is at most 1 - top_p)
    scaled = [math.exp(x / temperature) for x in LOGITS]
    top = sorted(range(len(LOGITS)), key=lambda i: -scaled[i])[:top_k]
    mass = sum(scaled[i] for i in top)
    kept, before = [], 0.0
    for i in top:
        if before < top_p:
            kept.append(i)
        before += scaled[i] / mass
    expected = [scaled[i] / sum(scaled[j] for j in kept) if i in kept else 0.0 for i in range(len(LOGITS))]
    assert len(kept) == 3  # top-p cuts inside the top 4
    counts = draw(LOGITS, temperature=temperature, top_k=top_k, top_p=top_p)
    assert all(counts[i] == 0 for i in range(len(LOGITS)) if i not in kept)
    assert chi_square(counts, expected) < CHI2_999[len(kept) - 1]


def test_a_draw_depends_on_its_own_counters_only():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    keys = row_keys(5, torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([0, 1, 0, 1, 0, 1]))
    positions = torch.tensor([0, 3, 1, 4, 2, 9])
    together = sample(logits, keys, positions, temperature=1.0, top_p=0.9)
    alone = [int(sample(logits[i:i + 1], keys[i:i + 1], positions[i:i + 1], temperature=1.0, top_p=0.9))
             for i in range(6)]
    order = torch.tensor([4, 1, 5, 0, 3, 2])
    shuffled = sample(logits[order], keys[order], positions[order], temperature=1.0, top_p=0.9)
    assert together.tolist() == alone and shuffled.tolist() == together[order].tolist()


@pytest.mark.parametrize("change", ["seed", "prompt", "sample", "position"])
def test_every_counter_changes_the_noise(change):
    base = {"seed": 1, "prompt": 2, "sample": 3, "position": 4}

    def noise(c):
        keys = row_keys(c["seed"], torch.tensor([c["prompt"]]), torch.tensor([c["sample"]]))
        return gumbel_noise(keys, torch.tensor([c["position"]]), vocab_offsets(64))

    first = noise(base)
    assert torch.equal(first, noise(base))
    other = noise({**base, change: base[change] + 1})
    assert (first != other).float().mean() > 0.9  # unrelated streams, not a shifted copy
    assert torch.isfinite(first).all()


def test_large_and_negative_seeds_are_keys_too():
    index = torch.arange(4)
    keys = {s: row_keys(s, index, index) for s in (0, 2**40 + 1, -1, 2**32)}
    assert len({tuple(k.tolist()) for k in keys.values()}) == 4


def test_temperature_zero_is_the_argmax():
    torch.manual_seed(1)
    logits = torch.randn(8, 100)
    keys = row_keys(0, torch.arange(8), torch.zeros(8, dtype=torch.long))
    assert torch.equal(sample(logits, keys, torch.zeros(8, dtype=torch.long), temperature=0.0, top_k=3),
                       logits.argmax(-1))


def test_vocab_offsets_are_index_times_golden_mod_2_32():
    vocab = 151_936  # Qwen's: v * GOLDEN passes 2**32 many times over
    expected = torch.arange(vocab, dtype=torch.long) * 0x61C88647 % (1 << 32)  # int64 on CPU: no overflow
    assert torch.equal(vocab_offsets(vocab).long() & MASK32, expected)


def lowbias32(x: int) -> int:
    """The mixer in Python integers, the obvious way (unsigned 32-bit arithmetic by masking)."""
    x ^= x >> 16
    x = x * 0x7FEB352D & MASK32
    x ^= x >> 15
    x = x * 0x21F0AAAD & MASK32
    return x ^ (x >> 15)


def reference_noise(keys: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """gumbel_noise by hand: each row's stream, then entry v hashes stream + v * GOLDEN (mod 2**32)."""
    rows = []
    for stream in mix(keys, positions.long()).tolist():
        h = torch.tensor([lowbias32((stream + v * 0x61C88647) & MASK32) for v in range(vocab)], dtype=torch.float64)
        u = ((torch.div(h, 256, rounding_mode="floor") + 0.5) * 2.0**-24).float()
        rows.append(-torch.log(-torch.log(u)))
    return torch.stack(rows)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                               reason="the compiled GPU sampler needs CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
def test_hash_is_the_unsigned_32_bit_arithmetic_on_every_device(device):
    """``hash32`` (int64 values) and the int32 mixer under it, eager and through inductor, on the CPU and on
    CUDA: the reference's integers exactly, at the edges of the signed and unsigned ranges and at random."""
    values = [0, 1, 2**15, 2**16 - 1, 2**31 - 1, 2**31, 2**31 + 12345, 2**32 - 1] + \
        torch.randint(0, 2**32, (500,), generator=torch.Generator().manual_seed(2)).tolist()
    expected = [lowbias32(v) for v in values]
    assert hash32(torch.tensor(values, device=device)).tolist() == expected
    bits = as_bits(torch.tensor(values, device=device))
    assert (hash_bits(bits).long() & MASK32).tolist() == expected
    assert (torch.compile(hash_bits, dynamic=False)(bits).long() & MASK32).tolist() == expected


@pytest.mark.parametrize("device", DEVICES)
def test_noise_matches_the_reference_eager_and_compiled(device):
    """Against the Python-integer reference: eager on the CPU bit for bit; on CUDA (whose logf rounds
    differently from the CPU's: seen on an H100) and through inductor (whose int32 overflow must wrap as
    the reference's masked arithmetic does) within the logarithms' rounding, 5e-7 here, where one wrong
    product would move entries by whole units. The hashes themselves are integers: equal on every device
    (``test_hash_is_the_unsigned_32_bit_arithmetic_on_every_device``)."""
    keys = row_keys(7, torch.tensor([0, 3, 2**20]), torch.tensor([1, 0, 5]))
    positions = torch.tensor([0, 9, 700])
    vocab = 3_000
    expected = reference_noise(keys, positions, vocab)
    args = (keys.to(device), positions.to(device), vocab_offsets(vocab, device))
    eager = gumbel_noise(*args).cpu()
    if device == "cpu":
        assert torch.equal(eager, expected)
    torch.testing.assert_close(eager, expected, rtol=1e-5, atol=1e-5)
    compiled = torch.compile(gumbel_noise, dynamic=False)(*args).cpu()
    torch.testing.assert_close(compiled, expected, rtol=1e-5, atol=1e-5)
