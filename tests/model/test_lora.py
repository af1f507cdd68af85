"""Hand-written LoRA: the math against a by-hand reference, PEFT-style init and names, freezing,
the disabled (reference) path, state-dict round trips and merging."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from grpo.model import (
    LoRALinear,
    inject_lora,
    load_lora_state_dict,
    load_policy_model,
    lora_disabled,
    lora_modules,
    lora_parameters,
    lora_state_dict,
)
from grpo.model.lora import lora_tf32
from tests.model.merge import merge_lora_

TARGETS = ["q_proj", "v_proj", "down_proj"]


def randomize_lora(model: nn.Module, seed: int = 1) -> None:
    """Non-zero B (fresh adapters are exact no-ops, which would hide every bug)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lora_parameters(model):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def logits(model: nn.Module, seed: int = 0) -> torch.Tensor:
    ids = torch.randint(3, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.mark.parametrize("use_rslora, scaling", [(False, 16 / 4), (True, 16 / math.sqrt(4))])
def test_lora_linear_matches_hand_computation(use_rslora, scaling):
    torch.manual_seed(0)
    base = nn.Linear(12, 6)
    layer = LoRALinear(base, r=4, alpha=16, use_rslora=use_rslora)
    assert layer.scaling == pytest.approx(scaling)
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(3, 5, 12)
    W, b, A, B = base.weight, base.bias, layer.lora_A, layer.lora_B
    expected = x @ W.T + b + (x @ A.T @ B.T) * scaling
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-5)
    layer.disabled = True
    torch.testing.assert_close(layer(x), base(x), rtol=0, atol=0)


def test_lora_branch_is_fp32_over_a_bf16_base():
    torch.manual_seed(0)
    base = nn.Linear(16, 8).to(torch.bfloat16)
    layer = LoRALinear(base, r=2, alpha=4)
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16
    assert layer.lora_A.dtype == layer.lora_B.dtype == torch.float32
    expected = base(x).float() + (x.float() @ layer.lora_A.T @ layer.lora_B.T) * 2
    torch.testing.assert_close(y.float(), expected, rtol=1e-2, atol=2e-2)
    y.float().sum().backward()
    assert layer.lora_A.grad.dtype == layer.lora_B.grad.dtype == torch.float32
    assert not base.weight.requires_grad and base.weight.grad is None


def _branch_and_grads(device: str) -> tuple[torch.Tensor, ...]:
    """A bf16 base with a wide fp32 LoRA branch: its output and gradients (long sums, so TF32 shows)."""
    torch.manual_seed(0)  # nn.Linear's init
    gen = torch.Generator().manual_seed(0)
    layer = LoRALinear(nn.Linear(1024, 512).to(torch.bfloat16), r=16, alpha=32, generator=gen).to(device)
    with torch.no_grad():
        layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=gen))
    x = torch.randn(256, 1024, generator=gen).to(device=device, dtype=torch.bfloat16)
    y = layer(x)
    y.float().square().sum().backward()
    return y, layer.lora_A.grad, layer.lora_B.grad


def test_lora_tf32_sets_cuda_fp32_matmuls_for_the_block_only():
    """train.lora_tf32: TF32 inside the block, the previous setting after (an error included), nothing
    when off; a CPU computes exactly what it computes without it."""
    before = torch.backends.cuda.matmul.fp32_precision
    with lora_tf32(False):
        assert torch.backends.cuda.matmul.fp32_precision == before
    with pytest.raises(RuntimeError, match="inside"), lora_tf32(True):
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        raise RuntimeError("inside")
    assert torch.backends.cuda.matmul.fp32_precision == before
    exact = _branch_and_grads("cpu")
    with lora_tf32(True):
        on_cpu = _branch_and_grads("cpu")
    assert all(torch.equal(a, b) for a, b in zip(exact, on_cpu))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 is a CUDA tensor-core format")
def test_lora_tf32_rounds_the_branch_within_tf32s_precision():
    """On CUDA the branch and its gradients change (the flag reaches forward and autograd's backward) by
    about TF32's rounding (10 mantissa bits: ~1e-3 relative), not more."""
    exact = _branch_and_grads("cuda")
    with lora_tf32(True):
        tf32 = _branch_and_grads("cuda")
    for a, b in zip(exact, tf32):
        assert not torch.equal(a, b)
        torch.testing.assert_close(b.float(), a.float(), rtol=1e-2, atol=1e-2 * a.float().abs().max().item())


def test_init_is_peft_like_and_seeded_without_touching_global_rng(tiny_model_dir):
    def fresh(seed):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        rng = torch.random.get_rng_state()
        inject_lora(model, targets=TARGETS, r=4, alpha=8, seed=seed)
        assert torch.equal(torch.random.get_rng_state(), rng)
        return model

    a, b, c = fresh(0), fresh(0), fresh(1)
    for (name, la), lb, lc in zip(lora_modules(a).items(), lora_modules(b).values(), lora_modules(c).values()):
        assert torch.equal(la.lora_A, lb.lora_A), name
        assert not torch.equal(la.lora_A, lc.lora_A), name
        assert torch.count_nonzero(la.lora_B) == 0
        # kaiming_uniform(a=sqrt(5)) draws from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as nn.Linear and PEFT do
        assert la.lora_A.abs().max() <= 1 / math.sqrt(la.in_features)


def test_inject_freezes_base_names_modules_and_is_a_no_op_at_init(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    reference = logits(model)
    names = inject_lora(model, targets=TARGETS, r=4, alpha=8)
    assert names == [
        f"model.layers.{i}.{path}"
        for i in range(2)
        for path in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")
    ]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.lora_{ab}" for n in names for ab in "AB"}
    assert [id(p) for p in lora_parameters(model)] == [
        id(p) for n in names for p in (model.get_submodule(n).lora_A, model.get_submodule(n).lora_B)
    ]
    torch.testing.assert_close(logits(model), reference, rtol=0, atol=0)


def test_inject_errors_name_the_target(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match="qkv_proj"):
        inject_lora(model, targets=["q_proj", "qkv_proj"], r=4, alpha=8)
    with pytest.raises(ValueError, match="'mlp'.*not a linear layer"):
        inject_lora(model, targets=["mlp"], r=4, alpha=8)
    with pytest.raises(ValueError, match="empty"):
        inject_lora(model, targets=[], r=4, alpha=8)
    inject_lora(model, targets=["q_proj"], r=4, alpha=8)
    with pytest.raises(ValueError, match="already has LoRA"):
        inject_lora(model, targets=["k_proj"], r=4, alpha=8)


def test_lora_disabled_gives_exactly_the_base_logits(tiny_model_dir):
    model = load_policy_model(tiny_model_dir, quantization="nf4", compute_dtype="float32", device="cpu")
    base = logits(model)
    inject_lora(model, targets=TARGETS, r=4, alpha=8)
    randomize_lora(model)
    adapted = logits(model)
    assert (adapted - base).abs().max() > 1e-3
    with lora_disabled(model):
        torch.testing.assert_close(logits(model), base, rtol=0, atol=0)
    torch.testing.assert_close(logits(model), adapted, rtol=0, atol=0)
    with pytest.raises(RuntimeError), lora_disabled(model):
        raise RuntimeError("an error inside the block still re-enables LoRA")
    assert not any(m.disabled for m in lora_modules(model).values())


def test_state_dict_uses_peft_names_and_round_trips(tiny_model_dir):
    source = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    inject_lora(source, targets=TARGETS, r=4, alpha=8)
    randomize_lora(source)
    sd = lora_state_dict(source)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in sd
    assert sd["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"].shape == (128, 4)
    assert len(sd) == 2 * 2 * len(TARGETS)
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in sd.values())

    target = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    inject_lora(target, targets=TARGETS, r=4, alpha=8, seed=7)
    load_lora_state_dict(target, sd)
    torch.testing.assert_close(logits(target), logits(source), rtol=0, atol=0)

    with pytest.raises(ValueError, match="1 missing"):
        load_lora_state_dict(target, {k: v for k, v in list(sd.items())[1:]})
    with pytest.raises(ValueError, match="1 unexpected"):
        load_lora_state_dict(target, {**sd, "base_model.model.extra.lora_A.weight": torch.zeros(1)})
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    with pytest.raises(ValueError, match=r"q_proj.lora_A.weight: shape \(8, 128\)"):
        load_lora_state_dict(target, {**sd, key: torch.zeros(8, 128)})


def test_merge_gives_the_unmerged_logits(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    inject_lora(model, targets=TARGETS, r=4, alpha=8, use_rslora=True)
    randomize_lora(model)
    unmerged = logits(model)
    merge_lora_(model)
    assert not lora_modules(model)
    assert type(model.model.layers[0].self_attn.q_proj) is nn.Linear
    torch.testing.assert_close(logits(model), unmerged, rtol=0, atol=1e-5)


def test_merge_refuses_a_4bit_base(tiny_model_dir):
    model = load_policy_model(tiny_model_dir, quantization="nf4", compute_dtype="float32", device="cpu")
    inject_lora(model, targets=["q_proj"], r=4, alpha=8)
    with pytest.raises(ValueError, match="Linear4bit.*unquantised"):
        merge_lora_(model)
