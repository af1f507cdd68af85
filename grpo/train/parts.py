"""The trainer's parts, built once from the params: ``build_parts`` is the one place that reads
``TrainParams`` to choose a component (the device, the 4-bit base with LoRA, the optimiser and its
schedule, the rollout engine and its decoder, the log-prob backend, the reward functions, the
curriculum sampler). The Trainer (grpo/train/loop.py) and the step (grpo/train/step.py) receive them
and choose nothing; tests and benchmarks build their own parts (a reward of their own, say) by passing
``reward_functions`` or replacing a field.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo import distributed
from grpo.algo.logprobs import chunked_token_logprobs_and_entropy
from grpo.cli import seed_everything
from grpo.config import TrainParams, to_dict
from grpo.fault_injection import FaultHook
from grpo.kernels.logprob_entropy import fused_supported, fused_token_logprobs_and_entropy
from grpo.microbatch import AdaptiveBatchSize
from grpo.model.adapter import LoraSettings
from grpo.model.compiled import compiled_layers
from grpo.model.dequant import dense_base, dense_for_training
from grpo.model.loading import load_policy_model, load_tokenizer, resolve_device
from grpo.model.lora import inject_lora, lora_parameters, lora_tf32
from grpo.prompts import PromptStyle
from grpo.rollout.base import Completion, SamplingParams
from grpo.rollout.native import NativeEngine
from grpo.sent.curriculum import CurriculumSampler, StageSchedule
from grpo.train import data_parallel
from grpo.train.tracking import Tracker
from grpo.verify.rewards import REWARD_FUNCTIONS, RewardFn

log = logging.getLogger(__name__)

# (final hidden states [B, T, H], response ids [B, T], entropy wanted) -> (log-probs [B, T], entropies or None)
LogprobFn = Callable[[torch.Tensor, torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor | None]]


@dataclass
class TrainerParts:
    tracker: Tracker
    device: torch.device
    tokenizer: Any
    model: torch.nn.Module  # the policy: the frozen base with LoRA injected
    lora: LoraSettings
    lora_params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    sampler: CurriculumSampler
    schedule: StageSchedule
    sizes: dict[str, AdaptiveBatchSize]  # micro-batch sizes by phase: generate, score, train
    hook: FaultHook
    engine: PolicyEngine
    rewards: dict[str, RewardFn]  # the functions of params.rewards, by name (weights stay in params)
    token_logprobs: LogprobFn
    # the weights a step's scoring and training passes run on: `with parts.training_base():` (the 4-bit
    # kernels, or with train.dense_training the adapter-free layers' kept copy; compiled with compile_layers)
    training_base: Callable[[], AbstractContextManager[int]]


class PolicyEngine:
    """The rollout engine over the policy being trained (a ``GenerationEngine``); with ``dense`` it
    decodes from the dense copy of the frozen 4-bit base (grpo/model/dequant.py: faster, one more copy,
    the same numbers), a choice made here once rather than at every call site."""

    def __init__(self, engine: NativeEngine, dense: bool) -> None:
        self.engine, self.dense = engine, dense

    def generate(self, prompts: list[str], params: SamplingParams, *, adapter_dir: str | None = None,
                 progress: bool = False) -> list[list[Completion]]:
        with dense_base(self.engine.model, self.dense):
            return self.engine.generate(prompts, params, adapter_dir=adapter_dir, progress=progress)

    def close(self) -> None:
        self.engine.close()


def make_scheduler(optimizer: torch.optim.Optimizer, params: TrainParams) -> torch.optim.lr_scheduler.LambdaLR:
    total = params.max_steps * params.num_iterations

    def factor(update: int) -> float:
        if update < params.warmup_steps:
            return (update + 1) / params.warmup_steps
        progress = (update - params.warmup_steps) / max(1, total - params.warmup_steps)
        if params.lr_schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        if params.lr_schedule == "linear":
            return max(0.0, 1 - progress)
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def choose_logprobs(params: TrainParams, model: torch.nn.Module) -> LogprobFn:
    """``logprob_backend`` made concrete once: the fused Triton kernel (``triton``, or ``auto`` where it
    runs: CUDA, triton installed, a frozen bf16/fp16 lm_head), else chunked PyTorch."""
    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    probe = torch.empty(0, device=weight.device)  # fused_supported reads only the hidden states' device
    fused = params.logprob_backend == "triton" or (
        params.logprob_backend == "auto" and fused_supported(probe, weight))
    log.info("log-prob backend: %s (train.logprob_backend %s)", "triton" if fused else "torch", params.logprob_backend)

    def logprobs(hidden: torch.Tensor, ids: torch.Tensor, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        if fused:
            return fused_token_logprobs_and_entropy(hidden, weight, ids, chunk_size=params.logprob_chunk_size,
                                                    temperature=params.temperature, lm_head_bias=bias)
        return chunked_token_logprobs_and_entropy(hidden, weight, ids, chunk_size=params.logprob_chunk_size,
                                                  temperature=params.temperature, compute_entropy=entropy,
                                                  lm_head_bias=bias)

    return logprobs


@contextmanager
def training_base(model: torch.nn.Module, params: TrainParams) -> Iterator[int]:
    """The weights and code a step's scoring and training passes run on: the 4-bit layers or, with
    train.dense_training, the adapter-free layers from their kept copy; with train.compile_layers, compiled layers; with
    train.lora_tf32, the LoRA branch's matmuls in TF32. Yields how many 4-bit layers run densely."""
    with dense_for_training(model, params.dense_training) as switched, compiled_layers(model, params.compile_layers), \
            lora_tf32(params.lora_tf32):
        yield switched


def build_parts(params: TrainParams, style: PromptStyle, base_model: Path, live: Path, measured: Path,
                row_ids: list[str], stages: list[list[str]] | None,
                reward_functions: Mapping[str, RewardFn] = REWARD_FUNCTIONS) -> TrainerParts:
    """Every part, in the order that keeps runs reproducible: the tracker first (a missing W&B package
    or login stops the stage before any work), then the seed, then everything that draws from it.
    Under torchrun the world is checked before anything loads, and only rank 0 logs."""
    data_parallel.check_world(params)
    tracker = distributed.main_only(lambda: Tracker(
        live, measured, params.report_to, {"train": to_dict(params), "prompt": style.__dict__},
        measured.parent / "wandb"))
    unknown = sorted(set(params.rewards) - set(reward_functions))
    if unknown:
        raise ValueError(f"train.rewards: unknown reward function(s) {', '.join(unknown)}; "
                         f"allowed: {', '.join(reward_functions)}")
    seed_everything(params.seed)
    device = resolve_device(params.device)
    tokenizer = load_tokenizer(base_model)
    model = load_policy_model(base_model, quantization=params.quantization, compute_dtype=params.compute_dtype,
                              device=params.device, gradient_checkpointing=params.gradient_checkpointing)
    lp = params.lora
    lora = LoraSettings(r=lp.r, alpha=lp.alpha, dropout=lp.dropout, targets=list(lp.targets), use_rslora=lp.rslora)
    inject_lora(model, targets=lora.targets, r=lora.r, alpha=lora.alpha, dropout=lora.dropout,
                use_rslora=lora.use_rslora, seed=params.seed)
    model.train()
    lora_params = lora_parameters(model)
    optimizer = torch.optim.AdamW(lora_params, lr=params.lr, weight_decay=params.weight_decay)
    scheduler = make_scheduler(optimizer, params)
    if stages is None:  # no SENT: one stage holding every question, order by the seeded sampler
        stages = [sorted(row_ids)]
    sampler = CurriculumSampler(stages, seed=params.seed)
    schedule = StageSchedule(len(stages), params.max_steps, params.curriculum.advance,
                             params.curriculum.reward_threshold)
    log.info("curriculum: %s", schedule.plan([len(stage) for stage in stages]))
    sizes = {  # generate counts sequences in flight (the engine adapts it), score and train rows
        "generate": AdaptiveBatchSize("generate", params.generation_batch_size),
        "score": AdaptiveBatchSize("score", params.train_batch_size),
        "train": AdaptiveBatchSize("train", params.train_batch_size),
    }
    hook = FaultHook()
    engine = NativeEngine(model, tokenizer, batch_size=params.generation_batch_size, backend=params.generation_backend,
                          merge_lora=params.generation_merge_lora, read_4bit_mlp=params.generation_mlp_4bit,
                          keep_dense=params.dense_training, size=sizes["generate"], fault_hook=hook)
    return TrainerParts(tracker, device, tokenizer, model, lora, lora_params, optimizer, scheduler, sampler, schedule,
                        sizes, hook, PolicyEngine(engine, params.dense_generation),
                        {name: reward_functions[name] for name in params.rewards}, choose_logprobs(params, model),
                        partial(training_base, model, params))
