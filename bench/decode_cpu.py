"""Decode speed on CPU for the choices the CPU default makes: compute dtype, attention kernel, and (for
the training policy) nf4 4-bit kernels against the cached dense copy (grpo/model/dequant.py).

Real SmolLM2-135M-Instruct weights from models/base (run `python -m stages.base_model` first), the
tagged training prompt over the first GSM8K test questions, sampling at temperature 1 with every
sequence forced to the full budget (no early stop), so each row generates exactly the same work.

Run from the project root:
    .venv/bin/python bench/decode_cpu.py [--batch 32] [--new-tokens 96]
Prints a markdown table and writes bench/results/decode_cpu.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo.data.loading import load_dataset_rows  # noqa: E402
from grpo.model import loading  # noqa: E402
from grpo.model.dequant import dense_base  # noqa: E402
from grpo.model.lora import inject_lora  # noqa: E402
from grpo.prompts import PromptStyle, build_prompt  # noqa: E402
from grpo.rollout.base import encode_prompts  # noqa: E402

MODEL = ROOT / "models" / "base"
# (label, quantization, compute dtype, attention, dense copy, LoRA): the SENT/evaluate engine rows
# (unquantised base) and the training policy rows (nf4 + LoRA, as train.dense_generation decodes it)
CASES = [
    ("base fp32 sdpa", "none", "float32", "sdpa", False, False),
    ("base fp32 eager", "none", "float32", "eager", False, False),
    ("base bf16 sdpa", "none", "bfloat16", "sdpa", False, False),
    ("base bf16 eager", "none", "bfloat16", "eager", False, False),
    ("policy nf4+LoRA bf16 eager, 4-bit kernels", "nf4", "bfloat16", "eager", False, True),
    ("policy nf4+LoRA bf16 eager, dense copy", "nf4", "bfloat16", "eager", True, True),
]


def decode_rate(case: tuple, input_ids: torch.Tensor, attention_mask: torch.Tensor, new_tokens: int) -> float:
    label, quantization, dtype, attention, dense, lora = case
    model = loading.load_policy_model(MODEL, quantization=quantization, compute_dtype=dtype, device="cpu",
                                      gradient_checkpointing=False, attention=attention)  # the CPU choice, varied
    if lora:
        inject_lora(model, targets=["q_proj", "k_proj", "v_proj", "o_proj"], r=16, alpha=32)
    model.eval()
    kwargs = dict(attention_mask=attention_mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=None,
                  pad_token_id=0, min_new_tokens=new_tokens, max_new_tokens=new_tokens)
    with torch.no_grad(), dense_base(model, dense):
        model.generate(input_ids[:2], **{**kwargs, "attention_mask": attention_mask[:2],
                                         "min_new_tokens": 2, "max_new_tokens": 2})  # warm-up
        torch.manual_seed(0)
        start = time.perf_counter()
        model.generate(input_ids, **kwargs)
        elapsed = time.perf_counter() - start
    return input_ids.shape[0] * new_tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=96)
    args = parser.parse_args()
    tokenizer = loading.load_tokenizer(MODEL)
    rows = load_dataset_rows("gsm8k", "eval", source="bundled").rows[: args.batch]
    prompt_ids = encode_prompts(tokenizer, [build_prompt(tokenizer, r["question"], PromptStyle("tagged")) for r in rows])
    width = max(len(ids) for ids in prompt_ids)
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(ids)) + ids for ids in prompt_ids])
    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompt_ids])
    results = []
    for case in CASES:
        rate = decode_rate(case, input_ids, attention_mask, args.new_tokens)
        results.append({"case": case[0], "tokens_per_s": round(rate, 1)})
        print(f"{case[0]}: {rate:.1f} tok/s", flush=True)
    record = {"machine": f"{os.cpu_count()}-core CPU ({platform.machine()})", "torch_threads": torch.get_num_threads(),
              "batch": args.batch, "prompt_tokens_max": width, "new_tokens": args.new_tokens,
              "command": "python " + " ".join(sys.argv), "results": results}
    out = ROOT / "bench" / "results" / "decode_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\n{args.batch} sequences, prompts up to {width} tokens, {args.new_tokens} new tokens each\n")
    print("| case | generated tokens/s |\n| --- | --- |")
    for r in results:
        print(f"| {r['case']} | {r['tokens_per_s']} |")


if __name__ == "__main__":
    main()
