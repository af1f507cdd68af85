"""The facts ``auto`` defaults choose by (grpo/hardware.py) and the choices made from them."""
import json
import os
import subprocess
import sys

import pytest
import torch

from grpo import hardware
from grpo.model.loading import resolve_compute_dtype
from grpo.rollout import engines


def _in_subprocess(code: str, **env: str | None) -> dict:
    """Run ``code`` (which prints one JSON line) in a fresh interpreter: torch reads
    ATEN_CPU_CAPABILITY once, at import. ``env`` adds variables, or removes those given as None."""
    env = {name: value for name, value in {**os.environ, **env}.items() if value is not None}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_imitated_avx2_host_has_no_native_bf16_and_auto_is_fp32():
    # How a developer imitates an AVX2-only host on an AVX512 one: torch's kernels must really drop to
    # AVX2, and every auto dtype must follow.
    facts = _in_subprocess(
        "import json, torch; from grpo import hardware; from grpo.rollout.engines import resolve_dtype_name; "
        "print(json.dumps({'capability': torch.backends.cpu.get_cpu_capability(), "
        "'bf16': hardware.cpu_native_bf16(), 'dtype': resolve_dtype_name('auto'), "
        "'compute': str(hardware.cpu_compute_dtype())}))",
        ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    assert facts == {"capability": "AVX2", "bf16": False, "dtype": "float32", "compute": "torch.float32"}


def test_an_imitated_avx2_run_does_not_hand_its_compiled_code_to_a_native_run(tmp_path):
    # The failure this guards against (grpo.hardware.separate_compile_cache): with one inductor cache, the
    # native run below loaded the AVX2 run's generated C++ and built it with its own wider vectors: 8 wrong
    # noise values and heap corruption. On an AVX2-only host both runs are AVX2 and the check is weaker.
    code = ("import json, os, torch; from grpo.rollout.sampling import gumbel_noise, row_keys, vocab_offsets; "
            "keys = row_keys(7, torch.tensor([0, 3, 2**20]), torch.tensor([1, 0, 5])); "
            "args = (keys, torch.tensor([0, 9, 700]), vocab_offsets(3000)); "
            "wrong = (torch.compile(gumbel_noise, dynamic=False)(*args) - gumbel_noise(*args)).abs() > 1e-5; "
            "print(json.dumps({'capability': torch.backends.cpu.get_cpu_capability(), 'wrong': int(wrong.sum()), "
            "'cache': os.environ['TORCHINDUCTOR_CACHE_DIR']}))")
    imitated = _in_subprocess(code, ATEN_CPU_CAPABILITY="avx2", TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    native = _in_subprocess(code, ATEN_CPU_CAPABILITY=None, TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    assert native["wrong"] == 0, native
    assert imitated == {"capability": "AVX2", "wrong": 0, "cache": str(tmp_path / "isa-avx2")}
    assert native["cache"] == str(tmp_path)


@pytest.fixture
def avx512_bf16_host(monkeypatch):
    # No AVX512-BF16 CPU is available to the test suite here, so the two hardware facts are stubbed;
    # the rule that combines them with the environment is what is tested.
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16"}))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)


def test_native_bf16_needs_the_flag_torch_kernels_and_onednn(avx512_bf16_host, monkeypatch):
    assert hardware.cpu_native_bf16()
    assert resolve_compute_dtype("auto", torch.device("cpu")) == torch.bfloat16
    assert engines.resolve_dtype_name("auto") == ("auto" if torch.cuda.is_available() else "bfloat16")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not hardware.cpu_native_bf16()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_bf16")
    assert hardware.cpu_native_bf16()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not hardware.cpu_native_bf16()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert not hardware.cpu_native_bf16()
    assert resolve_compute_dtype("auto", torch.device("cpu")) == torch.float32


def test_explicit_dtypes_are_kept():
    assert engines.resolve_dtype_name("bfloat16") == "bfloat16"
    assert resolve_compute_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16


def test_this_host_is_described_with_its_real_flags():
    line = hardware.describe_cpu()
    has = any(f in hardware.cpu_flags() for f in hardware.BF16_FLAGS)
    assert ("no native bf16" in line) == (not hardware.cpu_native_bf16())
    assert has or "no native bf16" in line
    assert torch.backends.cpu.get_cpu_capability() in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rule")
def test_engine_auto_serves_adapters_natively_on_cpu(monkeypatch):
    # vllm_importable stands in for the 15 s vLLM import (tests/rollout/test_vllm_engine.py imports it for real)
    monkeypatch.setattr(engines, "vllm_importable", lambda: True)
    assert engines.resolve_engine_kind("auto") == "vllm"
    assert engines.resolve_engine_kind("auto", serves_adapters=True) == "native"
    assert engines.resolve_engine_kind("vllm", serves_adapters=True) == "vllm"
    monkeypatch.setattr(engines, "vllm_importable", lambda: False)
    assert engines.resolve_engine_kind("auto") == "native"
    with pytest.raises(ValueError, match="auto, vllm or native"):
        engines.resolve_engine_kind("sglang")
