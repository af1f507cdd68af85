"""Adapter folders: PEFT loads what we save (same logits), we load it back into a 4-bit base, mismatches
and corrupt files fail loudly, saves are atomic, and merge-and-export keeps the logits."""
from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo.model import (
    LoraSettings,
    inject_lora,
    load_adapter,
    load_policy_model,
    lora_modules,
    lora_parameters,
    read_adapter_config,
    save_adapter,
)
from grpo.model import adapter as adapter_module
from tests.model.merge import merge_and_export

BASE_NAME = "tests/tiny-qwen2"
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def randomize_lora(model: torch.nn.Module, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lora_parameters(model):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(3, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def trained_fp32_model(model_dir, settings: LoraSettings) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    inject_lora(
        model, targets=list(settings.targets), r=settings.r, alpha=settings.alpha,
        dropout=settings.dropout, use_rslora=settings.use_rslora,
    )
    randomize_lora(model)
    return model.eval()


def nf4(model_dir) -> torch.nn.Module:
    return load_policy_model(model_dir, quantization="nf4", compute_dtype="float32", device="cpu").eval()


@pytest.fixture(scope="module")
def saved_adapter(tiny_model_dir, tmp_path_factory):
    """An adapter saved from a 4-bit model, and that model's logits (tests must not change the folder)."""
    settings = LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj"))
    model = nf4(tiny_model_dir)
    inject_lora(model, targets=list(settings.targets), r=settings.r, alpha=settings.alpha)
    randomize_lora(model)
    out_dir = tmp_path_factory.mktemp("saved") / "adapter"
    out = save_adapter(model, out_dir, base_model_name_or_path=BASE_NAME, lora_config=settings)
    return out, logits(model)


@pytest.mark.parametrize("use_rslora", [False, True])
def test_peft_loads_our_adapter_with_the_same_logits(tiny_model_dir, tmp_path, use_rslora):
    from peft import PeftModel

    settings = LoraSettings(r=4, alpha=8, dropout=0.1, targets=ALL_TARGETS, use_rslora=use_rslora)
    ours = trained_fp32_model(tiny_model_dir, settings)
    adapter_dir = save_adapter(ours, tmp_path / "adapter", base_model_name_or_path=BASE_NAME, lora_config=settings)

    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM"
    assert (cfg["r"], cfg["lora_alpha"], cfg["lora_dropout"], cfg["use_rslora"]) == (4, 8, 0.1, use_rslora)
    assert cfg["target_modules"] == sorted(ALL_TARGETS) and cfg["base_model_name_or_path"] == BASE_NAME
    weights = load_file(adapter_dir / "adapter_model.safetensors")
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in weights
    assert all(t.dtype == torch.float32 for t in weights.values())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter_dir)
    assert not [w for w in caught if "peft" in w.filename], [str(w.message) for w in caught]
    peft_model.eval()
    torch.testing.assert_close(logits(peft_model), logits(ours), rtol=0, atol=1e-5)


def test_load_adapter_into_a_fresh_4bit_base(tiny_model_dir, saved_adapter):
    adapter_dir, expected = saved_adapter
    model = nf4(tiny_model_dir)
    settings = load_adapter(model, adapter_dir, expected_base=BASE_NAME)
    assert settings == LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj"))
    assert len(lora_modules(model)) == 4
    torch.testing.assert_close(logits(model), expected, rtol=0, atol=0)

    # into a model that already has matching LoRA layers (resuming training)
    model = nf4(tiny_model_dir)
    inject_lora(model, targets=["v_proj", "q_proj"], r=4, alpha=8, seed=3)
    load_adapter(model, adapter_dir)
    torch.testing.assert_close(logits(model), expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "inject, pattern",
    [
        (dict(targets=["q_proj", "v_proj"], r=8, alpha=16), r"r mismatch: .*adapter has r=4, .* have r=\[8\]"),
        (dict(targets=["q_proj"], r=4, alpha=8), r"target_modules mismatch: .*has \['q_proj', 'v_proj'\].* are \['q_proj'\]"),
        (dict(targets=["q_proj", "v_proj", "o_proj"], r=4, alpha=8), r"target_modules mismatch"),
        (dict(targets=["q_proj", "v_proj"], r=4, alpha=8, use_rslora=True), r"lora_alpha/use_rslora mismatch"),
    ],
)
def test_load_adapter_rejects_a_model_with_other_lora_layers(tiny_model_dir, saved_adapter, inject, pattern):
    adapter_dir, _ = saved_adapter
    model = nf4(tiny_model_dir)
    inject_lora(model, **inject)
    with pytest.raises(ValueError, match=pattern) as info:
        load_adapter(model, adapter_dir)
    assert str(adapter_dir) in str(info.value)


def test_load_adapter_rejects_another_base_and_corrupt_files(tiny_model_dir, saved_adapter, tmp_path):
    adapter_dir, _ = saved_adapter
    with pytest.raises(ValueError, match="base_model_name_or_path mismatch") as info:
        load_adapter(nf4(tiny_model_dir), adapter_dir, expected_base="Qwen/Qwen2.5-0.5B")
    assert all(s in str(info.value) for s in (str(adapter_dir), BASE_NAME, "Qwen/Qwen2.5-0.5B"))

    truncated = tmp_path / "truncated"
    shutil.copytree(adapter_dir, truncated)
    weights = truncated / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated.*adapter_model.safetensors.*not a readable safetensors"):
        load_adapter(nf4(tiny_model_dir), truncated)

    bad_json = tmp_path / "bad_json"
    shutil.copytree(adapter_dir, bad_json)
    (bad_json / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad_json.*adapter_config.json.*invalid JSON"):
        read_adapter_config(bad_json)

    dora = tmp_path / "dora"
    shutil.copytree(adapter_dir, dora)
    cfg = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora=True is not supported"):
        read_adapter_config(dora)

    with pytest.raises(FileNotFoundError, match="not an adapter folder"):
        read_adapter_config(tmp_path)


def test_save_adapter_is_atomic_and_checks_its_settings(tiny_model_dir, saved_adapter, monkeypatch):
    adapter_dir, _ = saved_adapter
    before = {p.name: p.read_bytes() for p in adapter_dir.iterdir()}
    model = nf4(tiny_model_dir)
    inject_lora(model, targets=["q_proj", "v_proj"], r=4, alpha=8)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(adapter_module, "save_file", crash)
    settings = LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj"))
    with pytest.raises(OSError, match="disk full"):
        save_adapter(model, adapter_dir, base_model_name_or_path=BASE_NAME, lora_config=settings)
    assert {p.name: p.read_bytes() for p in adapter_dir.iterdir()} == before
    assert sorted(p.name for p in adapter_dir.parent.iterdir()) == ["adapter"]  # no temp folder left

    with pytest.raises(ValueError, match="r mismatch"):
        wrong_rank = LoraSettings(r=8, alpha=8, targets=("q_proj", "v_proj"))
        save_adapter(model, adapter_dir, base_model_name_or_path=BASE_NAME, lora_config=wrong_rank)
    with pytest.raises(ValueError, match="no LoRA layers"):
        save_adapter(nf4(tiny_model_dir), adapter_dir, base_model_name_or_path=BASE_NAME, lora_config=settings)


def test_merge_and_export_gives_the_unmerged_logits(tiny_model_dir, tmp_path):
    settings = LoraSettings(r=4, alpha=8, targets=ALL_TARGETS, use_rslora=True)
    ours = trained_fp32_model(tiny_model_dir, settings)
    adapter_dir = save_adapter(ours, tmp_path / "adapter", base_model_name_or_path=BASE_NAME, lora_config=settings)

    out = merge_and_export(tiny_model_dir, adapter_dir, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not lora_modules(merged)
    assert merged.config.use_cache is True
    torch.testing.assert_close(logits(merged), logits(ours), rtol=0, atol=1e-5)
    assert AutoTokenizer.from_pretrained(out).chat_template
