"""What one iteration of a Triton kernel's main loop costs, read from the PTX it compiles to, on a CPU: the
instruction count and the memory, barrier and tensor-core instructions among them, per thread.

    PYTHONPATH=/tmp/t36:. python bench/ptx_loop.py [--rows 64] [--kernel swiglu|matmul]

(``/tmp/t36``: the device's Triton, 3.6, installed apart: ``pip install --no-deps --target /tmp/t36
triton==3.6.0``.) The 4-bit kernels are compiled for sm_90 at the launch the 1.5B decoder makes, with the
16-byte divisibility Triton's launcher gives aligned pointers and integers (``bench/smem_fit.py``'s
builders): without it, Triton loads x one value at a time and the reading is wrong. The first loop in the PTX
is the K loop. This is how the 4-bit kernels' cost was found (bench/RESULTS.md, ninth session): a count
here is a prediction to take to a GPU, not a timing.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.smem_fit import matmul_4bit_launch, source  # noqa: E402
from grpo.kernels import matmul_4bit  # noqa: E402

WATCHED = (r"(ld\.global|st\.global|cp\.async\.c[ag]|ld\.shared|st\.shared|ldmatrix|stmatrix|shfl|bar\.sync"
           r"|wgmma\.mma_async|mma\.sync)")


def loop_body(ptx: str) -> list[str]:
    """The instructions of the PTX's first loop (from its header label to the next label)."""
    lines = ptx.splitlines()
    start = next(i for i, line in enumerate(lines) if "Loop Header" in line)
    end = next(i for i in range(start + 1, len(lines)) if re.match(r"^\$L__BB\d+_\d+:", lines[i]))
    return [line.strip() for line in lines[start + 1:end] if re.match(r"^\s+[@a-z]", line)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=["swiglu", "matmul"], default="swiglu")
    parser.add_argument("--rows", type=int, default=64, help="rows of x (the decoder's sequences), 16 to 64")
    parser.add_argument("--warps", type=int, default=None, help="default: the launcher's (launch_for)")
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--block-n", type=int, default=None,
                        help="weight rows a program computes; default: the launcher's (launch_for)")
    args = parser.parse_args()
    launch = matmul_4bit.launch_for(torch.bfloat16, args.kernel == "swiglu", args.rows)
    args.warps, args.block_n = args.warps or launch.warps, args.block_n or launch.block_n
    fn, signature, constants = matmul_4bit_launch("bfloat16", args.kernel == "swiglu", args.block_n, args.rows)
    compiled = triton.compile(source(fn, signature, constants), target=GPUTarget("cuda", 90, 32),
                              options={"num_stages": args.stages, "num_warps": args.warps})
    body = loop_body(compiled.asm["ptx"])
    ops = Counter(m.group(1) for line in body if (m := re.search(WATCHED, line.lstrip("@!%p0123456789 "))))
    print(f"Triton {triton.__version__}, sm_90, {args.kernel} at {args.rows} rows, {args.warps} warps, "
          f"{args.stages} stages, BLOCK_N {args.block_n}: BLOCK_K = {constants['BLOCK_K']} columns an iteration")
    print(f"  {len(body)} PTX instructions an iteration, per thread; of them:")
    for op, count in sorted(ops.items(), key=lambda kv: -kv[1]):
        print(f"    {count:4d}  {op}")


if __name__ == "__main__":
    main()
