"""GPU benchmark at the DeepSeek-R1-Distill-Qwen-1.5B shape (random weights built from the config: speed
and memory do not depend on the values; nothing can be downloaded on the device machine).

    python bench/gpu_bench.py rollout   # fast native rollouts vs generate, tok/s, greedy agreement
    python bench/gpu_bench.py step      # OUR full GRPO step with the 8 GB preset under an 8 GiB cap
    python bench/gpu_bench.py kernels   # fused Triton log-prob/entropy vs the PyTorch reference

Each part writes ``$OUT/gpu_<part>.json`` (default bench/results/; bench/gpu_report.py tabulates them).
``step`` runs the backends named in BACKENDS (default triton,torch; one process each gives clean memory
figures) on the 8 GB preset's train params (presets/rtx3060ti-8gb.yaml; TRAIN_MB and GEN_SEQS override
its micro-batches; STEPS the number of steps, default 2; SDPA_CUDNN=1 puts training attention back on
cuDNN, which the loader leaves out). QUICK=1 shrinks every shape (a smoke test).
Run from the repository root; the device command used is in bench/RESULTS.md.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.r1_model import build_model_dir, gsm8k_rows  # noqa: E402

OUT = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
QUICK = os.environ.get("QUICK") == "1"
MODEL_DIR = Path("/tmp/r1shape_bpe")  # bench/r1_model.py: random weights, GSM8K byte-level BPE
V = 151936
PROMPT = 128
LENGTHS = (32,) if QUICK else (512, 768)
BATCHES = (16, 64)
GIB = 2**30


def log(res: dict, key: str, value) -> None:
    res[key] = value
    print(f"{key}: {value}", flush=True)


def save(name: str, res: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"gpu_{name}.json").write_text(json.dumps(res, indent=1, sort_keys=True))


def load_base(quantization: str):
    from grpo.model.loading import load_policy_model

    return load_policy_model(build_model_dir(MODEL_DIR), quantization=quantization, compute_dtype="bfloat16",
                             device="cuda", gradient_checkpointing=False).eval()


def add_lora(model, seed: int = 0):
    """The training policy: the frozen base plus LoRA r16 on q/k/v/o with non-zero B."""
    from grpo.model.lora import inject_lora, lora_modules

    inject_lora(model, targets=["q_proj", "k_proj", "v_proj", "o_proj"], r=16, alpha=32, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    for m in lora_modules(model).values():
        with torch.no_grad():  # a trained-looking adapter, so merged vs unmerged is a real difference
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=gen) * 0.01)
    return model.eval()


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


# --- rollouts --------------------------------------------------------------------------------
def fast_rollout(decoder, batch: int, new: int, seed: int = 0) -> dict:
    """Forced ``new`` tokens (no stop ids) from random 128-token prompts; capture time reported apart."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(100, 150000, (batch, PROMPT), generator=gen).tolist()
    capture = []
    graph = decoder._graph

    def timed_graph(length):  # graphs are captured on first use: time those calls apart
        if decoder.graph_key(length) in decoder._graphs:
            return graph(length)
        result, seconds = timed(lambda: graph(length))
        capture.append(seconds)
        return result

    decoder._graph = timed_graph
    torch.cuda.reset_peak_memory_stats()
    try:
        out, seconds = timed(lambda: decoder.generate(prompts, max_new_tokens=new, stop_ids=[], pad_id=V - 2,
                                                      temperature=1.0))
    finally:
        del decoder._graph
    assert [len(ids) for ids in out] == [new] * batch
    return {"tok_per_s": round(batch * new / seconds), "s": round(seconds, 3), "capture_s": round(sum(capture), 3),
            "tok_per_s_excl_capture": round(batch * new / (seconds - sum(capture))),
            "peak_GiB": round(torch.cuda.max_memory_allocated() / GIB, 2)}


def hf_rollout(model, batch: int, new: int, dense: bool) -> dict:
    """Plain ``model.generate`` (random prompts, forced ``new`` tokens, sampling) as gpu_anchor.py runs
    it; with ``dense``, on the dense copy of a 4-bit base (our engine before this issue)."""
    from grpo.model.dequant import dense_base

    ids = torch.randint(100, 150000, (batch, PROMPT)).cuda()
    with dense_base(model, dense), torch.no_grad():
        def run(n):
            return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                  min_new_tokens=n, do_sample=True, temperature=1.0, top_p=1.0, top_k=None,
                                  pad_token_id=V - 2, eos_token_id=None)

        run(4)
        out, seconds = timed(lambda: run(new))
    return {"tok_per_s": round((out.shape[1] - PROMPT) * batch / seconds), "s": round(seconds, 2), "new_tokens": new}


def greedy_agreement(model, decoder, n_new: int = 64, batch: int = 8) -> dict:
    """Fast path vs HF generate (4-bit kernels, LoRA unmerged: the plain path) on fixed prompts, greedy.
    Random weights give near-flat logits, so bf16 rounding can flip near-ties: where a row diverges,
    the reference log-prob gap between the two tokens shows whether it was a tie (bf16 noise) or a bug."""
    gen = torch.Generator().manual_seed(123)
    ids = torch.randint(100, 150000, (batch, PROMPT), generator=gen).cuda()
    ids[: batch // 2, : PROMPT // 4] = V - 2  # half the rows left-padded
    mask = (ids != V - 2).long()
    with torch.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_new, min_new_tokens=n_new,
                             do_sample=False, temperature=1.0, top_p=1.0, top_k=None, pad_token_id=V - 2,
                             eos_token_id=None)[:, PROMPT:]
        prompts = [row[keep].tolist() for row, keep in zip(ids, mask.bool())]
        fast = torch.tensor(decoder.generate(prompts, max_new_tokens=n_new, stop_ids=[], pad_id=V - 2,
                                             temperature=0), device=ids.device)
        prefix, gaps = [], []
        for row in range(batch):
            diff = (ref[row] != fast[row]).nonzero()
            k = int(diff[0]) if len(diff) else n_new
            prefix.append(k)
            if k < n_new:  # reference log-probs of both candidates after the shared prefix
                seq = torch.cat([ids[row], ref[row, :k]])[None]
                m = torch.cat([mask[row], torch.ones(k, dtype=mask.dtype, device=mask.device)])[None]
                pos = (m.cumsum(-1) - 1).clamp(min=0)  # generate's positions for left-padded rows
                lp = model(input_ids=seq, attention_mask=m, position_ids=pos).logits[0, -1].float().log_softmax(-1)
                gaps.append(float(lp[ref[row, k]] - lp[fast[row, k]]))
    return {"rows": batch, "new_tokens": n_new, "identical_rows": sum(k == n_new for k in prefix),
            "matching_prefix": prefix, "logprob_gap_at_divergence": [round(g, 4) for g in gaps]}


def run_rollout() -> None:
    from grpo.rollout.static_decode import StaticDecoder

    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "quick": QUICK}
    import transformers
    log(res, "transformers", transformers.__version__)
    plain_new = 32 if QUICK else 64  # plain generate is slow (~0.1-0.2 s a step): fewer tokens
    policy = load_base("nf4")
    for batch in BATCHES:
        log(res, f"plain_generate_nf4_B{batch}", hf_rollout(policy, batch, plain_new, False))
    policy = add_lora(policy)
    log(res, "nf4_policy_GiB", round(torch.cuda.memory_allocated() / GIB, 2))
    for merge in (True, False):
        decoder = StaticDecoder(policy, merge_lora=merge)
        name = "merged" if merge else "unmerged"
        log(res, f"nf4_lora_{name}_resident_GiB", round(torch.cuda.memory_allocated() / GIB, 2))
        fast_rollout(decoder, 16, 16)  # warm-up: cuBLAS handles, allocator
        for new in LENGTHS:
            for batch in BATCHES:
                log(res, f"fast_nf4_lora_{name}_B{batch}_N{new}", fast_rollout(decoder, batch, new))
        log(res, f"greedy_vs_generate_{name}", greedy_agreement(policy, decoder))
        del decoder
    for batch in BATCHES:  # the engine before this issue: generate on the dense copy
        log(res, f"hf_generate_nf4_lora_dense_B{batch}", hf_rollout(policy, batch, plain_new, True))
    del policy
    torch.cuda.empty_cache()
    policy = load_base("none")
    for batch in BATCHES:
        log(res, f"plain_generate_bf16_B{batch}", hf_rollout(policy, batch, plain_new, False))
    policy = add_lora(policy)
    decoder = StaticDecoder(policy, merge_lora=True)
    fast_rollout(decoder, 16, 16)
    for batch in BATCHES:
        log(res, f"fast_bf16_lora_merged_B{batch}_N{LENGTHS[0]}", fast_rollout(decoder, batch, LENGTHS[0]))
    save("rollout", res)


# --- the GRPO step under 8 GiB ---------------------------------------------------------------
def preset_params(logprob_backend: str):
    """presets/rtx3060ti-8gb.yaml's train section as a user gets it (QUICK shrinks it; TRAIN_MB and GEN_SEQS
    override the micro-batches)."""
    import dataclasses

    import yaml
    from grpo.config import parse_section

    raw = yaml.safe_load((Path(__file__).resolve().parent.parent / "presets" / "rtx3060ti-8gb.yaml").read_text())
    params = parse_section("train", raw["train"])
    overrides = {"logprob_backend": logprob_backend, "max_steps": 10}
    if QUICK:
        overrides.update(prompts_per_step=4, max_response_length=64)
    for env, key in (("TRAIN_MB", "train_batch_size"), ("GEN_SEQS", "generation_batch_size")):
        if env in os.environ:
            overrides[key] = int(os.environ[env])
    return dataclasses.replace(params, **overrides)


def bench_rows() -> list[dict]:
    """64 GSM8K questions as training rows (the answers are a placeholder: random weights score nothing)."""
    return [{"id": f"q{i}", "source": "bench", "question": row["question"], "answer": "7",
             "answer_type": "integer", "meta": {}} for i, row in enumerate(gsm8k_rows()[:64])]


def loss_backward(ctx, batch, advantages: torch.Tensor, response_length: int) -> None:
    """One training micro-batch as ``policy_updates`` runs it: log-probs and entropy by the step's own
    backend, the preset's GRPO loss (dapo, one iteration: no old log-probs), backward."""
    from grpo.algo.objective import grpo_loss
    from grpo.train.step import token_logprobs

    lp, _ = token_logprobs(ctx, batch, entropy=True)
    out = grpo_loss(lp, None, advantages, batch.response_mask, loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28,
                    delta=None, beta=0.0, ref_logprobs=None, max_completion_length=response_length,
                    num_items_in_batch=float(batch.response_mask.sum()), entropy_keep_mask=None)
    out.loss.backward()


def run_step() -> None:
    from grpo.prompts import PromptStyle

    model_dir = build_model_dir(MODEL_DIR)  # before the cap: building the random model takes fp32 memory
    torch.cuda.empty_cache()
    cap = float(os.environ.get("CAP_GIB", "8"))
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap * GIB / total)
    res: dict = {"cap_GiB": cap, "quick": QUICK, "sdpa_cudnn": os.environ.get("SDPA_CUDNN") == "1"}
    style = PromptStyle("r1", system_prompt="")
    rows = bench_rows()
    for backend in os.environ.get("BACKENDS", "triton,torch").split(","):
        step_run(backend, model_dir, style, rows, res)
        gc.collect()  # the engine <-> wrapper cycle would keep the first model alive into the next run
        torch.cuda.empty_cache()
    res["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    save(f"step_{os.environ.get('BACKENDS', 'triton,torch').replace(',', '_')}_preset"
         + "".join(f"_{env.lower()}{os.environ[env]}" for env in ("TRAIN_MB", "GEN_SEQS") if env in os.environ)
         + ("_expandable" if "expandable_segments:True" in res["alloc_conf"] else "")
         + ("_cudnn" if res["sdpa_cudnn"] else ""), res)


def step_run(backend: str, model_dir: Path, style, rows: list[dict], res: dict) -> None:
    """Two GRPO steps (the first compiles) of a fresh Trainer with log-prob backend ``backend``."""
    from grpo.train.loop import TrainPaths, Trainer
    from grpo.train.parts import build_parts
    from grpo.train.step import grpo_step

    params = preset_params(backend)
    tmp = Path(f"/tmp/bench_train_{backend}")
    paths = TrainPaths(model_dir, tmp / "ckpt", tmp / "final", tmp / "metrics", tmp / "summary.json")
    torch.cuda.reset_peak_memory_stats()
    parts = build_parts(params, style, paths.base_model, paths.live, paths.measured, [r["id"] for r in rows], None)
    # SDPA_CUDNN=1: training attention by cuDNN again (the loader leaves it out: grpo/model/loading.py)
    torch.backends.cuda.enable_cudnn_sdp(res["sdpa_cudnn"])
    loaded = torch.cuda.memory_allocated()
    log(res, f"{backend}_loaded_GiB", round(loaded / GIB, 2))
    phases: dict = {}
    parts.engine = PeakMeasuredEngine(parts.engine, phases)  # a part of the bench's own: generation's peak
    trainer = Trainer(params, style, paths, rows, [], parts, "bench")
    steps = []
    for step in range(int(os.environ.get("STEPS", "2"))):  # step 0 also compiles (and tunes kernels): not steady
        first = step * params.prompts_per_step % len(rows)
        batch_rows = rows[first:first + params.prompts_per_step]
        before = allocator_counts()
        (metrics, ro, _), seconds = timed(lambda: grpo_step(trainer.ctx, batch_rows, step))
        entry = {"s": round(seconds, 2), "generate_s": round(metrics["time_generate_s"], 2),
                 "train_s": round(metrics.get("time_train_s", 0.0), 2),
                 "train_peak_GiB": round(torch.cuda.max_memory_allocated() / GIB, 2), **phases,
                 "rollout_tok_per_s": round(metrics["rollout_tokens_per_s"]),
                 "response_tokens": sum(len(c.token_ids) for c in ro.completions),
                 "prompt_tokens": len(ro.completions[0].prompt_ids),
                 "oom_events": {k.split("/")[1]: v for k, v in metrics.items() if k.startswith("oom_events/")},
                 "micro_batch": {k.split("/")[1]: v for k, v in metrics.items() if k.startswith("micro_batch/")},
                 "allocator": {k: v - before[k] for k, v in allocator_counts().items()}}
        log(res, f"{backend}_step{step}", entry)
        steps.append(entry)
    log(res, f"{backend}_steady_s_per_step", steps[-1]["s"])
    log(res, f"{backend}_microbatch_4x896", microbatch_memory(trainer, loaded))
    parts.engine.engine.close()


def allocator_counts() -> dict[str, int]:
    """The caching allocator's cumulative counters that cost time: cudaMalloc/cudaFree calls and the
    retries after a failed cudaMalloc (each frees every cached block, synchronising the device)."""
    stats = torch.cuda.memory_stats()
    return {"alloc_retries": stats.get("num_alloc_retries", 0), "cuda_mallocs": stats.get("num_device_alloc", 0),
            "cuda_frees": stats.get("num_device_free", 0)}


class PeakMeasuredEngine:
    """The trainer's engine, recording generation's CUDA peak in ``phases``."""

    def __init__(self, engine, phases: dict) -> None:
        self.engine, self.phases = engine, phases

    def generate(self, *args, **kwargs):
        torch.cuda.reset_peak_memory_stats()
        out = self.engine.generate(*args, **kwargs)
        self.phases["generate_peak_GiB"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
        torch.cuda.reset_peak_memory_stats()
        return out


def microbatch_memory(trainer, loaded: int) -> dict:
    """One training micro-batch of 4 × (128 + 768) tokens, forward + backward through the step's own
    log-prob path: peak above the memory held before it (the loaded model and what generation keeps)."""
    from grpo.rollout.base import Completion
    from grpo.train.step import build_batch

    ctx = trainer.ctx
    resp = 64 if QUICK else 768
    comps = [Completion(list(range(1000 + i, 1000 + i + PROMPT)), list(range(5000 + i, 5000 + i + resp)), "", "length")
             for i in range(4)]
    batch = build_batch(comps, V - 2).to(ctx.parts.device)
    trainer.model.train()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()

    _, seconds = timed(lambda: loss_backward(ctx, batch, torch.randn(4, device=ctx.parts.device), resp))
    peak = torch.cuda.max_memory_allocated()
    ctx.parts.optimizer.zero_grad(set_to_none=True)
    return {"peak_above_held_GiB": round((peak - before) / GIB, 2), "held_GiB": round(before / GIB, 2),
            "loaded_model_GiB": round(loaded / GIB, 2), "peak_above_loaded_GiB": round((peak - loaded) / GIB, 2),
            "s": round(seconds, 3)}


# --- kernels ----------------------------------------------------------------------------------
def run_kernels() -> None:
    from grpo.algo.logprobs import chunked_token_logprobs_and_entropy, naive_token_logprobs_and_entropy
    from grpo.kernels.logprob_entropy import fused_token_logprobs_and_entropy

    res: dict = {"quick": QUICK}
    b, t, h = 4, 128 if QUICK else 768, 1536
    torch.manual_seed(0)
    weight = torch.randn(V, h, device="cuda", dtype=torch.bfloat16) * 0.02
    hidden0 = torch.randn(b, t, h, device="cuda", dtype=torch.bfloat16)
    targets = torch.randint(0, V, (b, t), device="cuda")
    mask = (torch.rand(b, t, device="cuda") > 0.2).float()
    adv = torch.randn(b, 1, device="cuda")
    variants = {
        "naive_fp32_logits": lambda x: naive_token_logprobs_and_entropy(x, weight, targets),
        "torch_chunked_1024": lambda x: chunked_token_logprobs_and_entropy(x, weight, targets, chunk_size=1024),
        "triton_fused_1024": lambda x: fused_token_logprobs_and_entropy(x, weight, targets, chunk_size=1024),
        "triton_fused_4096": lambda x: fused_token_logprobs_and_entropy(x, weight, targets, chunk_size=4096),
    }
    outputs = {}
    for name, fn in variants.items():
        def run():
            x = hidden0.clone().requires_grad_(True)
            lp, ent = fn(x)
            ((lp * adv - 0.01 * ent) * mask).sum().backward()
            return lp.detach(), ent.detach(), x.grad

        run()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        outputs[name], _ = timed(run)
        peak = torch.cuda.max_memory_allocated() - before
        times = [timed(run)[1] for _ in range(5)]
        log(res, name, {"ms_fwd_bwd": round(sorted(times)[2] * 1000, 2), "peak_extra_GiB": round(peak / GIB, 3)})
    ref = outputs["naive_fp32_logits"]
    for name, (lp, ent, grad) in outputs.items():
        log(res, f"{name}_vs_naive", {
            "logprob_max_abs": float((lp - ref[0]).abs().max()), "entropy_max_abs": float((ent - ref[1]).abs().max()),
            "grad_rel": float((grad.float() - ref[2].float()).norm() / ref[2].float().norm())})
    save("kernels", res)


if __name__ == "__main__":
    parts = {"rollout": run_rollout, "step": run_step, "kernels": run_kernels}
    if len(sys.argv) != 2 or sys.argv[1] not in parts:
        sys.exit(f"usage: python bench/gpu_bench.py {{{'|'.join(parts)}}}")
    parts[sys.argv[1]]()
