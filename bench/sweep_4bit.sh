#!/usr/bin/env bash
# Issue 18, one device call for a new 4-bit kernel: its GPU tests and the decoder's (the CUDA-graph decoder
# against generate), the launch sweep (bench/matmul_4bit_probe.py: tile widths, x's rows split over programs,
# warps, K splits), the same probe at the launcher's choice on the tree in .baseline (the code before the
# change) where there is one, then decode speed with the sweep's fastest launch for each part and rows against
# the dense copy's. Random weights at the R1-Distill-Qwen-1.5B shape: times and memory are real, tokens are not.
# (Tenth session: the sweep and decode parts, after Nsight Compute found one active warp a scheduler.)
#     OUT=... bash bench/sweep_4bit.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results}"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_matmul_4bit.py tests/rollout/test_static_decode.py \
    2>&1 | grep -v "it/s]" | tail -30 | tee "$out/sweep_4bit_tests.txt"
timeout 200 python3 bench/matmul_4bit_probe.py --label sweep 2>&1 | grep -v Warning | tail -40
[ -d .baseline ] && GRPO_TREE=$PWD/.baseline timeout 60 python3 bench/matmul_4bit_probe.py --label old --no-sweep \
    2>&1 | grep -v Warning | tail -8
timeout 110 python3 bench/decode_speed.py --label mlp4bit_best --read-4bit-mlp \
    --launches "$out/matmul_4bit_probe_sweep.json" 2>&1 | grep -v "it/s]" | tail -8
timeout 100 python3 bench/decode_speed.py --label dense 2>&1 | grep -v "it/s]" | tail -8
exit 0
