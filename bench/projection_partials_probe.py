"""A decode step's q/k/v and output projections as cuBLAS matmuls over parts of K with fp32 partial sums, against
cuBLAS's one matmul (issue 18: at 64 rows cuBLAS ran them as 64 and ~64 tiles, no split of K, at 5.8 and 5.2 µs a
layer for 6.3 and 4.7 MB on an H100, 1.1 and 0.9 TB/s; the down projection's partial sums gained there).

    python3 bench/projection_partials_probe.py [--label L] [--rows 16,64] [--layers 28]

Random bf16 weights at the R1-Distill-Qwen-1.5B shape, ``--layers`` distinct layers streamed, captured as one CUDA
graph and replayed; µs are per layer. Each part is the decoder's own compiled code (``static_decode.compiled``):
- output: the attention's output through the output projection, then the residual add and the MLP's norm
  (``static_layers.output_projection``): ``shipped`` (``decode_linear_op``: the split-K kernel at up to 16 rows,
  cuBLAS above), ``bmm P`` (P fp32 partials from one strided-batched matmul, the compiled add summing them);
- q/k/v: the residual add, norm and q/k/v projection with its bias (``static_layers.qkv_projection``):
  ``shipped``; ``bmm P`` without the partials' sum (what the attention kernel would pay on top is its reads);
  ``bmm P + sum`` with a separate compiled sum, bias and rounding (the bound if nothing fused it).
Writes $OUT/projection_partials_probe_LABEL.json (default bench/results/).
"""
from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.matmul_4bit_probe import HIDDEN, captured, probe_args, replay_us  # noqa: E402
from grpo.kernels.decode_linear import decode_linear_op, part_sums  # noqa: E402
from grpo.rollout.static_decode import compiled  # noqa: E402
from grpo.rollout.static_layers import _rms, output_projection, qkv_projection, residual  # noqa: E402

OUT = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
QKV = HIDDEN + 2 * 256
EPS = 1e-6
PARTS = [2, 3, 4, 6]


def add_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream ``residual(x, delta)`` (partial sums summed there) and its norm."""
    x = residual(x, delta)
    return x, _rms(x, weight, EPS)


def timed(run, expected: torch.Tensor | None, layers: int) -> dict:
    """µs a layer of ``run`` captured and replayed, and its output's max error against ``expected``."""
    out = run()
    err = None if expected is None else round((out.float() - expected.float()).abs().max().item(), 4)
    graph, _ = captured(run)
    us = replay_us(graph)
    del graph
    return {"us": round(us / layers, 2), "max_err": err}


def output_ways(rows: int, layers: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    ws = [((torch.randn(HIDDEN, HIDDEN, generator=g, device="cuda") * 0.02).bfloat16(), None, None, None,
           torch.ones(HIDDEN, device="cuda").bfloat16()) for _ in range(layers)]
    a = torch.randn(rows, 1, HIDDEN, generator=g, device="cuda").bfloat16()
    x0 = torch.randn(rows, 1, HIDDEN, generator=g, device="cuda").bfloat16()
    shipped = compiled(partial(output_projection, eps=EPS, linear=decode_linear_op), True)
    norm = compiled(add_norm, True)

    def chain(step):
        def run():
            x = x0
            for w in ws:
                x, h = step(x, w)
            return h
        return run

    found = {"shipped": chain(lambda x, w: shipped(x, a, w))}
    for p in PARTS:
        # the matmul eager, its partials into the compiled add: the decoder would call it as an opaque op
        found[f"bmm {p}"] = chain(lambda x, w, p=p: norm(x, part_sums(a, w[0], p), w[4]))
    expected = found["shipped"]()
    return {name: timed(run, expected, layers) for name, run in found.items()}


def qkv_ways(rows: int, layers: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(1)
    ws = [(torch.ones(HIDDEN, device="cuda").bfloat16(),
           (torch.randn(QKV, HIDDEN, generator=g, device="cuda") * 0.02).bfloat16(),
           (torch.randn(QKV, generator=g, device="cuda") * 0.02).bfloat16(), None, None) for _ in range(layers)]
    x0 = torch.randn(rows, 1, HIDDEN, generator=g, device="cuda").bfloat16()
    delta = torch.randn(rows, 1, HIDDEN, generator=g, device="cuda").bfloat16()
    shipped = compiled(partial(qkv_projection, eps=EPS, linear=decode_linear_op), True)
    norm = compiled(add_norm, True)
    summed = compiled(lambda parts, b: (parts.sum(0) + b.float()).to(torch.bfloat16), True)

    def run_with(project):
        def run():
            x, out = x0, None
            for w in ws:
                x, out = project(x, w)
            return out
        return run

    def parts_of(p, add):
        def project(x, w):
            x, h = norm(x, delta, w[0])
            parts = part_sums(h, w[1], p)
            return x, summed(parts, w[2]) if add else parts
        return project

    found = {"shipped": run_with(lambda x, w: shipped(x, delta, w))}
    for p in PARTS:
        found[f"bmm {p}"] = run_with(parts_of(p, False))
        found[f"bmm {p} + sum"] = run_with(parts_of(p, True))
    expected = found["shipped"]()
    return {name: timed(run, None if name.split()[-1].isdigit() else expected, layers)
            for name, run in found.items()}


def main() -> None:
    args = probe_args(__doc__)
    torch._dynamo.config.recompile_limit = 64
    results: dict = {"gpu": torch.cuda.get_device_name(), "layers": args.layers, "rows": {}}
    for rows in (int(r) for r in args.rows.split(",")):
        results["rows"][rows] = {}
        for what, ways in (("output", output_ways), ("qkv", qkv_ways)):
            try:
                results["rows"][rows][what] = ways(rows, args.layers)
            except Exception as exc:  # noqa: BLE001 - a way that does not run here is a finding
                results["rows"][rows][what] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(f"rows {rows} {what}: {json.dumps(results['rows'][rows][what])}", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"projection_partials_probe_{args.label}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
