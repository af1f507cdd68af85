"""The GRPO loop end to end on a tiny random Qwen2 in real bitsandbytes 4-bit on CPU: it learns only
LoRA weights, writes resumable checkpoints, resumes to the same adapter, and does not resume another
run's checkpoints. Faults (OOM storms, failed or truncated checkpoint writes) are in tests/faults/."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpo.measured import is_measured
from grpo.train.checkpoint import list_checkpoints
from grpo.train.tracking import logged
from grpo.trainlog import read_steps, read_summary, read_validation
from tests.train.harness import final_weights, killed_at, params, run



def test_trains_only_lora_and_writes_outputs(tmp_path, tiny_model_dir):
    trainer = run(tmp_path, tiny_model_dir, params(), "plain")
    lora = {id(p) for p in trainer.parts.lora_params}
    assert all(not p.requires_grad for p in trainer.model.parameters() if id(p) not in lora)
    assert all(p.dtype == torch.float32 for p in trainer.parts.lora_params)
    weights = final_weights(tmp_path, "plain")
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in weights.items())
    summary = read_summary(tmp_path / "plain/metrics")
    assert summary["steps"] == 3 and summary["step"] == 3 and summary["verify_timeouts"] == 0
    steps = read_steps(tmp_path / "plain/metrics")
    zero_std = [row["frac_reward_zero_std"] for row in steps]
    assert summary["frac_reward_zero_std_mean"] == pytest.approx(sum(zero_std) / 3, abs=1e-6)
    by_stage = {}
    for row, value in zip(steps, zero_std):
        by_stage.setdefault(str(int(row["curriculum_stage"])), []).append(value)
    assert summary["frac_reward_zero_std_by_stage"] == pytest.approx(
        {stage: sum(v) / len(v) for stage, v in by_stage.items()}, abs=1e-6)
    assert [row["step"] for row in steps] == [1, 2, 3]
    # TRL's names (beta > 0: kl; mu = 2: a clipped ratio), and results only: no timing or memory figure
    assert {"reward", "reward_std", "completions/mean_length", "completions/clipped_ratio", "clip_ratio/low_mean",
            "clip_ratio/high_mean", "kl", "entropy", "rewards/digit_share/mean", "learning_rate",
            "grad_norm", "verify_timeouts"} <= set(steps[0])
    assert not [key for key in steps[0] if is_measured(key)]
    assert summary["reward"] == steps[-1]["reward"] and summary["rewards"]["digit_share"]["mean"] == \
        steps[-1]["rewards/digit_share/mean"]
    measured = json.loads((tmp_path / "plain/logs/train.json").read_text())
    assert [row["step"] for row in measured["steps"]] == [1, 2, 3]
    assert all(f"peak_memory_gib/{phase}" in measured["steps"][0] for phase in ("generate", "score", "train"))
    # each figure is rounded to 6 places on its own (grpo.io.round_floats), hence the tolerance
    assert measured["time_generate_s"] == pytest.approx(sum(r["time_generate_s"] for r in measured["steps"]), abs=1e-5)
    validation = read_validation(tmp_path / "plain/metrics")
    assert [row["step"] for row in validation] == [2, 3] and {"accuracy", "format_rate"} <= set(validation[0])
    # last checkpoint (keep_last 1) plus the validated steps, which keep only their adapter
    kept = {c.name: sorted(p.name for p in c.iterdir()) for c in list_checkpoints(tmp_path / "plain/checkpoints")}
    assert kept["step-000003"] == ["adapter", "state.json", "trainer_state.pt"]
    assert kept["step-000002"] == ["adapter", "state.json"]
    assert "step-000001" not in kept
    # checkpoints are DVC outputs: a rerun on the same inputs must write the same bytes, so no timings
    state = json.loads((tmp_path / "plain/checkpoints/step-000003/state.json").read_text())
    assert len(state["history"]) == 3 and not [k for row in state["history"] for k in row if is_measured(k)]


def test_logged_names_are_trls_and_never_a_measured_figure():
    row = {"step": 4, "reward_mean": 0.1234567891, "reward/correctness": 1.0, "truncated_frac": 0.5, "kl_mean": 0.0,
           "clip_frac_low": 0.25, "lr": 1e-4, "accuracy": 1.0, "time_train_s": 3.5, "peak_memory_gib/train": 1.5}
    assert logged(row) == {"reward": 0.123457, "rewards/correctness/mean": 1.0, "completions/clipped_ratio": 0.5,
                           "kl": 0.0, "clip_ratio/low_mean": 0.25, "learning_rate": 1e-4, "accuracy": 1.0}
    assert logged({"step": 4, "checkpoint": "step-000004", "accuracy": 0.5}, "eval/") == {"eval/accuracy": 0.5}


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resume_after_crash_gives_the_same_adapter_and_logs(tmp_path, tiny_model_dir):
    run(tmp_path, tiny_model_dir, params(), "uninterrupted")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, tiny_model_dir, params(), "resumed", killed_at(3))  # after the step-2 checkpoint
    # DVCLive wrote each step as it finished, so `dvc exp show` / `dvc plots` follow a running experiment
    assert [row["step"] for row in read_steps(tmp_path / "resumed/metrics")] == [1, 2]
    assert read_summary(tmp_path / "resumed/metrics")["step"] == 2
    trainer = run(tmp_path, tiny_model_dir, params(), "resumed")
    assert len(trainer.history) == 3
    expected, got = final_weights(tmp_path, "uninterrupted"), final_weights(tmp_path, "resumed")
    assert expected.keys() == got.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)
    # the whole log (DVCLive's summary and per-step files, the samples) equals the uninterrupted run's
    logs = tree(tmp_path / "uninterrupted/metrics")
    assert "metrics.json" in logs and "plots/metrics/eval/accuracy.tsv" in logs and "samples.jsonl" in logs
    assert tree(tmp_path / "resumed/metrics") == logs
    assert [r["step"] for r in json.loads((tmp_path / "resumed/logs/train.json").read_text())["steps"]] == [1, 2, 3]


def test_other_run_checkpoints_are_not_resumed(tmp_path, tiny_model_dir):
    run(tmp_path, tiny_model_dir, params(), "run")
    trainer = run(tmp_path, tiny_model_dir, params(lr=5e-3), "run")  # same folder, new params
    assert len(trainer.history) == 3 and trainer.history[0]["step"] == 1


def test_compiled_layers_take_the_eager_step_and_generation_stays_eager(tmp_path, tiny_model_dir):
    """train.compile_layers runs the scoring pass (β > 0: the reference under lora_disabled; μ = 2: old
    log-probs) and both updates through torch.compile'd decoder layers (real inductor on the CPU, 4-bit
    layers, LoRA and checkpointing inside them): two steps, on the same rollouts, have the eager run's KL,
    entropy, ratio and gradient norm, so the second step's rollouts, decoded by HF generate from the
    updated policy outside the compiled block, are the eager run's too. Dynamo really compiled graphs, and
    after the run every layer is back on its own forward, keeping its one compiled function."""
    from torch._dynamo.utils import counters

    from grpo.model.compiled import decoder_layers

    two = {"max_steps": 2, "val_every": 10, "dense_generation": False}
    eager = run(tmp_path, tiny_model_dir, params(**two), "eager").history
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    trainer = run(tmp_path, tiny_model_dir, params(**two, compile_layers=True), "compiled")
    assert counters["stats"]["unique_graphs"] > graphs and sum(counters["graph_break"].values()) == breaks
    for step, (got, expected) in enumerate(zip(trainer.history, eager)):
        assert got["reward_mean"] == expected["reward_mean"], step  # the same rollouts
        for key in ("kl_mean", "grad_norm", "entropy_mean", "ratio_mean"):
            assert got[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), (step, key)
    layers = decoder_layers(trainer.model)
    assert layers and all("forward" not in vars(layer) for layer in layers)
    assert len({id(layer._compiled_forward) for layer in layers}) == len(layers)


def test_dense_training_in_compiled_checkpointed_layers_takes_the_4bit_step(tmp_path, tiny_model_dir):
    """The 8 GB preset's training: β = 0 and μ = 1 (no scoring pass, so the first pass that touches a layer is a
    checkpointed training forward), compiled layers and a dense copy. The copy must exist before that forward:
    made inside it, the compiled layer's backward recomputed along another branch and torch.utils.checkpoint
    rejected the step (an H100 run failed so). Both steps take the eager 4-bit run's gradient norm, entropy and
    ratio; the copies are those of the layers without an adapter, kept for the run."""
    from grpo.model.dequant import adapter_free, linear4bit_modules

    preset = {"max_steps": 2, "val_every": 10, "dense_generation": False, "beta": 0.0, "num_iterations": 1,
              "gradient_checkpointing": True}
    eager = run(tmp_path, tiny_model_dir, params(**preset), "eager").history
    trainer = run(tmp_path, tiny_model_dir, params(**preset, compile_layers=True, dense_training=True), "dense")
    assert len(trainer.history) == len(eager) == 2
    for step, (got, expected) in enumerate(zip(trainer.history, eager)):
        assert got["reward_mean"] == expected["reward_mean"], step
        for key in ("grad_norm", "entropy_mean", "ratio_mean"):
            assert got[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), (step, key)
    free = adapter_free(trainer.model)
    assert free and all(hasattr(m, "_dense_weight") == (m in free) for m in linear4bit_modules(trainer.model))


def test_dense_training_takes_the_4bit_step(tmp_path, tiny_model_dir):
    """train.dense_training runs the scoring pass (β > 0: the reference under lora_disabled; μ = 2: old
    log-probs) and the updates on a dense copy of the 4-bit base: the first step, on the same rollouts,
    has the 4-bit path's KL, entropy, ratio and gradient norm; generation decodes with HF generate and no cached
    copy (dense_generation off), so only the layers without an adapter have a copy, kept after training."""
    from grpo.model.dequant import adapter_free, linear4bit_modules

    one = {"max_steps": 1, "val_every": 10, "dense_generation": False}
    quantised = run(tmp_path, tiny_model_dir, params(**one), "nf4").history[0]
    trainer = run(tmp_path, tiny_model_dir, params(**one, dense_training=True), "dense")
    dense = trainer.history[0]
    assert dense["reward_mean"] == quantised["reward_mean"]  # the same rollouts
    for key in ("kl_mean", "grad_norm", "entropy_mean", "ratio_mean"):
        assert dense[key] == pytest.approx(quantised[key], rel=1e-4, abs=1e-6), key
    free = adapter_free(trainer.model)
    assert free and all(hasattr(m, "_dense_weight") == (m in free) for m in linear4bit_modules(trainer.model))
