"""Where a training micro-batch's time goes at the 8 GB preset's shape (issue 18): R1-Distill-Qwen-1.5B shape
with random weights (bench/r1_model.py), nf4 + LoRA r16 on q/k/v/o, the preset's train params, one
micro-batch of ``--seqs`` sequences of 65-128 prompt + 768 response tokens, forward (log-probs and entropy by
the step's own backend) + GRPO loss + backward, as ``policy_updates`` runs it.

    python3 bench/train_profile.py [--seqs 16] [--variants nf4,dense,layers,nockpt]

Variants: ``nf4`` as shipped; ``dense`` inside ``dense_for_training`` (the ``train.dense_training`` knob);
``layers`` inside ``compiled_layers`` (the ``train.compile_layers`` knob: each decoder layer one compiled
graph); ``nockpt`` without gradient checkpointing (last: it stays off). (The ``fused`` variant of
bench/RESULTS.md, norms, SwiGLU and LoRA compiled one function at a time, is this file at b78c11c.)
For each: the first run's time (a compile, for ``layers``), the median wall time of three runs after two
warm-ups, then one run under torch.profiler: the device's summed kernel time (busy) against the wall
time, the launch count, the top kernels and the top host operators by self time. No memory cap: this is
about time. Writes $OUT/train_profile.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.gpu_bench import MODEL_DIR, OUT, PROMPT, V, bench_rows, loss_backward, preset_params, timed  # noqa: E402
from bench.r1_model import build_model_dir  # noqa: E402

RESPONSE = 768


def build_trainer():
    from grpo.prompts import PromptStyle
    from grpo.train.loop import TrainPaths, Trainer
    from grpo.train.parts import build_parts

    params = preset_params("triton")
    tmp = Path("/tmp/bench_train_profile")
    paths = TrainPaths(build_model_dir(MODEL_DIR), tmp / "ckpt", tmp / "final", tmp / "metrics", tmp / "summary.json")
    rows = bench_rows()
    style = PromptStyle("r1", system_prompt="")
    parts = build_parts(params, style, paths.base_model, paths.live, paths.measured, [r["id"] for r in rows], None)
    return Trainer(params, style, paths, rows, [], parts, "bench")


def micro_batch(trainer, seqs: int):
    from grpo.rollout.base import Completion
    from grpo.train.step import build_batch

    ctx = trainer.ctx
    gen = torch.Generator().manual_seed(0)
    # prompts of unequal lengths (PROMPT down to PROMPT - 63), as a step's are: equal ones hid what a padding mask
    # cost the left-padded batches before bbe809a (bench/RESULTS.md, thirteenth session)
    comps = [Completion(torch.randint(100, 150000, (PROMPT - 7 * i % 64,), generator=gen).tolist(),
                        torch.randint(100, 150000, (RESPONSE,), generator=gen).tolist(), "", "length")
             for i in range(seqs)]
    batch = build_batch(comps, V - 2).to(ctx.parts.device)
    adv = torch.randn(seqs, device=ctx.parts.device)

    def run():
        loss_backward(ctx, batch, adv, RESPONSE)
        ctx.parts.optimizer.zero_grad(set_to_none=True)

    return run


def profile_one(run) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _, wall = timed(run)
    kernels, host = [], []
    for e in prof.key_averages():
        device_us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if e.device_type == torch.autograd.DeviceType.CUDA and device_us:
            kernels.append((e.key, e.count, device_us))
        elif e.self_cpu_time_total:
            host.append((e.key, e.count, e.self_cpu_time_total))
    kernels.sort(key=lambda r: -r[2])
    host.sort(key=lambda r: -r[2])
    return {"wall_s": round(wall, 3), "kernel_s": round(sum(k[2] for k in kernels) / 1e6, 3),
            "launches": sum(k[1] for k in kernels),
            "top_kernels": [[k[:80], c, round(us / 1000, 1)] for k, c, us in kernels[:15]],
            "top_host_ops_ms": [[k[:60], c, round(us / 1000, 1)] for k, c, us in host[:15]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=16)
    parser.add_argument("--variants", default="nf4,dense,layers,nockpt")
    args = parser.parse_args()
    from grpo.model.compiled import compiled_layers
    from grpo.model.dequant import dense_for_training

    trainer = build_trainer()
    model = trainer.model
    model.train()
    run = micro_batch(trainer, args.seqs)
    res: dict = {"gpu": torch.cuda.get_device_name(0), "seqs": args.seqs, "tokens": PROMPT + RESPONSE}
    for variant in args.variants.split(","):
        if variant == "nockpt":
            model.gradient_checkpointing_disable()
        with dense_for_training(model, variant == "dense"), compiled_layers(model, variant == "layers"):
            first = timed(run)[1]  # layers: the compile
            run()
            times = [timed(run)[1] for _ in range(3)]
            entry = {"first_run_s": round(first, 2), "median_s": round(statistics.median(times), 3), **profile_one(run)}
        res[variant] = entry
        print(variant, json.dumps(entry, indent=1), flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "train_profile.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
