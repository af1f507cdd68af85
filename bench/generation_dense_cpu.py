"""Rollout decode speed on CPU: nf4 4-bit kernels vs the cached dense copy (grpo/model/dequant.py),
fp32 and bf16 compute; SmolLM2-135M-Instruct (models/base) + LoRA r16, 4 prompts x 4 samples x 32 tokens.
Run from the project root: .venv/bin/python bench/generation_dense_cpu.py
"""
import time, torch, sys
sys.path.insert(0, ".")  # run from the project root after `dvc repro base_model`
from grpo.model.loading import load_policy_model, load_tokenizer
from grpo.model.lora import inject_lora
from grpo.model.dequant import dense_base
from grpo.rollout.native import NativeEngine
from grpo.rollout.base import SamplingParams
from grpo.prompts import PromptStyle, build_prompt
torch.set_num_threads(2)
tok = load_tokenizer("models/base")
for q, dt in [("nf4","float32"), ("nf4", "bfloat16")]:
    m = load_policy_model("models/base", quantization=q, compute_dtype=dt, device="cpu")
    inject_lora(m, targets=["q_proj","k_proj","v_proj","o_proj"], r=16, alpha=32)
    eng = NativeEngine(m, tok, batch_size=16)
    prompts = [build_prompt(tok, f"What is {i} + 3?", PromptStyle("tagged")) for i in range(4)]
    sp = SamplingParams(n=4, temperature=1.0, max_new_tokens=32, seed=0)
    for dense in [False, True]:
        with dense_base(m, dense):
            eng.generate(prompts[:1], SamplingParams(n=1, max_new_tokens=2))
            t = time.time(); out = eng.generate(prompts, sp); dt_ = time.time() - t
        n = sum(len(c.token_ids) for g in out for c in g)
        print(q, dt, "dense" if dense else "4bit", f"{n/dt_:.1f} tok/s", flush=True)
