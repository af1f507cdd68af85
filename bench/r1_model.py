"""A model folder at the exact DeepSeek-R1-Distill-Qwen-1.5B shape with random weights, for the GPU
benchmarks (nothing can be downloaded on the device machine; speed and memory do not depend on the
values), or a tiny one of the same layout for a CPU smoke run.

The tokenizer is a byte-level BPE trained with `tokenizers` on the bundled GSM8K training text and
filled up to the model's vocabulary (151,936 ids: the trained merges, then filler tokens that
encoding never produces but that decode, so any sampled id decodes), with the R1 special tokens and an
R1-style chat template. `AutoTokenizer` loads it from the folder (as a Qwen2Tokenizer: Qwen's
pre-tokenizer split, as the real model's) and `grpo.model.loading.load_tokenizer` accepts it, so the stage scripts run on this folder exactly as on the hub model.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "data" / "bundled" / "gsm8k" / "train.jsonl"

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
# transformers loads a folder whose config says qwen2 with its Qwen2Tokenizer, which adds <|endoftext|>
# when the vocabulary lacks it: listed here, the loaded tokenizer keeps exactly the model's ids
SPECIAL_TOKENS = [EOS, BOS, PAD, USER, ASSISTANT, "<think>", "</think>", "<|endoftext|>"]
# The R1 layout: BOS, any system text, user turns after <｜User｜>, the reply after <｜Assistant｜>
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}{{ '" + USER + "' + m['content'] }}"
    "{% else %}{{ '" + ASSISTANT + "' + m['content'] + eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + ASSISTANT + "' }}{% endif %}"
)

# DeepSeek-R1-Distill-Qwen-1.5B's config.json (architecture fields)
R1_SHAPE = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                num_attention_heads=12, num_key_value_heads=2, head_dim=128, max_position_embeddings=131072,
                rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False)
SMOKE_SHAPE = dict(R1_SHAPE, vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def gsm8k_rows(path: Path = CORPUS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def corpus_texts() -> list[str]:
    return [f"{row['question']}\n{row['answer']}" for row in gsm8k_rows()]


def build_tokenizer(vocab_size: int, texts: list[str]):
    """A byte-level BPE of exactly ``vocab_size`` ids whose last ids are ``SPECIAL_TOKENS``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe_size = vocab_size - len(SPECIAL_TOKENS)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=bpe_size, initial_alphabet=alphabet,
                                                       show_progress=False))
    spec = json.loads(tok.to_str())
    spec["model"]["ignore_merges"] = False  # a filler must never be taken whole for a 3-byte word
    vocab = spec["model"]["vocab"]
    # GSM8K's text runs out of merges long before 151,936: fill with 3-symbol byte strings encoding never
    # produces (no merge makes them), so every id the model can sample decodes to some bytes
    fillers = ("".join(chars) for chars in itertools.product(alphabet, repeat=3))
    for token in fillers:
        if len(vocab) >= bpe_size:
            break
        vocab.setdefault(token, len(vocab))
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    fast.chat_template = CHAT_TEMPLATE
    if len(fast) != vocab_size:
        raise ValueError(f"tokenizer has {len(fast)} ids, expected {vocab_size}")
    return fast


def build_model_dir(path: Path, *, smoke: bool = False, device: str = "cuda") -> Path:
    """Write (once) a HF folder: random bf16 weights at the R1 shape (``smoke``: the tiny shape, fp32)
    and the tokenizer above. An existing folder with a config is reused."""
    if (path / "config.json").is_file():
        return path
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = SMOKE_SHAPE if smoke else R1_SHAPE
    tokenizer = build_tokenizer(shape["vocab_size"], corpus_texts())
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (("bos", BOS), ("eos", EOS), ("pad", PAD))}
    cfg = Qwen2Config(**shape, bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    dtype = torch.float32 if smoke else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype)
    model.generation_config.eos_token_id = ids["eos"]
    model.generation_config.pad_token_id = ids["pad"]
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(path)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return path
