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


@pytest.mark.parametrize("arch,dtype", [(90, "bfloat16"), (86, "bfloat16"), (86, "float32")])
def test_the_decode_matmul_has_an_option_that_fits_and_counts_its_shares_release_acquire(arch, dtype):
    """grpo/kernels/decode_linear.py, K in four shares at 64 rows: an option fits the card, and the count of a
    tile's shares done is one acquire-release atomic at GPU scope (a relaxed one would let the last share read
    partials another multiprocessor has not yet made visible)."""
    from triton.backends.compiler import GPUTarget

    from bench.smem_fit import CARDS, decode_linear_options, source

    limit = next(lim for cc, lim in CARDS.values() if cc == arch)
    compiled = [triton.compile(source(*kernel), target=GPUTarget("cuda", arch, 32), options=options)
                for options, kernel in decode_linear_options(dtype)]
    shared = [c.metadata.shared for c in compiled]
    assert any(size <= limit for size in shared), f"no option of decode_linear fits sm_{arch}: {shared} > {limit}"
    ptx = compiled[0].asm["ptx"]
    assert "atom.global.gpu.acq_rel.add" in ptx or "atom.acq_rel.gpu.global.add" in ptx, \
        [line for line in ptx.splitlines() if "atom" in line]
    assert "ld.global.cg" in ptx  # the partials read past L1


def test_the_decode_kernels_wait_for_the_kernel_before_only_when_launched_dependent():
    """Programmatic dependent launch (``decode_attention.dependent_launch``): compiled for an H100 with ``PDL`` and
    Triton's ``launch_pdl``, the attention (whole caches and shares), the shares' combine, the dense gate/up
    kernel, the split-K decode matmul and the keyed sampler wait on the kernel before (PTX ``griddepcontrol.wait``)
    before their first load; compiled as an RTX card gets them (no ``PDL``), they hold no such instruction, which
    sm_86 does not have."""
    from triton.backends.compiler import GPUTarget

    from bench.smem_fit import _decode_attention, decode_linear_options, source, swiglu_dense_options
    from grpo.kernels import decode_attention, keyed_sample

    attention = _decode_attention("bfloat16", decode_attention.BLOCK_L)
    shares = (attention[0], attention[1], {**attention[2], "SPLITS": 4, "CHUNK": 256})
    combine = (decode_attention._combine_splits_kernel,
               {"part_ptr": "*fp32", "stat_ptr": "*fp32", "out_ptr": "*bf16", "out_stride": "i32"},
               {"HQ": 12, "D": 128, "SPLITS": 4, "SP": 4})
    gate_up_options, gate_up = swiglu_dense_options("bfloat16")[0]
    linear_options, linear = decode_linear_options("bfloat16")[0]
    sampler = (keyed_sample._keyed_best_kernel,
               {"logits_ptr": "*bf16", "stride_row": "i32", "streams_ptr": "*i32", "offsets_ptr": "*i32",
                "best_ptr": "*fp32", "at_ptr": "*i32", "V": "i32", "chunk": "i32", "temperature": "fp32"},
               {"BLOCK": keyed_sample.BLOCK})
    for fn, signature, constants in (attention, shares, combine, gate_up, linear, sampler):
        for arch, pdl in ((90, True), (86, False)):
            options = {"num_warps": 4, **({"launch_pdl": True} if pdl else {})}
            ptx = triton.compile(source(fn, signature, {**constants, "PDL": pdl}), target=GPUTarget("cuda", arch, 32),
                                 options=options).asm["ptx"]
            assert ("griddepcontrol.wait" in ptx) == pdl, (fn.__name__, arch)
            if pdl:  # nothing is read from global memory before the wait
                assert "ld.global" not in ptx.split("griddepcontrol.wait")[0], fn.__name__


def test_dependent_launch_only_on_hopper_or_newer(monkeypatch):
    """Only a CUDA device of compute capability 9.0 or more launches dependent (``griddepcontrol`` is sm_90 PTX).
    The capability is mocked: this machine has no GPU."""
    import torch

    from grpo.kernels import decode_attention

    cuda = torch.device("cuda")
    for capability, expected in (((9, 0), {"launch_pdl": True}), ((10, 0), {"launch_pdl": True}), ((8, 6), {})):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert decode_attention.dependent_launch(cuda) == expected, capability
    assert decode_attention.dependent_launch(torch.device("cpu")) == {}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert decode_attention.dependent_launch(cuda) == {}  # the interpreter runs no PTX
