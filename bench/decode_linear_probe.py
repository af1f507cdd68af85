"""The split-K decode matmul (grpo/kernels/decode_linear.py) against cuBLAS at a decode step's rows, for the
static decoder's q/k/v, output and down projections at the R1-Distill-Qwen-1.5B shape (random bf16 weights).

    python3 bench/decode_linear_probe.py [--label L] [--rows 16,64] [--layers 28]

Each way runs ``--layers`` distinct layers' weights (28 layers' q/k/v are 176 MB against an H100's 50 MB L2, so
they stream from memory as in a real step), captured as one CUDA graph and replayed; µs are per layer's call.
Ways: cuBLAS (``F.linear``, the bias in its epilogue), and the kernel (``split_k_linear``, whatever
``decode_linear`` would choose) at each of its launch options (``decode_linear.OPTIONS``), at programs = 0.5,
1 and 2 times the multiprocessors (its shares of K), and at 32 and 128 weight rows a program.
Each kernel result is checked against ``F.linear`` first (max abs error, bf16). Writes
$OUT/decode_linear_probe_LABEL.json (default bench/results/).
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
from grpo.kernels import decode_linear, fit  # noqa: E402

OUT = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
QKV = HIDDEN + 2 * 256  # 12 query heads and 2 kv heads of 128
SHAPES = [("qkv", QKV, HIDDEN, True), ("o", HIDDEN, HIDDEN, False), ("down", HIDDEN, INTER, False)]
SHIPPED_BLOCK_N = decode_linear.BLOCK_N


def ways(sms: int) -> list[tuple[str, tuple[int, int] | None, int, int]]:
    """(name, launch option or None for cuBLAS, programs, weight rows a program)."""
    found = [("cublas", None, 0, 0)]
    found += [(f"split K{bk} s{st}", (bk, st), sms, decode_linear.BLOCK_N) for bk, st in decode_linear.OPTIONS]
    first = decode_linear.OPTIONS[0]
    found += [(f"split K{first[0]} s{first[1]} programs {p}", first, p, decode_linear.BLOCK_N)
              for p in (sms // 2, 2 * sms)]
    found += [(f"split K{first[0]} s{first[1]} BLOCK_N {bn}", first, sms, bn) for bn in (32, 128)]
    return found


def main() -> None:
    args = probe_args(__doc__)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    results = {"gpu": torch.cuda.get_device_name(), "sms": sms, "layers": args.layers, "rows": {}}
    g = torch.Generator(device=dev).manual_seed(0)
    for rows in (int(r) for r in args.rows.split(",")):
        table = results["rows"][rows] = {}
        for name, n, k, has_bias in SHAPES:
            ws = [(torch.randn(n, k, generator=g, device=dev) * 0.02).bfloat16() for _ in range(args.layers)]
            bs = [torch.randn(n, generator=g, device=dev).bfloat16() if has_bias else None for _ in ws]
            x = torch.randn(rows, 1, k, generator=g, device=dev).bfloat16()
            row = table[name] = {}
            for way, option, programs, block_n in ways(sms):
                if option is None:
                    fn = F.linear
                else:
                    block_m = decode_linear.block_m_for(rows, decode_linear.MAX_BLOCK_M)
                    # keyed by the tensors' device (cuda:0): the eighteenth session's call 3 keyed it "cuda", so
                    # its option rows all ran the first option
                    fit._CHOSEN[("decode_linear", x.device, torch.bfloat16, block_m)] = option
                    decode_linear._programs_wanted = lambda device, p=programs: p  # the shares this way cuts K into
                    decode_linear.BLOCK_N = block_n
                    fn = lambda x, w, b: decode_linear.split_k_linear(x.view(-1, x.shape[-1]), w, b)  # noqa: E731
                    err = (fn(x, ws[0], bs[0]).float() - F.linear(x[:, 0], ws[0], bs[0]).float()).abs().max().item()
                    row[f"{way} max_abs_err"] = round(err, 5)
                graph, _ = captured(lambda: [fn(x, w, b) for w, b in zip(ws, bs)])
                row[way] = round(replay_us(graph) / args.layers, 2)
                del graph
                # the next way starts from the shipped tiles (the nineteenth session's call 1 left 128 weight rows
                # a program set for every later shape: its rows after the first shape's are not as labelled)
                decode_linear.BLOCK_N = SHIPPED_BLOCK_N
            print(f"rows {rows} {name}: " + ", ".join(f"{w} {v}" for w, v in row.items()), flush=True)
            del ws, bs
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"decode_linear_probe_{args.label}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
