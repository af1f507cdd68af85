"""The inference CLI on the tiny model with a saved adapter: the adapter's recorded base is found, the
prompt gets the chat template and prompt style, greedy output equals the native engine's and an
independent reference (plain transformers generate on the merged model), and differs from the bare base."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from grpo.infer import resolve_base
from grpo.model.adapter import LoraSettings, save_adapter
from grpo.model.loading import load_tokenizer
from grpo.model.lora import inject_lora, lora_modules
from grpo.prompts import PromptStyle, build_prompt, full_response
from grpo.rollout.base import SamplingParams
from grpo.rollout.native import NativeEngine
from tests.conftest import ROOT
from tests.model.merge import merge_and_export

QUESTION = "What is 15 + 27?"
TOKENS = 12


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    settings = LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj"))
    inject_lora(model, targets=list(settings.targets), r=4, alpha=8, seed=0)
    generator = torch.Generator().manual_seed(1)
    for module in lora_modules(model).values():  # a trained-looking adapter: B away from its zero init
        module.lora_B.data = torch.randn(module.lora_B.shape, generator=generator)
    folder = tmp_path_factory.mktemp("adapter") / "best"
    save_adapter(model, folder, base_model_name_or_path=str(tiny_model_dir), lora_config=settings)
    return folder


def infer(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo.infer", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def native(model_dir, adapter_dir, style: PromptStyle) -> str:
    engine = NativeEngine.from_pretrained(model_dir, batch_size=1, device="cpu")
    (completion,), = engine.generate([build_prompt(engine.tokenizer, QUESTION, style)],
                                     SamplingParams(temperature=0.0, max_new_tokens=TOKENS), adapter_dir=adapter_dir)
    return full_response(style, completion.text)


def merged_reference(tiny_model_dir, adapter_dir, tmp_path, style: PromptStyle) -> str:
    """Plain transformers greedy decoding on base + adapter merged into one folder."""
    from transformers import AutoModelForCausalLM

    merged = merge_and_export(tiny_model_dir, adapter_dir, tmp_path / "merged")
    tokenizer = load_tokenizer(merged)
    model = AutoModelForCausalLM.from_pretrained(merged).eval()
    ids = tokenizer(build_prompt(tokenizer, QUESTION, style), add_special_tokens=False, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=TOKENS, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    return full_response(style, tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))


def test_cli_output_equals_native_engine_and_merged_reference(adapter, tiny_model_dir, tmp_path):
    # r1, not the default tagged style: the CLI must take the prompt style from params.yaml
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"prompt": {"style": "r1"}}))
    style = PromptStyle("r1")
    proc = infer("--adapter", str(adapter), "--prompt", QUESTION, "--max-new-tokens", str(TOKENS),
                 "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    expected = native(tiny_model_dir, str(adapter), style)
    assert proc.stdout == expected + "\n"
    assert expected.startswith(style.resolved_prefill)
    assert expected == merged_reference(tiny_model_dir, adapter, tmp_path, style)
    assert expected != native(tiny_model_dir, None, style), "the adapter changed nothing"


def test_base_resolution(adapter, tiny_model_dir, tmp_path):
    assert resolve_base(adapter, base_dir=tmp_path / "none") == str(tiny_model_dir)
    assert resolve_base(adapter, "other/model") == "other/model"
    base_dir = tmp_path / "models/base"
    base_dir.mkdir(parents=True)
    (base_dir / "MODEL_INFO.json").write_text(json.dumps({"source": str(tiny_model_dir)}))
    assert resolve_base(adapter, base_dir=base_dir) == str(base_dir)


def test_bundled_base_missing_is_a_clear_error(adapter, tmp_path):
    bundled = tmp_path / "adapter"
    bundled.mkdir()
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        (bundled / name).write_bytes((adapter / name).read_bytes())
    cfg = json.loads((bundled / "adapter_config.json").read_text())
    (bundled / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": "smollm2-135m-instruct"}))
    proc = infer("--adapter", str(bundled), "--prompt", QUESTION, cwd=tmp_path)
    assert proc.returncode == 2
    assert "dvc pull models/base" in proc.stderr
