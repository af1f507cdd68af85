"""Does every Triton kernel of grpo/kernels load on the user's card? Shared memory a program asks for, by GPU
architecture, compiled here on a CPU (Triton's own ptxas, no GPU needed), at the launch parameters the
R1-Distill-Qwen-1.5B decoder and trainer use.

    python bench/smem_fit.py [--out bench/results/smem_fit.json]

Why: a kernel that asks for more shared memory than a block may have does not load (Triton raises
OutOfResources). The fused 4-bit gate/up kernel did so on an H100 in fp32 (2026-12-05), and the 8 GB
preset's card, an RTX 3060 Ti (sm_86), allows 99 KiB a block against an H100's 227 KiB. The figures are
this machine's Triton's (its version is printed); another version may lay a kernel out differently, or not
compile it at all (Triton 3.6's compiler crashed on a ``tl.gather`` that 3.9 compiled, 2026-12-06): to check
the version a GPU runs, install it apart (``pip install --no-deps --target /tmp/t36 triton==3.6.0``) and put
it first (``PYTHONPATH=/tmp/t36:. python bench/smem_fit.py``).
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import bitsandbytes.functional
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from grpo.kernels import decode_attention, decode_linear, logprob_entropy, matmul_4bit, swiglu_dense  # noqa: E402

# the most shared memory one block may opt into (CUDA C Programming Guide, "Compute capabilities" table)
CARDS = {"A100 (sm_80)": (80, 163 * 1024), "RTX 30 (sm_86)": (86, 99 * 1024), "RTX 40 (sm_89)": (89, 99 * 1024),
         "H100/H200 (sm_90)": (90, 227 * 1024)}
R1 = dict(heads=12, kv_heads=2, head_dim=128)  # bench/r1_model.py's attention shape


def matmul_4bit_launch(dtype: str, swiglu: bool, block_n: int, block_m: int = 64) -> tuple:
    """(kernel, signature, constexprs) of one 4-bit kernel launch as grpo/kernels/matmul_4bit.py makes it, for
    ``source`` (also bench/ptx_loop.py and tests/kernels/test_compile.py)."""
    t = "fp32" if dtype == "float32" else "bf16"
    signature = {"x_ptr": f"*{t}", "stride_xm": "i32", "out_ptr": f"*{t}", "stride_om": "i32",
                 "stride_split": "i32", "stride_up": "i32", "M": "i32", "N": "i32", "K": "i32", "w_ptr": "*u8", "absmax_ptr": "*fp32",
                 "up_ptr": "*u8", "up_absmax_ptr": "*fp32", "code_ptr": "*fp32", "k_blocks_per_split": "i32"}
    nf4 = tuple(bitsandbytes.functional.get_4bit_type("nf4", device="cpu").tolist())
    high, low = ("", "") if dtype == "float32" else \
        (matmul_4bit.code_lookup(nf4, getattr(torch, dtype), low) for low in (False, True))
    constants = {"BLOCKSIZE": 64, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": matmul_4bit.block_k(64),
                 "SWIGLU": swiglu, "SPLIT": True, "DOT_IEEE": dtype == "float32", "HIGH": high, "LOW": low}
    return matmul_4bit._matmul_4bit_kernel, signature, constants


def _decode_attention(dtype: str, block: int) -> tuple:
    t = "fp32" if dtype == "float32" else "bf16"
    signature = {"qkv_ptr": f"*{t}", "qkv_stride": "i32", "cos_ptr": f"*{t}", "sin_ptr": f"*{t}", "cs_stride": "i32",
                 "qn_ptr": f"*{t}", "kn_ptr": f"*{t}", "eps": "fp32", "kc_ptr": f"*{t}", "vc_ptr": f"*{t}",
                 "c_stride_s": "i32", "c_stride_h": "i32", "c_stride_l": "i32", "valid_ptr": "*u8",
                 "valid_stride": "i32", "cursor_ptr": "*i64", "out_ptr": f"*{t}", "out_stride": "i32",
                 "part_ptr": "*fp32", "stat_ptr": "*fp32", "scale": "fp32"}
    group = R1["heads"] // R1["kv_heads"]
    constants = {"HQ": R1["heads"], "HKV": R1["kv_heads"], "G": group, "GP": max(16, triton.next_power_of_2(group)),
                 "D": R1["head_dim"], "BLOCK": block, "CHUNK": 1024, "SPLITS": 1, "HAS_NORM": False,
                 "DOT_FP32": dtype == "float32", "PDL": False}
    return decode_attention._decode_attention_kernel, signature, constants


def _logprob(kernel_name: str) -> tuple:
    kernel = getattr(logprob_entropy, kernel_name)
    pointers = ["lse_ptr", "logprob_ptr", "entropy_ptr"] if kernel_name == "_stats_kernel" else \
        ["lse_ptr", "entropy_ptr", "g_lp_ptr", "g_ent_ptr"]
    signature = {"logits_ptr": "*bf16", "targets_ptr": "*i64", **{p: "*fp32" for p in pointers},
                 "stride": "i32", "V": "i32", "inv_t": "fp32"}
    return kernel, signature, {"BLOCK": logprob_entropy.BLOCK_V}


def source(fn, signature: dict, constants: dict) -> ASTSource:
    """The kernel as Triton's launcher specialises it: pointers (torch allocates 16-byte aligned) and integers
    that are multiples of 16 (every one at the R1 launch but the K blocks of a 4-bit split or a decode_linear
    share, 24 or 5-28, and the keyed sampler's part of the vocabulary, 4,748) marked so."""
    aligned = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a, t in signature.items()
               if (t.startswith("*") or t == "i32") and a not in ("k_blocks_per_split", "blocks_per_share", "chunk")}
    return ASTSource(fn, {**signature, **{k: "constexpr" for k in constants}}, constexprs=constants, attrs=aligned)


def matmul_4bit_options(dtype: str) -> list[tuple[str, list[tuple[dict, tuple]]]]:
    """For each cut the 4-bit launcher makes in ``dtype`` (``matmul_4bit.launch_for``, at 16 and 64 rows): its
    name and, in the launcher's order (``launch_options``), each option's Triton options and (kernel,
    signature, constexprs). Also tests/kernels/test_compile.py."""
    found = []
    for swiglu, rows in itertools.product((True, False), (16, 64)):
        launch = matmul_4bit.launch_for(getattr(torch, dtype), swiglu, rows)
        found.append((f"{'swiglu' if swiglu else 'matmul'}_4bit {dtype} {rows} rows warps={launch.warps}",
                      [({"num_stages": stages, "num_warps": launch.warps},
                        matmul_4bit_launch(dtype, swiglu, block_n, rows))
                       for block_n, stages in matmul_4bit.launch_options(launch.block_n)]))
    return found


def swiglu_dense_options(dtype: str, rows: int = 64) -> list[tuple[dict, tuple]]:
    """The dense gate/up kernel's launch options in its launcher's order (``swiglu_dense.OPTIONS``): Triton
    options and (kernel, signature, constexprs). Also tests/kernels/test_compile.py."""
    t = "fp32" if dtype == "float32" else "bf16"
    signature = {"x_ptr": f"*{t}", "stride_xm": "i32", "w_ptr": f"*{t}", "out_ptr": f"*{t}", "stride_om": "i32",
                 "M": "i32", "N": "i32", "K": "i32"}
    return [({"num_stages": stages, "num_warps": 4},
             (swiglu_dense._swiglu_dense_kernel, signature,
              {"BLOCK_M": rows, "BLOCK_N": swiglu_dense.BLOCK_N, "BLOCK_K": block_k, "DOT_IEEE": dtype == "float32",
               "PDL": False}))
            for block_k, stages in swiglu_dense.OPTIONS]


def decode_linear_options(dtype: str, rows: int = 64, shares: int = 4) -> list[tuple[dict, tuple]]:
    """The split-K decode matmul's launch options in its launcher's order (``decode_linear.OPTIONS``), with a bias
    and K in ``shares``: Triton options and (kernel, signature, constexprs). Also tests/kernels/test_compile.py."""
    t = "fp32" if dtype == "float32" else "bf16"
    signature = {"x_ptr": f"*{t}", "stride_xm": "i32", "w_ptr": f"*{t}", "bias_ptr": f"*{t}", "out_ptr": f"*{t}",
                 "stride_om": "i32", "part_ptr": "*fp32", "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32",
                 "blocks_per_share": "i32"}
    return [({"num_stages": stages, "num_warps": 4},
             (decode_linear._decode_linear_kernel, signature,
              {"SHARES": shares, "HAS_BIAS": True, "BLOCK_M": rows, "BLOCK_N": decode_linear.BLOCK_N,
               "BLOCK_K": block_k, "DOT_IEEE": dtype == "float32", "PDL": False}))
            for block_k, stages in decode_linear.OPTIONS]


def kernels() -> list[tuple[str, dict, tuple]]:
    """(name, launch options, (kernel, signature, constexprs)) for every launch the kernels' launchers make:
    the 4-bit, dense gate/up and attention ones at each of their launch options, the log-prob ones at Triton's
    default of 3 stages."""
    found = []
    for dtype in ("bfloat16", "float32"):
        for name, options in matmul_4bit_options(dtype):
            found += [(f"{name} BLOCK_N={kernel[2]['BLOCK_N']}", triton_options, kernel)
                      for triton_options, kernel in options]
        found += [(f"swiglu_dense {dtype} BLOCK_K={kernel[2]['BLOCK_K']}", triton_options, kernel)
                  for triton_options, kernel in swiglu_dense_options(dtype)]
        found += [(f"decode_linear {dtype} BLOCK_K={kernel[2]['BLOCK_K']}", triton_options, kernel)
                  for triton_options, kernel in decode_linear_options(dtype)]
        for block, stages, warps in decode_attention.launch_options():
            found.append((f"decode_attention {dtype} BLOCK={block}", {"num_stages": stages, "num_warps": warps},
                          _decode_attention(dtype, block)))
    found.append(("logprob_entropy stats", {"num_stages": 3}, _logprob("_stats_kernel")))
    found.append(("logprob_entropy grad", {"num_stages": 3}, _logprob("_grad_kernel")))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/smem_fit.json"))
    args = parser.parse_args()
    rows = []
    print(f"Triton {triton.__version__}; shared memory a program asks for, in KiB (limit a block in brackets)")
    print(f"{'kernel':40s} {'stages':>6s}  " + "  ".join(f"{c} [{lim // 1024}]" for c, (_, lim) in CARDS.items()))
    for name, options, (fn, signature, constants) in kernels():
        src = source(fn, signature, constants)
        cells = []
        for card, (cc, limit) in CARDS.items():
            shared = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options).metadata.shared
            rows.append({"kernel": name, **options, "card": card, "shared_bytes": shared,
                         "limit_bytes": limit, "fits": shared <= limit})
            cells.append(f"{shared / 1024:.1f}{'' if shared <= limit else ' OVER'}")
        widths = [len(card) + 5 for card in CARDS]
        print(f"{name:40s} {options['num_stages']:6d}  " + "  ".join(f"{c:>{w}s}" for c, w in zip(cells, widths)),
              flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"triton": triton.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
