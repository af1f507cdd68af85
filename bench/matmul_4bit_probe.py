"""The 4-bit MLP kernels (grpo/kernels/matmul_4bit.py) taken apart on a GPU at the R1-Distill-Qwen-1.5B MLP's
shapes (random nf4 weights, bitsandbytes' own quantiser, bf16), against the dense copy the decoder otherwise
keeps.

    python3 bench/matmul_4bit_probe.py [--label new] [--rows 16,64] [--no-sweep]
    GRPO_TREE=/path/to/old/tree python3 bench/matmul_4bit_probe.py --label old --no-sweep   # same call

Writes $OUT/matmul_4bit_probe_LABEL.json (default bench/results/). For each row count (the decoder's sequences
a step), at the launcher's own choice (``LAUNCHES``):
- an eager call against bitsandbytes' de-quantisation and ``F.linear`` (an error is kept with its traceback:
  the seventh session's capture failure was found so);
- the same call warmed up on a side stream and captured as a CUDA graph, as the static decoder does, replayed
  and compared, and its replay time (one layer's MLP at one decode step: gate/up fused, then down with split
  K), each kernel alone too, and the dense copy's MLP by part;
then, unless ``--no-sweep``, each kernel alone over other launches (``sweep_launches``), and the fastest for
each part and row count (``bench/decode_speed.py --launches`` decodes with them).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.environ.get("GRPO_TREE", str(Path(__file__).resolve().parent.parent)))  # a baseline's tree
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
    then ``x`` widened to the intermediate width), with ``launch``'s num_stages passed to Triton and its
    block_n / block_m / num_warps / min_programs made the module's cut (``LAUNCHES``) for the call."""
    kernel = mk._matmul_4bit_kernel
    original, launches = kernel.run, dict(getattr(mk, "LAUNCHES", {}))
    launch = dict(launch)
    stages = {"num_stages": launch.pop("num_stages")} if "num_stages" in launch else {}
    if launch:  # one cut for every case (a tree with mk.Launch)
        mk.LAUNCHES = {key: cut(launch) for key in launches}

    def run(*args, **kwargs):
        return original(*args, **{**kwargs, **stages})

    kernel.run = run
    try:
        if part == "swiglu":
            return mk.swiglu_4bit(x, gate, up)
        if part == "down":
            return mk.matmul_4bit(widened(x), down)
        return mk.matmul_4bit(mk.swiglu_4bit(x, gate, up), down)
    finally:
        kernel.run = original
        if launches:
            mk.LAUNCHES = launches


def widened(x: torch.Tensor) -> torch.Tensor:
    """x repeated to the down projection's input width."""
    return x.repeat(1, INTER // HIDDEN + 1)[:, :INTER].contiguous()


def probe_args(doc: str, layers: int = 28) -> argparse.Namespace:
    """The decode probes' common arguments: ``--label`` (the JSON's name), ``--rows`` (a decode step's rows, comma
    separated) and ``--layers`` (distinct layers' weights streamed)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--label", default="probe")
    parser.add_argument("--rows", default="16,64")
    parser.add_argument("--layers", type=int, default=layers)
    return parser.parse_args()


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


def sweep_part(dtype: torch.dtype, rows: int, part: str, launch: dict, weights, dense) -> dict:
    """One kernel (``swiglu`` or ``down``) alone at ``launch``: its error against the dense reference and its
    captured replay time. Narrower tiles and fewer warps give more programs an SM: the 8c9b7da kernel ran
    140 programs of 8 warps for gate/up on 132 SMs, about one an SM."""
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=dtype)
    expected = (F.silu(F.linear(x, dense[0])) * F.linear(x, dense[1]) if part == "swiglu" else
                F.linear(widened(x), dense[2])).float()
    res: dict = {"rows": rows, "part": part, **launch}
    try:
        graph, got = captured(lambda: mlp(x, *weights, launch, part))
        res["us"] = replay_us(graph)
        res["max_err"] = (got.float() - expected).abs().max().item()
    except Exception as exc:  # noqa: BLE001 - an option that does not compile or load is a finding
        res["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return res


def sweep_launches(part: str, rows: int) -> list[dict]:
    """Launches around the launcher's choice that put more warps on each SM: Nsight Compute found both kernels
    at one or two active warps a scheduler, each issuing every ~4 cycles (tenth and eleventh sessions). K split
    into more ranges (fp32 partials, then a kernel that adds them and, for gate/up, applies SwiGLU), narrower
    weight tiles, x's rows split over programs (each program de-quantises its tile again)."""
    if part == "swiglu":  # (weight rows, warps, x rows, programs wanted): 140 / 560 tiles at 64 / 16 rows
        shapes = [(64, 4, 64, 1), (64, 4, 64, 280), (64, 4, 64, 420), (64, 4, 64, 560), (64, 4, 64, 1120),
                  (64, 4, 32, 560), (128, 8, 64, 560)] if rows > 16 else \
            [(16, 1, 16, 1), (16, 1, 16, 1120), (16, 1, 16, 2240), (32, 2, 16, 560), (32, 2, 16, 1120),
             (64, 4, 16, 560)]
    else:  # 24 tiles of 64 rows
        shapes = [(64, 4, 64, 264), (64, 4, 64, 528), (64, 4, 64, 1056), (32, 4, 64, 528), (32, 2, 64, 1056)] \
            if rows > 16 else [(64, 4, 16, 264), (64, 4, 16, 528), (32, 2, 16, 528), (32, 2, 16, 1056),
                               (16, 1, 16, 1056), (16, 1, 16, 2112)]
    return [{"block_n": bn, "num_warps": w, "block_m": bm, "min_programs": p} for bn, w, bm, p in shapes]


def best_launches(sweep: list[dict]) -> dict:
    """The fastest swept launch for each part and rows ("swiglu16", "down64", ...), as the sweep wrote it
    (``bench/decode_speed.py --launches`` takes this)."""
    best: dict = {}
    for res in sweep:
        name = f"{res['part']}{res['rows']}"
        if "us" in res and (name not in best or res["us"] < best[name]["us"]):
            best[name] = res
    return {name: {k: v for k, v in res.items() if k not in ("rows", "part", "max_err")} for name, res in best.items()}


def cut(launch: dict):
    """A swept launch (probe names) as the module's ``Launch``."""
    names = {"block_n": "block_n", "block_m": "max_block_m", "num_warps": "warps", "min_programs": "min_programs"}
    return dataclasses.replace(mk.Launch(), **{names[k]: v for k, v in launch.items() if k in names})


def install_best(path: Path) -> dict:
    """The fastest launches a probe file found ("best") made the module's ``LAUNCHES``, by the sweep's names
    ("swiglu16", "down64", ...); returns the cuts now in force."""
    best = json.loads(path.read_text()).get("best")
    if not best:
        raise SystemExit(f"{path}: no 'best' launches (a probe file written with its sweep has them)")
    for swiglu, few_rows in mk.LAUNCHES:
        name = f"{'swiglu' if swiglu else 'down'}{16 if few_rows else 64}"
        if name in best:
            mk.LAUNCHES[(swiglu, few_rows)] = cut(best[name])
    return {str(key): str(launch) for key, launch in mk.LAUNCHES.items()}


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


def dense_us(dtype: torch.dtype, rows: int, dense) -> dict:
    """The dense copy's MLP at the same rows, captured, whole and by part as the decoder runs it (gate and up
    one matmul, then SwiGLU; down): the baseline the 4-bit read must beat."""
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=dtype)
    gate_up = torch.cat(dense[:2])

    def swiglu() -> torch.Tensor:
        gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
        return F.silu(gate) * up

    wide = widened(x)
    return {"mlp": replay_us(captured(lambda: dense_mlp(x, dense))[0]), "swiglu": replay_us(captured(swiglu)[0]),
            "down": replay_us(captured(lambda: F.linear(wide, dense[2]))[0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="new", help="names the output file (the tree it measured)")
    parser.add_argument("--no-sweep", action="store_true", help="only the launcher's own choice")
    parser.add_argument("--rows", default="16,64", help="the decoder's sequences a step, comma-separated")
    args = parser.parse_args()
    out = OUT / f"matmul_4bit_probe_{args.label}.json"
    dtype = torch.bfloat16  # the decoder's dtype on a GPU (fp32 passed its test on the H100 on 2026-12-06)
    results = {"device": torch.cuda.get_device_name(), "tree": os.environ.get("GRPO_TREE", "this"), "runs": [],
               "dense_us": {}, "sweep": []}
    mods = [layer(INTER, HIDDEN, dtype, 0), layer(INTER, HIDDEN, dtype, 1), layer(HIDDEN, INTER, dtype, 2)]
    weights = [mk.Weight4bit.of(m) for m in mods]
    dense = [dequantized(m).to(dtype) for m in mods]
    OUT.mkdir(parents=True, exist_ok=True)
    rows_list = [int(r) for r in args.rows.split(",")]
    for rows in rows_list:  # the launcher's own choice (the first of launch_options that fits): whole MLP, parts
        results["dense_us"][f"{rows}"] = dense_us(dtype, rows, dense)
        res = probe(dtype, rows, {}, weights, dense)
        print({k: v for k, v in res.items() if not k.endswith("trace")}, "dense:", results["dense_us"][f"{rows}"],
              flush=True)
        results["runs"].append(res)
        out.write_text(json.dumps(results, indent=1))
    for rows in () if args.no_sweep else rows_list[::-1]:
        for part in ("swiglu", "down"):
            for launch in sweep_launches(part, rows):
                res = sweep_part(dtype, rows, part, launch, weights, dense)
                print(res, flush=True)
                results["sweep"].append(res)
                out.write_text(json.dumps(results, indent=1))
    if results["sweep"]:
        results["best"] = best_launches(results["sweep"])
        print("fastest launch by part and rows:", results["best"])
    try:
        results["compiled"] = compiled_kernels()
    except (AttributeError, IndexError, TypeError) as exc:  # Triton's internals differ between versions
        results["compiled"] = [{"error": repr(exc)}]
    out.write_text(json.dumps(results, indent=1))
    for res in results["runs"]:
        for key in ("eager_trace", "graph_trace"):
            if key in res:
                print(f"--- {res['dtype']} rows {res['rows']} {key} ---\n{res[key]}")
                break


if __name__ == "__main__":
    main()
