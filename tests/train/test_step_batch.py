"""The training batch: sampled ids kept exactly (EOS included), right-padded (no pad before or inside a row's
tokens, so the decoder needs no attention mask), each response read at its own row's offset, so batched
log-probs equal each row's log-probs computed alone."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo.rollout.base import Completion
from grpo.train.step import build_batch, masked_mean, response_hidden_states

PAD, EOS = 0, 2


def completion(prompt: list[int], response: list[int], finish: str = "stop") -> Completion:
    return Completion(prompt_ids=prompt, token_ids=response, text="", finish_reason=finish)


def test_layout_keeps_sampled_ids_and_pads_on_the_right():
    batch = build_batch([completion([5, 6, 7], [8, 9, EOS]), completion([5], [8, 9, 10, 11], "length")], PAD)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, EOS], [5, 8, 9, 10, 11, PAD]]
    assert batch.response_ids.tolist() == [[8, 9, EOS, PAD], [8, 9, 10, 11]]
    assert batch.response_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    # the state at a row's last prompt token predicts its first response token; past the end: clamped
    assert batch.response_index.tolist() == [[2, 3, 4, 5], [0, 1, 2, 3]]
    assert batch.prompt_lengths.tolist() == [3, 1] and batch.truncated.tolist() == [False, True]


def test_select_trims_unused_columns():
    batch = build_batch([completion([1, 2], [3, EOS]), completion([1], [3, 4, 5, 6, EOS])], PAD)
    micro = batch.select(slice(0, 1))
    assert micro.response_ids.tolist() == [[3, EOS]]
    assert micro.input_ids.tolist() == [[1, 2, 3, EOS]]
    assert micro.response_index.tolist() == [[1, 2]]


def test_an_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="no prompt ids"):
        build_batch([completion([], [3, EOS])], PAD)


def test_select_widths_come_from_the_cpu_lengths():
    """``select`` reads its widths from the CPU's lengths (no wait for the GPU): the response width is the
    last column where the micro-batch's response mask has a token, the input width its longest row, and
    every index stays inside it, for every slice, empty responses too."""
    torch.manual_seed(1)
    rows = [completion([1] * int(n), [3] * int(m)) for n, m in zip(torch.randint(1, 6, (9,)), torch.randint(0, 8, (9,)))]
    batch = build_batch(rows, PAD)
    for lo in range(9):
        for hi in range(lo + 1, 10):
            mask = batch.response_mask[lo:hi]
            by_mask = int(mask.sum(0).nonzero().max()) + 1 if mask.any() else 1
            micro = batch.select(slice(lo, hi))
            assert micro.response_ids.shape[1] == micro.response_mask.shape[1] == by_mask
            assert micro.input_ids.shape[1] == max(len(r.prompt_ids) + len(r.token_ids) for r in rows[lo:hi])
            assert int(micro.response_index.max()) < micro.input_ids.shape[1]
            for row, got in zip(rows[lo:hi], micro.response_index.tolist()):  # real tokens: exact columns
                assert got[:len(row.token_ids)] == [len(row.prompt_ids) - 1 + j for j in range(len(row.token_ids))]
    assert batch.to(torch.device("meta")).response_lengths.device.type == "cpu"


def test_masked_mean_is_the_mean_of_the_selected_values():
    values = torch.randn(4, 6)
    values[0, 5] = float("inf")  # off the mask: never read
    mask = (torch.rand(4, 6) > 0.4).float()
    mask[0, 5] = 0.0
    torch.testing.assert_close(masked_mean(values, mask), values[mask.bool()].mean())
    assert masked_mean(values, torch.zeros(4, 6)).item() == 0.0


def test_batched_logprobs_equal_single_row_logprobs(tiny_model_dir):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    vocab = model.config.vocab_size
    rows = [completion(torch.randint(3, vocab, (n,)).tolist(), torch.randint(3, vocab, (m,)).tolist())
            for n, m in [(7, 3), (2, 6), (4, 1)]]
    batch = build_batch(rows, PAD)
    with torch.no_grad():
        hidden = response_hidden_states(model, batch)
        logp = torch.log_softmax(model.lm_head(hidden).float(), -1)
        batched = logp.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
        for i, row in enumerate(rows):
            ids = torch.tensor([row.prompt_ids + row.token_ids])
            alone = torch.log_softmax(model(ids).logits.float(), -1)[0]
            start = len(row.prompt_ids) - 1
            expected = alone[start : start + len(row.token_ids)].gather(-1, torch.tensor(row.token_ids)[:, None])[:, 0]
            torch.testing.assert_close(batched[i, : len(row.token_ids)], expected, atol=1e-5, rtol=1e-5)


def test_the_training_forward_sends_no_mask_to_sdpa(tiny_model_dir, monkeypatch):
    """Rows of different lengths reach SDPA as causal attention with no mask (on CUDA its flash/cuDNN kernels may
    run; a padding mask sent it to the memory-efficient kernel). A spy around torch's own SDPA: it still computes."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((kwargs.get("attn_mask", args[3] if len(args) > 3 else None), kwargs.get("is_causal")))
        return sdpa(*args, **kwargs)

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa").eval()
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    batch = build_batch([completion([5, 6, 7, 8], [9, EOS]), completion([5], [9, 10, 11])], PAD)
    with torch.no_grad():
        response_hidden_states(model, batch)
    assert len(seen) == model.config.num_hidden_layers
    assert all(mask is None and causal for mask, causal in seen)
