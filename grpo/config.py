"""A typed, validated view of params.yaml.

Each section is a dataclass; each field's type hint is the allowed type, and an optional ``check`` in
its metadata narrows the value. Loading collects every problem (unknown key, wrong type, value out of
range) and raises one ``ConfigError`` that names each key path and what is allowed, so a stage exits
non-zero before it writes anything. A stage validates only the sections it declares in dvc.yaml.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from grpo.algo.choices import ADVANTAGE_SCALES, LOSS_TYPES
from grpo.data.registry import EVAL, REGISTRY
from grpo.data.synthetic import ARITH_LEVELS
from grpo.prompts import STYLES
from grpo.rollout.base import ENGINE_KINDS, GENERATION_BACKENDS
from grpo.sent.curriculum import ORDER_KEYS
from grpo.verify.rewards import REWARD_FUNCTIONS

Check = Callable[[Any], str | None]  # returns what is allowed when the value is bad, else None


class ConfigError(ValueError):
    """One or more bad params; the message has one line per problem, each naming its key path."""


def _check(fn: Check, **kw: Any) -> Any:
    return field(metadata={"check": fn}, **kw)


def one_of(*allowed: Any) -> Check:
    return lambda v: None if v in allowed else f"one of {', '.join(map(repr, allowed))}"


def at_least(lo: float) -> Check:
    return lambda v: None if v >= lo else f"a number >= {lo}"


def positive(v: float) -> str | None:
    return None if v > 0 else "a number > 0"


def non_negative(v: float) -> str | None:
    return None if v >= 0 else "a number >= 0"


def open_unit(v: float) -> str | None:
    return None if 0 < v < 1 else "a number in the open interval (0, 1)"


def unit(v: float) -> str | None:
    return None if 0 <= v <= 1 else "a number in [0, 1]"


def half_open_unit(v: float) -> str | None:
    return None if 0 < v <= 1 else "a number in (0, 1]"


def optional(fn: Check) -> Check:
    return lambda v: None if v is None else fn(v)


def each(fn: Check) -> Check:
    def check(values: Any) -> str | None:
        items = values.values() if isinstance(values, dict) else values
        bad = [fn(v) for v in items if fn(v)]
        return f"entries each {bad[0]}" if bad else None

    return check


def non_empty(v: Any) -> str | None:
    return None if len(v) > 0 else "a non-empty list"


# Every list of choices comes from the place that implements the choices, so a new dataset, reward,
# loss type or engine is allowed here as soon as it exists there (docs/ARCHITECTURE.md).
DATASETS = tuple(REGISTRY)
BENCHMARKS = tuple(name for name, spec in REGISTRY.items() if EVAL in spec.splits)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
REWARDS = tuple(REWARD_FUNCTIONS)


def subset_of(allowed: tuple[Any, ...]) -> Check:
    kind = "names" if all(isinstance(a, str) for a in allowed) else "values"

    def check(values: Any) -> str | None:
        bad = [v for v in values if v not in allowed]
        return None if not bad else f"{kind} from {', '.join(map(str, allowed))} (got {', '.join(map(str, bad))})"

    return check


# SENT curriculum orders: learning signal first, or the seed engine's (grpo/sent/curriculum.py)
SENT_ORDERS = tuple(ORDER_KEYS)

# trackers that mirror the training log (DVCLive always writes it): grpo/train/tracking.py
REPORT_TO = ("wandb",)

# compute dtypes: auto is fp32 on CPU and bf16 on GPU (vLLM: the checkpoint's dtype)
DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass(frozen=True)
class ModelParams:
    # "smollm2-135m-instruct" (bundled offline default), a hub id ("org/name"), or a local folder.
    source: str = "smollm2-135m-instruct"
    revision: str | None = None
    dtype: str = _check(one_of("float32", "bfloat16", "float16"), default="float32")


@dataclass(frozen=True)
class PromptParams:
    style: str = _check(one_of(*STYLES), default="tagged")
    system_prompt: str | None = None  # None: the style's default; "": no system turn
    prefill: str | None = None  # None: the style's default (<think>\n or <reasoning>\n)


@dataclass(frozen=True)
class PrepareParams:
    source: str = _check(one_of("bundled", "hub", "auto"), default="auto")
    train_sources: list[str] = _check(lambda v: non_empty(v) or subset_of(DATASETS)(v), default_factory=lambda: ["gsm8k"])
    benchmarks: list[str] = _check(subset_of(BENCHMARKS), default_factory=lambda: ["gsm8k", "gsm_plus", "math500", "aime24"])
    val_fraction: float = _check(open_unit, default=0.05)
    max_train: int | None = _check(optional(positive), default=None)
    max_val: int | None = _check(optional(positive), default=None)
    max_eval: dict[str, int] = _check(each(positive), default_factory=dict)  # per benchmark cap
    max_unparsable_fraction: float = _check(unit, default=0.01)
    seed: int = 0
    # the arith dataset's difficulty levels, cycled through row by row (0: one single-digit addition)
    arith_levels: list[int] = _check(lambda v: non_empty(v) or subset_of(ARITH_LEVELS)(v),
                                     default_factory=lambda: [1, 2, 3])


@dataclass(frozen=True)
class SentParams:
    enabled: bool = True
    engine: str = _check(one_of(*ENGINE_KINDS), default="auto")
    dtype: str = _check(one_of(*DTYPES), default="auto")  # bf16 decodes ~1.5x faster on AVX512-BF16 CPUs
    M: int = _check(at_least(2), default=8)
    temperature: float = _check(positive, default=1.0)
    top_p: float = _check(half_open_unit, default=1.0)
    top_k: int = _check(non_negative, default=0)
    max_new_tokens: int = _check(positive, default=256)
    batch_size: int = _check(positive, default=32)
    no_answer_cluster: bool = True  # False: each unanswered sample is its own cluster
    order: str = _check(one_of(*SENT_ORDERS), default="signal")  # grpo/sent/curriculum.py
    num_stages: int = _check(positive, default=3)
    drop_all_correct: bool = False
    drop_all_wrong: bool = False
    save_every: int = _check(positive, default=16)
    seed: int = 0
    # processes per host and hosts (torchrun, grpo/launch.py): questions are sharded, outputs unchanged
    num_processes: int = _check(positive, default=1)
    nnodes: int = _check(positive, default=1)


@dataclass(frozen=True)
class LoraParams:
    r: int = _check(positive, default=16)
    alpha: float = _check(positive, default=32.0)
    dropout: float = _check(lambda v: None if 0 <= v < 1 else "a number in [0, 1)", default=0.0)
    targets: list[str] = _check(lambda v: non_empty(v) or subset_of(LORA_TARGETS)(v), default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    rslora: bool = False


@dataclass(frozen=True)
class CurriculumParams:
    use_sent: bool = True  # take the order and stages from data/sent/ when SENT ran
    advance: str = _check(one_of("step_fraction", "reward"), default="step_fraction")
    reward_threshold: float = 0.5  # with advance=reward: move on when the stage's mean reward passes this


@dataclass(frozen=True)
class TrainParams:
    quantization: str = _check(one_of("nf4", "none"), default="nf4")
    compute_dtype: str = _check(one_of(*DTYPES), default="auto")
    device: str = _check(one_of("auto", "cpu", "cuda"), default="auto")
    lora: LoraParams = field(default_factory=LoraParams)
    lr: float = _check(positive, default=5e-4)
    weight_decay: float = _check(non_negative, default=0.0)
    warmup_steps: int = _check(non_negative, default=0)
    lr_schedule: str = _check(one_of("constant", "cosine", "linear"), default="constant")
    grad_clip: float = _check(positive, default=1.0)
    max_steps: int = _check(positive, default=20)
    prompts_per_step: int = _check(positive, default=4)
    group_size: int = _check(at_least(2), default=4)
    max_response_length: int = _check(positive, default=160)
    temperature: float = _check(positive, default=1.0)
    top_p: float = _check(half_open_unit, default=1.0)
    top_k: int = _check(non_negative, default=0)
    generation_batch_size: int = _check(positive, default=16)  # sequences per generate() call
    # decode from a dense copy of the frozen 4-bit base (grpo/model/dequant.py): faster, one more copy
    dense_generation: bool = True
    # native decoding: static KV cache + CUDA graphs (grpo/rollout/static_decode.py) or HF generate;
    # auto = static on CUDA, generate elsewhere. merge_lora folds LoRA into a dense copy of its layers.
    generation_backend: str = _check(one_of(*GENERATION_BACKENDS), default="auto")
    generation_merge_lora: bool = True
    # the static decoder reads a 4-bit MLP in 4 bits with Triton kernels (grpo/kernels/matmul_4bit.py) instead of
    # de-quantising it into a dense copy: the copy's memory stays free (2.2 GiB at 1.5B), and a decode step is
    # 1.08x faster at 16 sequences, 1.17x slower at 64 on an H100 (bench/RESULTS.md); grpo.tune measures both
    generation_mlp_4bit: bool = False
    train_batch_size: int = _check(positive, default=8)  # sequences per training micro-batch
    # train the 4-bit layers no adapter wraps through a dense copy made once and kept for the run, which the static
    # decoder reads too (grpo/model/dequant.py): fewer, larger kernels than de-quantising in every pass, and no
    # step de-quantises those layers again; the copy's memory while training (grpo.check, grpo.tune)
    dense_training: bool = False
    # torch.compile each decoder layer for the scoring and training passes (grpo/model/compiled.py): fewer,
    # fused kernels, one compile at the first step; grpo.tune measures both, the compile spread over max_steps
    compile_layers: bool = False
    # the LoRA branch's fp32 matmuls in a step's scoring and training passes as TF32 on CUDA tensor cores
    # (inputs rounded to 10 mantissa bits, fp32 sums): on CUDA cores they were 161 of an 8 GiB step's 1,487 ms
    # of training kernels on an H100 (bench/RESULTS.md); results move by TF32's rounding (TRL under bf16
    # autocast rounds these products to bf16). Generation, the merge into the decoder and CPUs are unaffected
    lora_tf32: bool = False
    rewards: dict[str, float] = _check(subset_of(REWARDS), default_factory=lambda: {"correctness": 2.0})
    advantage_scale: str = _check(one_of(*ADVANTAGE_SCALES), default="group")
    skip_zero_variance_groups: bool = False
    loss_type: str = _check(one_of(*LOSS_TYPES), default="dapo")
    epsilon_low: float = _check(non_negative, default=0.2)
    epsilon_high: float = _check(non_negative, default=0.28)
    delta: float | None = _check(optional(lambda v: None if v > 1 else "a number > 1"), default=None)
    beta: float = _check(non_negative, default=0.0)
    num_iterations: int = _check(positive, default=1)
    mask_truncated_completions: bool = False
    entropy_keep_fraction: float = _check(half_open_unit, default=1.0)
    entropy_min_per_sequence: int = _check(non_negative, default=1)
    logprob_chunk_size: int = _check(positive, default=1024)
    # per-token log-prob/entropy: fused Triton kernel (grpo/kernels) or chunked PyTorch; auto = the kernel
    # where it runs (CUDA, triton, frozen bf16/fp16 lm_head)
    logprob_backend: str = _check(one_of("auto", "torch", "triton"), default="auto")
    gradient_checkpointing: bool = True
    save_every: int = _check(positive, default=5)
    keep_last: int = _check(positive, default=2)
    val_every: int = _check(positive, default=5)
    val_max_new_tokens: int = _check(positive, default=160)
    val_samples: int = _check(positive, default=1)  # 1: greedy; n > 1: sampled at `temperature`
    log_completions_every: int = _check(positive, default=5)
    # also log to these trackers (DVCLive always logs); wandb needs `pip install wandb` and a login
    # (or WANDB_MODE=offline); not part of the run's identity: checkpoints resume across a change
    report_to: list[str] = _check(subset_of(REPORT_TO), default_factory=list)
    curriculum: CurriculumParams = field(default_factory=CurriculumParams)
    seed: int = 0
    # data parallel (torchrun, grpo/launch.py): processes per host and hosts; not part of the run's
    # identity, since the update and the outputs do not depend on them (a run may resume on fewer)
    num_processes: int = _check(positive, default=1)
    nnodes: int = _check(positive, default=1)


@dataclass(frozen=True)
class SelectParams:
    metric: str = "accuracy"  # a validation metric: a file metrics/train/plots/metrics/eval/<metric>.tsv
    mode: str = _check(one_of("max", "min"), default="max")
    tie: str = _check(one_of("earliest", "latest"), default="earliest")


@dataclass(frozen=True)
class ProtocolParams:
    n: int = _check(positive, default=1)  # samples per question; 1 with temperature 0 is greedy
    temperature: float = _check(non_negative, default=0.0)
    top_p: float = _check(half_open_unit, default=1.0)
    max_new_tokens: int = _check(positive, default=256)


@dataclass(frozen=True)
class EvaluateParams:
    engine: str = _check(one_of(*ENGINE_KINDS), default="auto")
    dtype: str = _check(one_of(*DTYPES), default="auto")
    batch_size: int = _check(positive, default=32)
    seed: int = 0
    # processes per host and hosts (torchrun, grpo/launch.py): questions are sharded, outputs unchanged
    num_processes: int = _check(positive, default=1)
    nnodes: int = _check(positive, default=1)
    # one protocol per benchmark, so editing one reruns only that benchmark's stages
    benchmarks: dict[str, ProtocolParams] = field(default_factory=dict)


SECTIONS: dict[str, type] = {
    "model": ModelParams,
    "prompt": PromptParams,
    "prepare": PrepareParams,
    "sent": SentParams,
    "train": TrainParams,
    "select": SelectParams,
    "evaluate": EvaluateParams,
}


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        return {list: "a list", dict: "a mapping"}.get(origin, str(origin))
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(tp, tp.__name__)


def _coerce(value: Any, tp: Any, path: str, errors: list[str]) -> Any:
    """Return ``value`` as type ``tp``, appending a message to ``errors`` when it is not one."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)][0]
        inner_errors: list[str] = []
        result = _coerce(value, inner, path, inner_errors)
        if inner_errors and not dataclasses.is_dataclass(inner):
            inner_errors = [f"{path}: expected {_type_name(tp)}, got {value!r}"]
        errors.extend(inner_errors)
        return result
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path, errors)
    if origin is list:
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {value!r}")
            return value
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{path}[{i}]", errors) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping, got {value!r}")
            return value
        _, item = typing.get_args(tp)
        return {str(k): _coerce(v, item, f"{path}.{k}", errors) for k, v in value.items()}
    ok = (
        isinstance(value, bool) if tp is bool
        else isinstance(value, int) and not isinstance(value, bool) if tp is int
        else isinstance(value, (int, float)) and not isinstance(value, bool) if tp is float
        else isinstance(value, tp)
    )
    if not ok:
        errors.append(f"{path}: expected {_type_name(tp)}, got {value!r}")
        return value
    return float(value) if tp is float else value


def _build(cls: type, raw: Any, path: str, errors: list[str]) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        errors.append(f"{path}: expected a mapping, got {raw!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in known:
            errors.append(f"{path}.{key}: unknown key; allowed keys: {', '.join(known)}")
    values = {}
    n_errors = len(errors)
    for name, f in known.items():
        if name not in raw:
            continue
        key_path = f"{path}.{name}"
        before = len(errors)
        value = _coerce(raw[name], hints[name], key_path, errors)
        check = f.metadata.get("check")
        if len(errors) == before and check is not None:
            allowed = check(value)
            if allowed:
                errors.append(f"{key_path}: got {raw[name]!r}; allowed: {allowed}")
        values[name] = value
    if len(errors) > n_errors:
        return cls()
    return cls(**values)


def parse_section(name: str, raw: Any) -> Any:
    """Validate one section's raw mapping; raises ConfigError listing every problem."""
    errors: list[str] = []
    result = _build(SECTIONS[name], raw, name, errors)
    if errors:
        raise ConfigError("invalid params:\n  " + "\n  ".join(errors))
    return result


def load_params(path: str | Path, sections: list[str]) -> dict[str, Any]:
    """Read ``path`` and return the validated ``sections`` as dataclasses, keyed by section name.

    Unknown top-level sections are errors too, so a typo like ``trian:`` cannot silently do nothing.
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise ConfigError(f"params file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    errors = [f"{key}: unknown section; allowed: {', '.join(SECTIONS)}" for key in raw if key not in SECTIONS]
    result = {}
    for name in sections:
        result[name] = _build(SECTIONS[name], raw.get(name), name, errors)
    if errors:
        raise ConfigError(f"invalid params in {path}:\n  " + "\n  ".join(errors))
    return result


def to_dict(params: Any) -> Any:
    """A plain-dict view of a params dataclass, for logs and reports."""
    return dataclasses.asdict(params)
