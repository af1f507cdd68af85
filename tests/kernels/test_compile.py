"""The 4-bit kernels compile for real GPUs on this CPU (Triton's own ptxas, no GPU needed), and each launch
``matmul_4bit.launch_for`` makes has an option that fits the card's shared memory.

Why here: the kernels' code-book look-up is inline PTX (``matmul_4bit.code_lookup``) that only a GPU runs;
Triton's interpreter, which the other kernel tests use on a CPU, takes ``tl.gather`` instead. A PTX error
would otherwise first show on a GPU, and so would a change that sends the looked-up tile through shared memory
again: on sm_90 each bf16 ``wgmma`` must take the weights from registers (what the look-up is built for).
Compiled for an H100 (sm_90: wgmma) and for the 8 GB preset's card, an RTX 3060 Ti (sm_86: mma, 99 KiB of
shared memory a block), with the launcher's alignment (bench/smem_fit.py, which prints every option for four
cards).
"""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed")
pytest.importorskip("triton.backends.nvidia", reason="this triton has no CUDA backend to compile for")


@pytest.mark.parametrize("arch,dtype", [(90, "bfloat16"), (86, "bfloat16"), (86, "float32")])
def test_each_4bit_launch_compiles_and_an_option_fits(arch, dtype):
    from triton.backends.compiler import GPUTarget

    from bench.smem_fit import CARDS, matmul_4bit_options, source

    limit = next(lim for cc, lim in CARDS.values() if cc == arch)
    for name, options in matmul_4bit_options(dtype):
        fitting = None
        for triton_options, kernel in options:  # the launcher's order
            compiled = triton.compile(source(*kernel), target=GPUTarget("cuda", arch, 32), options=triton_options)
            ptx = compiled.asm["ptx"]
            # the look-up's PTX in bf16 (its code book written into a select tree); fp32 gathers
            assert ("selp.b32 s0_0" in ptx) == (dtype == "bfloat16"), name
            if arch == 90 and dtype == "bfloat16" and "wgmma" in ptx:  # one warp (16 rows) takes mma.sync
                # the looked-up weights go to wgmma as registers, not stored and read back with ldmatrix
                # (x, the other operand, is read from shared memory by wgmma itself)
                assert "ldmatrix" not in ptx, name
            if compiled.metadata.shared <= limit:
                fitting = triton_options
                break
        assert fitting is not None, f"no launch option of {name} fits sm_{arch}'s {limit} bytes"


@pytest.mark.parametrize("arch,dtype", [(90, "bfloat16"), (86, "bfloat16"), (86, "float32")])
def test_the_dense_gate_up_kernel_has_an_option_that_fits(arch, dtype):
    """grpo/kernels/swiglu_dense.py, at the decoder's 64 rows: its first option (four stages) asks for 96 KiB on
    sm_90 (72 on sm_86, 144 in fp32), so an RTX 30 card's 99 KiB must take it or a fallback."""
    from triton.backends.compiler import GPUTarget

    from bench.smem_fit import CARDS, source, swiglu_dense_options

    limit = next(lim for cc, lim in CARDS.values() if cc == arch)
    shared = [triton.compile(source(*kernel), target=GPUTarget("cuda", arch, 32), options=options).metadata.shared
              for options, kernel in swiglu_dense_options(dtype)]
    assert any(size <= limit for size in shared), f"no option of swiglu_dense fits sm_{arch}: {shared} > {limit}"
