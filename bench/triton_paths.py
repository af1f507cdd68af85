"""Does Triton pay for the LoRA branch and the GRPO loss on this GPU? (issue 7, item 4)

The reference engine concluded "Triton for GRPO loss, entropy mask and LoRA; plain generation". This
measures each candidate against PyTorch eager and torch.compile, alone and inside one training
micro-batch of the real step, at the R1-Distill-Qwen-1.5B shape with random weights (gpu_bench.py builds
them; speed and memory do not depend on the values):

    python bench/triton_paths.py          # writes $OUT/gpu_triton_paths.json (default bench/results/)

1. LoRA layer, forward + backward, 4 × 896 tokens, r16: q/o (1536 → 1536) and k/v (1536 → 256) over a
   bf16 base; the branch's own cost is the layer's time minus the bare base's.
2. GRPO loss (grpo_loss, metrics included), forward + backward, the 8 GB preset's micro-batch of 4 × 768
   and the H200 preset's 32 × 2048, against the fused Triton loss (grpo/kernels/grpo_loss.py).
3. One training micro-batch of 4 × (128 + 768) tokens through the nf4 policy with gradient
   checkpointing (token_logprobs + loss + backward, as policy_updates runs it), every combination of
   the LoRA and loss backends, and the same on the dense bf16 copy of the base (grpo.model.dequant).
"""
from __future__ import annotations

import itertools
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_bench import GIB, PROMPT, QUICK, V, add_lora, build_model_dir, log, save  # noqa: E402

TOKENS = 4 * (128 + 768) if not QUICK else 4 * 96
RESPONSE = 768 if not QUICK else 64


def cuda_ms(fn, repeats: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of ``fn`` by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times), 3)


def gpu_busy_ms(fn, repeats: int = 5) -> float:
    """Milliseconds the GPU spends in kernels per call (profiler), without the host's launch gaps: what a
    GPU-bound step pays, whereas ``cuda_ms`` of a small op alone mostly measures Python launch overhead."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    busy_us = sum(getattr(e, "self_device_time_total", 0) for e in prof.key_averages())
    return round(busy_us / repeats / 1000, 3)


def peak_extra_gib(fn) -> float:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return round((torch.cuda.max_memory_allocated() - before) / GIB, 3)


# --- 1. one LoRA layer --------------------------------------------------------------------------
LORA_VARIANTS = ("torch", "torch_tf32", "compiled", "triton", "triton_tf32")


def use_lora(model: torch.nn.Module, variant: str) -> None:
    """torch / torch_tf32 (torch's fp32 matmuls on TF32 tensor cores) / triton (fp32 products) /
    triton_tf32 (TF32 products); "compiled" is the torch branch under torch.compile (the caller's)."""
    import grpo.kernels.lora as kernels
    from grpo.model.lora import set_lora_backend

    set_lora_backend(model, "triton" if variant.startswith("triton") else "torch")
    kernels.DOT_PRECISION = "tf32" if variant == "triton_tf32" else "ieee"
    torch.backends.cuda.matmul.allow_tf32 = variant == "torch_tf32"


def lora_layer(res: dict) -> None:
    from grpo.model.lora import LoRALinear

    for name, out_features in (("q_o", 1536), ("k_v", 256)):
        torch.manual_seed(0)
        base = torch.nn.Linear(1536, out_features, bias=True, device="cuda", dtype=torch.bfloat16)
        layer = LoRALinear(base, r=16, alpha=32)
        with torch.no_grad():
            layer.lora_B.normal_(0, 0.01)
        x0 = torch.randn(TOKENS, 1536, device="cuda", dtype=torch.bfloat16)
        grad = torch.randn(TOKENS, out_features, device="cuda", dtype=torch.bfloat16)

        def step(module):
            def run():
                x = x0.detach().requires_grad_(True)
                module(x).backward(grad)
            return run

        layer.disabled = True
        base_ms, base_busy = cuda_ms(step(layer)), gpu_busy_ms(step(layer))
        entry = {"base_only": {"ms": base_ms, "gpu_busy_ms": base_busy}}
        layer.disabled = False
        for variant in LORA_VARIANTS:
            use_lora(layer, variant)
            module = torch.compile(layer) if variant == "compiled" else layer
            ms, busy = cuda_ms(step(module)), gpu_busy_ms(step(module))
            entry[variant] = {"layer_ms": ms, "branch_ms": round(ms - base_ms, 3), "gpu_busy_ms": busy,
                              "branch_gpu_busy_ms": round(busy - base_busy, 3),
                              "peak_extra_GiB": peak_extra_gib(step(module))}
            layer.zero_grad(set_to_none=True)
        use_lora(layer, "torch")
        log(res, f"lora_layer_{name}_{TOKENS}tok", entry)
        torch._dynamo.reset()


# --- 2. the loss ----------------------------------------------------------------------------------
def loss_inputs(batch: int = 4, width: int = RESPONSE) -> dict:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(width // 4, width + 1, (batch,), generator=gen)
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    lp = -torch.rand(batch, width, generator=gen) * 3
    return {"logprobs": lp.cuda(), "old": (lp + torch.randn(batch, width, generator=gen) * 0.1).cuda(),
            "ref": (lp + torch.randn(batch, width, generator=gen) * 0.1).cuda(), "mask": mask.cuda(),
            "adv": torch.randn(batch, generator=gen).cuda()}


def loss_fn(backend: str):
    from grpo.algo.loss import grpo_loss
    from grpo.kernels.grpo_loss import fused_grpo_loss

    return {"torch": grpo_loss, "compiled": torch.compile(grpo_loss), "triton": fused_grpo_loss}[backend]


def grpo_loss_alone(res: dict) -> None:
    """The 8 GB preset's micro-batch (4 × 768) and the H200 preset's (32 × 2048)."""
    settings = {"plain (μ=1, β=0)": {}, "μ>1 and k3 KL (β=0.04)": {"old": True, "beta": 0.04}}
    for (batch, width), (label, extra) in itertools.product(((4, RESPONSE), (32, 2048)), settings.items()):
        inputs = loss_inputs(batch, width)
        entry = {}
        for backend in ("torch", "compiled", "triton"):
            fn = loss_fn(backend)

            def run():
                lp = inputs["logprobs"].detach().requires_grad_(True)
                out = fn(lp, inputs["old"] if extra.get("old") else None, inputs["adv"], inputs["mask"],
                         loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28, beta=extra.get("beta", 0.0),
                         ref_logprobs=inputs["ref"] if extra.get("beta") else None, max_completion_length=width,
                         num_items_in_batch=float(inputs["mask"].sum()))
                out.loss.backward()

            entry[backend] = {"ms": cuda_ms(run), "gpu_busy_ms": gpu_busy_ms(run)}
        log(res, f"grpo_loss_{batch}x{width}_{label}", entry)
    torch._dynamo.reset()


# --- 3. one training micro-batch of the real step -------------------------------------------------
def training_microbatch(res: dict) -> None:
    from grpo.config import TrainParams
    from grpo.model.dequant import dense_base, drop_dense_copies
    from grpo.model.loading import load_policy_model
    from grpo.rollout.base import Completion
    from grpo.train.batch import build_batch
    from grpo.train.step import token_logprobs

    model = load_policy_model(build_model_dir(), quantization="nf4", compute_dtype="bfloat16", device="cuda",
                              gradient_checkpointing=True)
    model = add_lora(model).train()
    ctx = SimpleNamespace(model=model, params=TrainParams(logprob_backend="triton", logprob_chunk_size=4096))
    comps = [Completion(list(range(1000 + i, 1000 + i + PROMPT)), list(range(5000 + i, 5000 + i + RESPONSE)), "",
                        "length") for i in range(4)]
    batch = build_batch(comps, V - 2).to("cuda")
    adv = torch.randn(4, device="cuda")
    log(res, "microbatch_tokens", int(batch.input_ids.numel()))
    combos = [("torch", "torch"), ("torch_tf32", "torch"), ("triton", "torch"), ("triton_tf32", "torch"),
              ("torch", "triton"), ("triton_tf32", "triton")]
    for dense, (lora_variant, loss_backend) in itertools.product((False, True), combos):
        use_lora(model, lora_variant)
        fn = loss_fn(loss_backend)

        def run():
            lp, _ = token_logprobs(ctx, batch, entropy=True)
            fn(lp, None, adv, batch.response_mask, loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28,
               max_completion_length=RESPONSE, num_items_in_batch=float(batch.response_mask.sum())).loss.backward()
            model.zero_grad(set_to_none=True)

        with dense_base(model, dense):
            ms = cuda_ms(run, repeats=5 if not QUICK else 2, warmup=2)
            busy = gpu_busy_ms(run, repeats=2)
            peak = peak_extra_gib(run)
        base = "dense bf16 copy" if dense else "nf4 kernels"
        log(res, f"train_microbatch[{base}, lora={lora_variant}, loss={loss_backend}]",
            {"ms": ms, "gpu_busy_ms": busy, "peak_extra_GiB": peak})
        if dense:
            drop_dense_copies(model)


if __name__ == "__main__":
    out: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "quick": QUICK,
                 "weights": "random, R1-Distill-Qwen-1.5B config"}
    lora_layer(out)
    grpo_loss_alone(out)
    training_microbatch(out)
    save("triton_paths", out)
