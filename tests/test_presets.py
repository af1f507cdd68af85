"""Presets: each is a complete, valid params file; one command switches params.yaml to it; an unknown
name is a clear error with a non-zero exit; each plans within the memory of the card it is named for."""
from __future__ import annotations

import pytest

from grpo.config import SECTIONS, load_params
from grpo.preset import PRESETS, available, main

TARGET_GIB = {"rtx3060ti-8gb": 8, "h200": 141, "rocm-bf16-llama8b": 24}
CPU_PRESETS = ["arith-cpu"]


def test_the_documented_presets_exist():
    assert available() == sorted([*TARGET_GIB, *CPU_PRESETS])


@pytest.mark.parametrize("name", sorted([*TARGET_GIB, *CPU_PRESETS]))
def test_preset_passes_validation_of_every_section(name):
    params = load_params(PRESETS / f"{name}.yaml", list(SECTIONS))
    assert set(params) == set(SECTIONS)


def test_rtx3060ti_preset_is_the_8gb_recipe():
    p = load_params(PRESETS / "rtx3060ti-8gb.yaml", list(SECTIONS))
    t = p["train"]
    assert p["model"].source == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B" and p["prompt"].style == "r1"
    assert (t.quantization, t.group_size, t.max_response_length, t.lora.r) == ("nf4", 4, 768, 16)
    assert sorted(t.lora.targets) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert t.prompts_per_step * t.group_size // t.train_batch_size == 4  # gradient-accumulation micro-batches
    assert "r1_format" in t.rewards and "correctness" in t.rewards


def test_rocm_preset_is_the_llama_run_card():
    p = load_params(PRESETS / "rocm-bf16-llama8b.yaml", list(SECTIONS))
    t = p["train"]
    assert p["model"].source == "meta-llama/Llama-3.1-8B-Instruct" and t.quantization == "none"
    assert (t.lora.r, t.group_size, t.lr, t.max_steps) == (32, 6, 5e-6, 250)
    assert t.prompts_per_step * t.group_size // t.train_batch_size == 2
    assert sorted(t.rewards) == sorted(["correctness", "integer_answer", "tagged_format_strict",
                                        "tagged_format_soft", "tag_count"])


def test_arith_cpu_preset_is_the_default_model_on_the_synthetic_task():
    preset = load_params(PRESETS / "arith-cpu.yaml", list(SECTIONS))
    default = load_params(PRESETS.parent / "params.yaml", list(SECTIONS))
    assert preset["model"] == default["model"]
    assert (preset["prompt"].style, preset["prompt"].prefill) == (default["prompt"].style, default["prompt"].prefill)
    assert preset["prepare"].train_sources == ["arith"] and "arith" in preset["prepare"].benchmarks
    assert preset["prepare"].benchmarks == default["prepare"].benchmarks  # the evaluate matrix of dvc.yaml
    assert preset["prepare"].arith_levels == [0] and preset["prepare"].max_eval["arith"] == 256
    assert (preset["train"].lr, preset["train"].group_size) == (1e-3, 4)  # the settings of the +12.5-point run
    # nf4 cost the 135M model its arithmetic; unquantised, the final adapter gains ~+63 points (bench/RESULTS.md)
    assert preset["train"].quantization == "none"
    assert preset["sent"].order == "signal"


def test_arith_cpu_prompt_asks_for_what_the_rewards_parse():
    from grpo.prompts import TAGGED_SYSTEM_PROMPT, PromptStyle, full_response
    from grpo.verify.rewards import compute_rewards

    p = load_params(PRESETS / "arith-cpu.yaml", list(SECTIONS))
    prompt, train = p["prompt"], p["train"]
    assert prompt.system_prompt.startswith(TAGGED_SYSTEM_PROMPT)  # the layout the format rewards check
    assert "only the final number" in prompt.system_prompt  # what integer_answer and correctness read
    # a completion that does what the prompt says, after the style's prefill, collects every reward
    style = PromptStyle(prompt.style, prompt.system_prompt, prompt.prefill)
    response = full_response(style, "7 + 5 = 12\n</reasoning>\n<answer>\n12\n</answer>")
    row = {"question": "Ava has 7 apples. Then Ava buys 5 more apples. How many apples does Ava have now?",
           "answer": "12", "answer_type": "integer"}
    rewards = compute_rewards([response], [row], train.rewards, ["stop"], [16], train.max_response_length)
    assert rewards.totals[0] == pytest.approx(sum(train.rewards.values()) - 0.5 * train.rewards["tag_count"])
    assert all(v[0] == (0.5 if name == "tag_count" else 1.0) for name, v in rewards.per_fn.items())


def test_h200_preset_is_larger_than_the_8gb_one():
    big = load_params(PRESETS / "h200.yaml", ["train"])["train"]
    small = load_params(PRESETS / "rtx3060ti-8gb.yaml", ["train"])["train"]
    assert big.group_size > small.group_size and big.max_response_length > small.max_response_length
    assert big.prompts_per_step > small.prompts_per_step


def test_switching_copies_the_preset_over_params_yaml(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("old: true\n")
    assert main(["rtx3060ti-8gb", "--params", str(params)]) == 0
    assert params.read_text() == (PRESETS / "rtx3060ti-8gb.yaml").read_text()


def test_unknown_preset_is_a_clear_error_and_leaves_params_alone(tmp_path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text("old: true\n")
    assert main(["rtx4090", "--params", str(params)]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'rtx4090'" in err and "rtx3060ti-8gb" in err
    assert params.read_text() == "old: true\n"


# grpo.check plans every stage, with the rows each engine puts in flight. rocm-bf16-llama8b has LoRA on the
# MLP too, and the static decoder folds MLP LoRA into a copy of each MLP (13 GiB at 8B) beside the 15 GiB
# bf16 base: above a 24 GB card even at one sequence. The fix is unmerged MLP LoRA in the static decoder
# (or the HF path) when the plan says the copy does not fit; strict, so a fix shows here.
TOO_LARGE = {"rocm-bf16-llama8b"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason="plans above its card"))
                                  if name in TOO_LARGE else name for name in sorted(TARGET_GIB)])
def test_preset_fits_its_card(name, capsys):
    from grpo.check import main as check

    assert check(["--params", str(PRESETS / f"{name}.yaml"), "--budget-gib", str(TARGET_GIB[name])]) == 0
    assert "fits: peak" in capsys.readouterr().out
