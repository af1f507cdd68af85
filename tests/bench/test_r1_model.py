"""bench/r1_model.py: the R1-shape benchmark folder's tokenizer is a real one: AutoTokenizer loads it from
the folder, the project's loader accepts it, it turns text into ids and back, and every id the model
can sample decodes. Checked on CPU before the device runs the stage scripts on it."""
from __future__ import annotations

import pytest

from bench.r1_model import BOS, EOS, R1_SHAPE, SPECIAL_TOKENS, build_model_dir, build_tokenizer, corpus_texts
from grpo.prompts import PromptStyle, build_prompt
from grpo.rollout.base import encode_prompts, stop_token_ids

MATH = "Let $f(x) = \\frac{3x^2 - 7}{2}$. Find $f(-4)$ and \\boxed{42}; 1,234.5% of π ≈ 3.14159 (naïve café)."


@pytest.fixture(scope="module")
def r1_tokenizer_dir(tmp_path_factory):
    """The full-size tokenizer (151,936 ids) and the R1 config (no weights): AutoTokenizer picks its class
    from the config's model type, as it does in the benchmark's model folder."""
    from transformers import Qwen2Config

    path = tmp_path_factory.mktemp("r1_tokenizer")
    build_tokenizer(R1_SHAPE["vocab_size"], corpus_texts()).save_pretrained(path)
    Qwen2Config(**R1_SHAPE).save_pretrained(path)
    return path


def test_autotokenizer_loads_it_and_it_round_trips(r1_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(r1_tokenizer_dir)
    assert len(tok) == 151936 and tok.eos_token == EOS and tok.bos_token == BOS
    assert tok.convert_tokens_to_ids(SPECIAL_TOKENS) == list(range(151936 - len(SPECIAL_TOKENS), 151936))
    texts = corpus_texts()
    for text in texts[:200] + [MATH]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert 0 < len(ids) < len(text.encode()) and max(ids) < 151936
        assert tok.decode(ids) == text
    # trained merges compress GSM8K text (bytes per token well above 1), and fillers are never produced
    ids = tok(texts[0], add_special_tokens=False)["input_ids"]
    assert len(texts[0].encode()) / len(ids) > 2.5
    assert max(max(tok(t, add_special_tokens=False)["input_ids"]) for t in texts[:500]) < 60000
    # every id the model can sample decodes to text (fillers and specials included)
    assert all(isinstance(tok.decode([i]), str) for i in (0, 100000, 151000, 151935))
    assert type(tok).__name__ == "Qwen2Tokenizer"  # what the stages get for this folder


def test_the_project_loader_accepts_it_and_prompts_encode(r1_tokenizer_dir):
    from grpo.model.loading import load_tokenizer

    tok = load_tokenizer(r1_tokenizer_dir)
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    prompt = build_prompt(tok, "What is 15 + 27?", PromptStyle("r1"))
    assert prompt.startswith(BOS + "<｜User｜>What is 15 + 27?\n") and prompt.endswith("<｜Assistant｜><think>\n")
    (ids,) = encode_prompts(tok, [prompt])
    assert ids[0] == tok.bos_token_id and tok.decode(ids) == prompt
    assert tok.convert_tokens_to_ids("<think>") in ids  # the prefill is one special token, as in R1
    assert stop_token_ids(tok) == [tok.eos_token_id]


def test_smoke_model_dir_loads_through_the_project(tmp_path):
    from grpo.model.loading import load_policy_model, load_tokenizer

    path = build_model_dir(tmp_path / "smoke", smoke=True, device="cpu")
    model = load_policy_model(path, quantization="none", compute_dtype="float32", device="cpu",
                              gradient_checkpointing=False)
    assert model.config.vocab_size == len(load_tokenizer(path)) == 1024  # no id beyond the model's
    assert model.generation_config.eos_token_id == load_tokenizer(path).eos_token_id
    assert build_model_dir(path, smoke=True, device="cpu") == path  # reused, not rebuilt
