"""Why the 4-bit MLP kernels failed on the H100 (2026-12-05, seventh session), and which launch settings fit.

    python3 bench/matmul_4bit_probe.py     (writes $OUT/matmul_4bit_probe.json; default bench/results/)

The first device run of grpo/kernels/matmul_4bit.py showed two failures: the fp32 SwiGLU test asked for
245,760 bytes of shared memory (the H100 allows 232,448), and the train stage's decoder with
``train.generation_mlp_4bit`` stopped with "operation failed due to a previous error during capture". This
probe takes the kernels apart at the R1-Distill-Qwen-1.5B MLP's shapes (random nf4 weights, bitsandbytes'
own quantiser): for each dtype, rows (16 and 64) and Triton's ``num_stages`` / ``num_warps``:
- an eager call against bitsandbytes' de-quantisation and ``F.linear`` (the error, with its traceback);
- the same call warmed up on a side stream and captured as a CUDA graph, as the static decoder does, replayed
  and compared;
- the replay's time (the MLP of one layer at one decode step: gate/up fused, then down with split K).
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from grpo.kernels import matmul_4bit as mk  # noqa: E402
from grpo.model.dequant import dequantized  # noqa: E402

OUT = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
HIDDEN, INTER = 1536, 8960


def layer(n: int, k: int, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    import bitsandbytes as bnb

    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02
    lin = bnb.nn.Linear4bit(k, n, bias=False, compute_dtype=dtype, quant_type="nf4", compress_statistics=True)
    lin.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4", compress_statistics=True)
    return lin.to("cuda")


def mlp(x: torch.Tensor, gate, up, down, launch: dict, part: str = "both") -> torch.Tensor:
    """grpo.kernels.matmul_4bit's two calls (``part``: both, or only ``swiglu`` or ``down``, whose input is
    then ``x`` cut to the intermediate width), with ``launch`` (num_stages, num_warps) passed to Triton."""
    kernel = mk._matmul_4bit_kernel
    original, block_n = kernel.run, mk.BLOCK_N
    launch = dict(launch)
    mk.BLOCK_N = launch.pop("block_n", block_n)  # weight rows a program computes

    def run(*args, **kwargs):
        return original(*args, **{**kwargs, **launch})

    kernel.run = run
    try:
        if part == "swiglu":
            return mk.swiglu_4bit(x, gate, up)
        if part == "down":
            return mk.matmul_4bit(x.repeat(1, INTER // HIDDEN + 1)[:, :INTER].contiguous(), down)
        return mk.matmul_4bit(mk.swiglu_4bit(x, gate, up), down)
    finally:
        kernel.run = original
        mk.BLOCK_N = block_n


def captured(fn) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """``fn`` warmed up on a side stream, then captured, as the static decoder does; replayed once."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph, out


def replay_us(graph: torch.cuda.CUDAGraph, reps: int = 200) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(20):
        graph.replay()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) / reps * 1000, 1)


def dense_mlp(x: torch.Tensor, dense) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, dense[0])) * F.linear(x, dense[1]), dense[2])


def probe(dtype: torch.dtype, rows: int, launch: dict, weights, dense) -> dict:
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=dtype)
    expected = dense_mlp(x, dense).float()
    res: dict = {"dtype": str(dtype).split(".")[-1], "rows": rows, **launch}
    for mode in ("eager", "graph"):
        try:
            if mode == "eager":
                got = mlp(x, *weights, launch)
                torch.cuda.synchronize()
            else:
                graph, got = captured(lambda: mlp(x, *weights, launch))
                res["graph_us"] = replay_us(graph)
                for part in ("swiglu", "down"):  # each kernel alone (down's input: x, widened)
                    res[f"{part}_us"] = replay_us(captured(lambda: mlp(x, *weights, launch, part))[0])
            res[f"{mode}_max_err"] = (got.float() - expected).abs().max().item()
        except Exception as exc:  # noqa: BLE001 - the error is the finding
            res[f"{mode}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            res[f"{mode}_trace"] = traceback.format_exc()[-1500:]
            break
    return res


def compiled_kernels() -> list[dict]:
    """What Triton built for each launch: registers, spills, shared memory, warps, stages."""
    found = []
    for caches in mk._matmul_4bit_kernel.device_caches.values():
        for key, kernel in caches[0].items():
            meta = kernel.metadata
            found.append({"n_regs": getattr(kernel, "n_regs", None), "n_spills": getattr(kernel, "n_spills", None),
                          "shared": meta.shared, "num_warps": meta.num_warps, "num_stages": meta.num_stages,
                          "key": str(key)[-300:]})
    return found


def dense_us(dtype: torch.dtype, rows: int, dense) -> float:
    """The dense copy's MLP at the same rows, captured: the baseline the 4-bit read must beat."""
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=dtype)
    return replay_us(captured(lambda: dense_mlp(x, dense))[0])


def main() -> None:
    results = {"device": torch.cuda.get_device_name(), "triton_interpret": os.environ.get("TRITON_INTERPRET"),
               "runs": [], "dense_us": {}}
    # {}: the launcher's own choice (the first of launch_options that fits); the others override it
    # 8c9b7da ran two programs an SM (128 registers at 8 warps): fewer warps or registers may run more
    launches = {torch.bfloat16: [{}, {"num_warps": 4}, {"num_warps": 4, "num_stages": 2}, {"num_stages": 4},
                                 {"block_n": 128}, {"block_n": 32}]}
    for dtype in launches:  # the decoder's dtype on a GPU (fp32 passed its test on the H100 on 2026-12-06)
        mods = [layer(INTER, HIDDEN, dtype, 0), layer(INTER, HIDDEN, dtype, 1), layer(HIDDEN, INTER, dtype, 2)]
        weights = [mk.Weight4bit.of(m) for m in mods]
        dense = [dequantized(m).to(dtype) for m in mods]
        for rows in (16, 64):
            results["dense_us"][f"{dtype}-{rows}"] = dense_us(dtype, rows, dense)
            for launch in launches[dtype]:
                res = probe(dtype, rows, launch, weights, dense)
                print({k: v for k, v in res.items() if not k.endswith("trace")}, flush=True)
                results["runs"].append(res)
                OUT.mkdir(parents=True, exist_ok=True)
                (OUT / "matmul_4bit_probe.json").write_text(json.dumps(results, indent=1))
    print("dense MLP (captured) us:", results["dense_us"])
    try:
        results["compiled"] = compiled_kernels()
    except (AttributeError, IndexError, TypeError) as exc:  # Triton's internals differ between versions
        results["compiled"] = [{"error": repr(exc)}]
    for kernel in results["compiled"]:
        print({k: v for k, v in kernel.items() if k != "key"})
    (OUT / "matmul_4bit_probe.json").write_text(json.dumps(results, indent=1))
    for res in results["runs"]:
        for key in ("eager_trace", "graph_trace"):
            if key in res:
                print(f"--- {res['dtype']} rows {res['rows']} {key} ---\n{res[key]}")
                break


if __name__ == "__main__":
    main()
