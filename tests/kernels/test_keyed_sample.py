"""The keyed sampler's kernel (grpo/kernels/keyed_sample.py) against ``sampling.sample``, the PyTorch definition:
the same ids at several temperatures, vocabularies that do not fill the programs' parts, bf16 and fp32 logits;
ties go to the smallest id as ``argmax``'s do; and the programs' bests are each part's best by hand.

On a GPU it runs compiled; on CPU under Triton's interpreter, in a subprocess (tests/kernels/interpreter.py).
"""
from __future__ import annotations

import pytest
import torch

from grpo.rollout.sampling import keyed_scores, noise_streams, row_keys, sample, vocab_offsets
from tests.kernels.interpreter import kernel_device, run_under_interpreter

pytest.importorskip("triton", reason="triton is not installed")


def test_kernel_under_interpreter():
    run_under_interpreter(__file__, passed=7)


def _rows(n: int, vocab: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(n, vocab, generator=g) * 3).to(device=device, dtype=dtype)
    keys = row_keys(7, torch.arange(n) // 2, torch.arange(n) % 2).to(device)
    positions = torch.randint(0, 500, (n,), generator=g).to(device)
    return logits, keys, positions


@pytest.mark.parametrize("n,vocab,dtype,temperature", [
    (5, 1000, torch.float32, 1.0),     # parts of 32 ids: every program's loop masked
    (3, 40_000, torch.bfloat16, 0.7),  # the decoder's dtype, parts of 1,250 over two iterations
    (2, 151_936, torch.bfloat16, 1.0), # R1-Distill-Qwen's vocabulary
    (4, 777, torch.float32, 1.3),      # a vocabulary of odd size: the last part short
])
def test_same_ids_as_the_pytorch_sampler(n, vocab, dtype, temperature):
    from grpo.kernels.keyed_sample import keyed_sample

    device = kernel_device()
    logits, keys, positions = _rows(n, vocab, dtype, device)
    offsets = vocab_offsets(vocab, device)
    got = keyed_sample(logits, keys, positions, offsets, temperature)
    want = sample(logits, keys, positions, temperature=temperature, offsets=offsets)
    assert got.dtype == torch.long and torch.equal(got, want)
    # over many positions, not only the drawn ones: a different draw each, all the PyTorch sampler's
    many = torch.arange(64, device=device)
    rows = logits[:1].expand(64, -1).contiguous()
    drawn = keyed_sample(rows, keys[:1].expand(64), many, offsets, temperature)
    assert torch.equal(drawn, sample(rows, keys[:1].expand(64), many, temperature=temperature, offsets=offsets))
    assert drawn.unique().numel() > 8


def test_ties_go_to_the_smallest_id():
    """Equal scores in two programs' parts and twice within one: ``argmax`` keeps the first, so does the kernel.
    The logits are built so that two ids' scores (logit + noise) are equal exactly."""
    from grpo.kernels.keyed_sample import keyed_sample

    device = kernel_device()
    vocab = 4096
    keys, positions = row_keys(1, torch.zeros(1), torch.zeros(1)).to(device), torch.zeros(1, dtype=torch.long,
                                                                                         device=device)
    offsets = vocab_offsets(vocab, device)
    noise = keyed_scores(torch.zeros(1, vocab, device=device), keys, positions, temperature=1.0, offsets=offsets)
    for a, b in ((3000, 100), (40, 41)):  # another part before; the same part, neighbours
        logits = torch.full((1, vocab), -100.0, device=device)
        logits[0, a], logits[0, b] = 50.0, 50.0 + noise[0, a] - noise[0, b]
        scores = keyed_scores(logits, keys, positions, temperature=1.0, offsets=offsets)
        assert scores[0, a] == scores[0, b]  # built tie
        assert keyed_sample(logits, keys, positions, offsets, 1.0).item() == min(a, b)


def test_each_programs_best_is_its_parts_best():
    from grpo.kernels import keyed_sample as module

    device = kernel_device()
    logits, keys, positions = _rows(2, 3000, torch.float32, device)
    offsets = vocab_offsets(3000, device)
    best, at = module.keyed_best(logits, noise_streams(keys, positions), offsets, 1.0)
    scores = keyed_scores(logits, keys, positions, temperature=1.0, offsets=offsets)
    chunk = -(-3000 // module.CHUNKS)
    for part in range(module.CHUNKS):
        piece = scores[:, part * chunk:(part + 1) * chunk]
        # a log's last bit may differ between libraries (numpy under the interpreter, libdevice on a GPU)
        torch.testing.assert_close(best[:, part], piece.max(-1).values, rtol=1e-6, atol=0)
        assert torch.equal(at[:, part].long(), part * chunk + piece.argmax(-1))


def test_takes_only_plain_temperature_sampling():
    from grpo.kernels.keyed_sample import takes

    assert takes(1.0, 0, 1.0) and takes(0.7, 0, 1.0)
    assert not takes(0.0, 0, 1.0) and not takes(1.0, 50, 1.0) and not takes(1.0, 0, 0.9)
