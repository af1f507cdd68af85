"""Every list of choices in params.yaml has one source, the code that implements the choices: each
value the config accepts reaches a distinct implementation, and a value it does not know is refused."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from grpo.algo.choices import ADVANTAGE_SCALES, LOSS_TYPES
from grpo.algo.objective import compute_advantages, grpo_loss, loss_normaliser
from grpo.config import BENCHMARKS, DATASETS, ConfigError, parse_section
from grpo.data.registry import EVAL, get_spec
from grpo.eval.summary import MODELS
from grpo.model.loading import load_policy_model, load_tokenizer
from grpo.model.lora import inject_lora
from grpo.prompts import PromptStyle
from grpo.rollout.base import ENGINE_KINDS, GENERATION_BACKENDS, SamplingParams
from grpo.rollout.engines import resolve_engine_kind
from grpo.rollout.native import NativeEngine
from grpo.sent.curriculum import ORDER_KEYS, order_easy_to_hard
from grpo.train.parts import build_parts
from grpo.verify.rewards import REWARD_FUNCTIONS, compute_rewards

SAMPLE = {"answer": "4", "answer_type": "integer"}
COMPLETION = "<reasoning>\n2 + 2\n</reasoning>\n<answer>\n4\n</answer>"


def accepted(section: str, key: str, value) -> None:
    assert getattr(parse_section(section, {key: value}), key) == value


@pytest.mark.parametrize("name", list(REWARD_FUNCTIONS))
def test_each_reward_name_runs_its_registered_function(name):
    accepted("train", "rewards", {name: 1.0})
    scored = compute_rewards([COMPLETION], [SAMPLE], {name: 1.0}, ["stop"], [150], 160)
    expected = REWARD_FUNCTIONS[name](COMPLETION, SAMPLE, finish_reason="stop", num_tokens=150, max_tokens=160)
    assert scored.per_fn == {name: [expected.value]} and scored.reasons[0] == {name: expected.reason}


def test_a_reward_of_ones_own_is_a_part_and_unknown_names_are_refused(tiny_model_dir, tmp_path):
    def constant(completion, sample, **_):
        from grpo.verify.rewards import RewardResult
        return RewardResult(0.25, "constant")

    params = dataclasses.replace(parse_section("train", {}), rewards={"constant": 1.0, "correctness": 2.0})
    parts = build_parts(params, PromptStyle("tagged"), tiny_model_dir, tmp_path / "live", tmp_path / "m.json",
                        ["a"], None, reward_functions={**REWARD_FUNCTIONS, "constant": constant})
    assert parts.rewards == {"constant": constant, "correctness": REWARD_FUNCTIONS["correctness"]}
    with pytest.raises(ConfigError, match="train.rewards: got {'constant': 1.0}"):
        parse_section("train", {"rewards": {"constant": 1.0}})  # registered only for that build


def test_each_loss_type_has_its_own_aggregation():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    lp = torch.log(torch.tensor([[0.5, 0.4, 0.3], [0.2, 0.9, 0.9]]))
    advantages = torch.tensor([1.0, -1.0])
    losses = {}
    for loss_type in LOSS_TYPES:
        accepted("train", "loss_type", loss_type)
        assert loss_normaliser(loss_type, mask, 4) > 0
        losses[loss_type] = grpo_loss(lp, lp.detach() - 0.1, advantages, mask, loss_type=loss_type,
                                      max_completion_length=4).loss.item()
    # bnpo and dapo share one normaliser within a single micro-batch; the others each differ
    assert len({round(v, 9) for v in losses.values()}) == len(LOSS_TYPES) - 1


def test_each_advantage_scale_scales_differently():
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0, 3.0])
    results = []
    for scale in ADVANTAGE_SCALES:
        accepted("train", "advantage_scale", scale)
        results.append(tuple(round(v, 6) for v in compute_advantages(rewards, 3, scale).advantages.tolist()))
    assert len(set(results)) == len(ADVANTAGE_SCALES)


def test_each_engine_kind_resolves_to_an_engine():
    for section in ("sent", "evaluate"):
        for kind in ENGINE_KINDS:
            accepted(section, "engine", kind)
    # serves_adapters on a CPU: auto is native without importing vLLM (grpo/rollout/engines.py)
    on_cpu = not torch.cuda.is_available()
    concrete = {kind: resolve_engine_kind(kind, serves_adapters=on_cpu) for kind in ENGINE_KINDS}
    assert set(concrete.values()) <= {"vllm", "native"}
    assert concrete["vllm"] == "vllm" and concrete["native"] == "native"


def test_each_generation_backend_decodes(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_policy_model(tiny_model_dir, quantization="none", compute_dtype="float32", device="cpu")
    inject_lora(model, targets=["q_proj"], r=2, alpha=4.0, dropout=0.0, seed=0)
    outputs = {}
    for backend in GENERATION_BACKENDS:
        accepted("train", "generation_backend", backend)
        engine = NativeEngine(model, tokenizer, batch_size=2, backend=backend)
        (group,) = engine.generate(["1 + 1 ="], SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=3))
        outputs[backend] = [c.token_ids for c in group]
    # auto is generate on a CPU; the static decoder samples the same keyed tokens (tests/rollout)
    assert outputs["auto"] == outputs["hf"] and all(len(ids) for ids in outputs["static"])


def test_each_sent_order_ranks_differently():
    scores = [{"id": "sure", "entropy": 0.0, "pass_rate": 1.0}, {"id": "mixed", "entropy": 1.0, "pass_rate": 0.5}]
    orders = set()
    for order in ORDER_KEYS:
        accepted("sent", "order", order)
        orders.add(tuple(order_easy_to_hard(scores, seed=0, order=order)))
    assert len(orders) == len(ORDER_KEYS)


def test_each_dataset_and_benchmark_is_in_the_registry():
    for name in DATASETS:
        assert get_spec(name).name == name
    assert BENCHMARKS and all(EVAL in get_spec(name).splits for name in BENCHMARKS)
    accepted("prepare", "benchmarks", list(BENCHMARKS))


def test_the_evaluated_models_are_the_summary_rows_and_the_report_columns():
    from grpo.report import MODELS as REPORT_MODELS
    assert REPORT_MODELS is MODELS and MODELS == ("base", "final", "best")
