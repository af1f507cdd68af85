"""Triton kernel tests on a machine without a GPU: Triton's interpreter (TRITON_INTERPRET=1) runs the same
kernel code in numpy, but only if triton is imported with that variable set (triton.language's own helpers,
tl.max and tl.sum, are jit functions, built as interpreted ones only then), so the test module is rerun in
a subprocess started with it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch


def kernel_device() -> str:
    """Where a kernel test runs: 'cuda', or 'cpu' inside the interpreter subprocess; skips otherwise."""
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU: runs in test_kernel_under_interpreter's subprocess")
    return "cpu"


def run_under_interpreter(test_file: str, passed: int) -> None:
    """Rerun ``test_file`` with TRITON_INTERPRET=1 and check that exactly ``passed`` tests passed, so a
    silent skip fails. Skips where the kernels run directly (a GPU, or already interpreting)."""
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("runs the kernels directly here")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(rf"(?<!\d){passed} passed", done.stdout), done.stdout[-2000:]
