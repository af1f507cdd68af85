"""A decode step's down projection with its split-K sum moved into the next layer's compiled residual add and
norm, against cuBLAS's split-K matmul and its separate reduction (issue 18: cuBLAS's down took 338 + 55 µs of a
64-row decode step on an H100, its `splitKreduce_kernel` the 55).

    python3 bench/down_partials_probe.py [--label L] [--rows 16,64] [--layers 28]

One decode step's "down projection, then the next layer's residual add, norm and q/k/v projection" at the
R1-Distill-Qwen-1.5B shape (random bf16 weights, ``--layers`` distinct layers so that they stream from memory),
captured as one CUDA graph and replayed; µs are per layer. The compiled part is the decoder's own
(``static_layers.qkv_projection`` under ``static_decode.compiled``); ways:
- ``cublas``: ``F.linear`` for down (a bf16 output), the part adds it;
- ``decode_linear``: the split-K kernel with its in-kernel sum at up to 16 rows, cuBLAS above;
- ``shipped``: ``decode_linear.down_projection``: ``decode_linear`` at up to 16 rows, above it ``PARTS`` fp32
  partial sums from one cuBLAS strided-batched matmul over K's parts, which the part's ``residual`` adds (inductor
  fuses the sum into the add and the norm's reduction); ``bmm partials S``: the same with S parts;
- (in the nineteenth session's call 1 also the split-K kernel writing the partials, at 64 and 128 weight rows a
  program: 21.75 µs at best at 16 rows, 23.55 at 64; not kept.)
Then, for the gate/up kernel (``swiglu_dense``): µs at 140, 132 and 66 weight tiles (N = 8960, 8448, 4224), and a
plain read of the same bytes (``torch.sum``): does its 141st-140th tiles' second wave cost a tail, and what read
rate does this GPU reach at all?
Writes $OUT/down_partials_probe_LABEL.json (default bench/results/).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.matmul_4bit_probe import HIDDEN, INTER, captured, probe_args, replay_us  # noqa: E402
from grpo.kernels import decode_linear, fit, swiglu_dense  # noqa: E402
from grpo.rollout.static_decode import compiled  # noqa: E402
from grpo.rollout.static_layers import qkv_projection  # noqa: E402

OUT = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
QKV = HIDDEN + 2 * 256
EPS = 1e-6
BMM_SHARES = [2, 4, 5, 7, 10]
SHIPPED_PARTS = decode_linear.PARTS  # the sweep below sets the module's


def down_parts(parts: int):
    """``decode_linear.down_projection`` with K cut into ``parts`` (its shipped ``PARTS`` otherwise)."""
    def call(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        decode_linear.PARTS = parts
        return decode_linear.down_projection(a[:, None], w)
    return call


def step_us(rows: int, layers: int, down_fn, part) -> tuple[float, float]:
    """µs a layer of down then the compiled part, and the max error of its last layer's q/k/v against cuBLAS's."""
    g = torch.Generator(device="cuda").manual_seed(0)
    downs = [(torch.randn(HIDDEN, INTER, generator=g, device="cuda") * 0.02).bfloat16() for _ in range(layers)]
    w1s = [(torch.ones(HIDDEN, device="cuda").bfloat16(),
            (torch.randn(QKV, HIDDEN, generator=g, device="cuda") * 0.02).bfloat16(),
            torch.zeros(QKV, device="cuda").bfloat16(), None, None) for _ in range(layers)]
    act = torch.randn(rows, INTER, generator=g, device="cuda").bfloat16()
    x0 = torch.randn(rows, 1, HIDDEN, generator=g, device="cuda").bfloat16()

    def run(fn, p):
        x = x0
        for down, w1 in zip(downs, w1s):
            x, qkv = p(x, fn(act, down), w1)
        return qkv

    reference = compiled(lambda x, d, w: qkv_projection(x, d, w, EPS), True)
    expected = run(lambda a, w: F.linear(a, w).view(rows, 1, HIDDEN), reference).float()
    err = (run(down_fn, part).float() - expected).abs().max().item()
    graph, _ = captured(lambda: run(down_fn, part))
    us = replay_us(graph) / layers
    del graph
    return round(us, 2), round(err, 4)


def down_ways(rows: int) -> dict:
    part = compiled(lambda x, d, w: qkv_projection(x, d, w, EPS), True)  # residual() adds partial sums itself
    ways = {"cublas": (lambda a, w: F.linear(a, w).view(rows, 1, HIDDEN), part),
            "decode_linear": (lambda a, w: decode_linear.decode_linear(a, w).view(rows, 1, HIDDEN), part),
            "shipped": (down_parts(SHIPPED_PARTS), part)}
    for s in BMM_SHARES:
        ways[f"bmm partials {s}"] = (down_parts(s), part)
    return ways


def gate_up_waves(rows: int, layers: int) -> dict:
    found = {}
    for n in (INTER, 132 * 64, 66 * 64):
        g = torch.Generator(device="cuda").manual_seed(1)
        ws = [(torch.randn(2 * n, HIDDEN, generator=g, device="cuda") * 0.02).bfloat16() for _ in range(layers)]
        x = torch.randn(rows, HIDDEN, generator=g, device="cuda").bfloat16()
        graph, _ = captured(lambda: [swiglu_dense.swiglu_dense(x, w) for w in ws][-1])
        us = replay_us(graph) / layers
        graph_read, _ = captured(lambda: [w.sum(dtype=torch.float32) for w in ws][-1])
        read_us = replay_us(graph_read) / layers
        mb = 2 * n * HIDDEN * 2 / 1e6
        found[f"N {n}"] = {"us": round(us, 2), "TB/s": round(mb / us, 3),  # MB a µs
                           "read us": round(read_us, 2), "read TB/s": round(mb / read_us, 3)}
        print(f"rows {rows} gate/up N {n}: {found[f'N {n}']}", flush=True)
        del graph, graph_read, ws
    return found


def main() -> None:
    args = probe_args(__doc__)
    torch._dynamo.config.recompile_limit = 64  # the part recompiles for each count of parts
    results: dict = {"gpu": torch.cuda.get_device_name(), "layers": args.layers, "rows": {}}
    for rows in (int(r) for r in args.rows.split(",")):
        table = results["rows"][rows] = {}
        for name, (fn, part) in down_ways(rows).items():
            fit._CHOSEN.clear()
            try:
                us, err = step_us(rows, args.layers, fn, part)
                table[name] = {"us": us, "max_err": err}
            except Exception as exc:  # noqa: BLE001 - a way that does not run here is a finding
                table[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            print(f"rows {rows} {name}: {table[name]}", flush=True)
        table["gate/up waves"] = gate_up_waves(rows, 8)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"down_partials_probe_{args.label}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
