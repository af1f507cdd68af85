"""A real but tiny chat model for tests: a random Qwen2 (head_dim 64, as vLLM's CPU attention needs)
with a byte-level BPE tokenizer trained by `tokenizers` on arithmetic text, and a ChatML template.

Nothing is mocked: transformers, bitsandbytes and vLLM load the folder exactly as they load a hub model.
"""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "What is 15 + 27? The answer is 42.",
    "<reasoning>\n3 apples and 4 apples make 7 apples.\n</reasoning>\n<answer>\n7\n</answer>",
    "<think>\nAdd them: 2 + 2 = 4.\n</think>\nThe answer is \\boxed{4}.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "#### 72 \\frac{1}{2} 0.5 1/2 -3 1,234 $5 50% 90^\\circ (1, 2) \\sqrt{2}",
    "You are a helpful assistant. Respond in the following format: system user assistant",
] + [f"{a} + {b} = {a + b}. {a} * {b} = {a * b}." for a in range(30) for b in range(0, 30, 7)]


def build_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_config(vocab_size: int, **overrides) -> Qwen2Config:
    cfg = dict(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    cfg.update(overrides)
    return Qwen2Config(**cfg)


def make_tiny_model_dir(path: str | Path, seed: int = 0, **config_overrides) -> Path:
    """Write a HF model folder (config, safetensors weights, tokenizer, chat template) to `path`."""
    path = Path(path)
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    config = build_config(len(tokenizer), **config_overrides)
    config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config.pad_token_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config.bos_token_id = None
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


EOS_BOOST = 0.3  # sampled lengths under a 6-token cap: 6,4,6,1,2,6,1,1,3,1,1,1,3,6,1,1 (nf4, measured)


def make_varied_length_model_dir(path: str | Path) -> Path:
    """The tiny model with its end-of-turn logit raised along the mean final hidden state at the first
    generated position of the default (tagged) prompts: sampled answers then vary in length, so a
    ``length_penalty`` reward differs inside a group and GRPO really moves the adapter (with the plain
    tiny model every completion runs to the token cap and every advantage is 0)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.prompts import PromptStyle, build_prompt

    path = make_tiny_model_dir(path)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path)
    prompts = [build_prompt(tokenizer, f"What is {i} + {i}?", PromptStyle("tagged")) for i in range(4)]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states[-1][:, -1].mean(0)
        model.lm_head.weight[tokenizer.convert_tokens_to_ids("<|im_end|>")] += EOS_BOOST * hidden / hidden.norm()
    model.save_pretrained(path)
    return path
