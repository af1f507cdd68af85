"""Shared by the fault suite: a tiny model whose sampled answers vary in length, so the
``length_penalty`` reward differs inside every group and GRPO really moves the adapter (with the plain
tiny model every completion runs to the token cap, every advantage is 0 and a "resumed adapter equals
the uninterrupted one" check would pass without training anything)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo.prompts import PromptStyle, build_prompt
from tests.tiny_model import make_tiny_model_dir

EOS_BOOST = 0.3  # sampled lengths under a 6-token cap: 6,4,6,1,2,6,1,1,3,1,1,1,3,6,1,1 (nf4, measured)


@pytest.fixture(scope="session")
def varied_model_dir(tmp_path_factory) -> Path:
    """The tiny random Qwen2 with the end-of-turn logit raised along the mean final hidden state at the
    first generated position of the default (tagged) prompts."""
    path = make_tiny_model_dir(tmp_path_factory.mktemp("varied_model"))
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path)
    prompts = [build_prompt(tokenizer, f"What is {i} + {i}?", PromptStyle("tagged")) for i in range(4)]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states[-1][:, -1].mean(0)
        model.lm_head.weight[tokenizer.convert_tokens_to_ids("<|im_end|>")] += EOS_BOOST * hidden / hidden.norm()
    model.save_pretrained(path)
    return path
