#!/usr/bin/env bash
# Issue 18, tenth session, one device call: the 4-bit kernels' launch sweep (bench/matmul_4bit_probe.py: tile
# widths, x's rows split over programs, warps, K splits) after Nsight Compute found the fused gate/up kernel
# at one active warp a scheduler; then decode speed with the sweep's fastest launch for each part and rows
# against the dense copy's, in the same call. Random weights at the R1-Distill-Qwen-1.5B shape: times and memory
# are real, tokens are not. (The session's first call ran this file at its first version: the kernel tests,
# the probe's first sweep and bench/train_profile.py --variants layers.)
#     OUT=... bash bench/sweep_4bit.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results}"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_matmul_4bit.py 2>&1 | tail -2
timeout 200 python3 bench/matmul_4bit_probe.py --label sweep 2>&1 | grep -v Warning | tail -40
timeout 130 python3 bench/decode_speed.py --label mlp4bit_best --read-4bit-mlp \
    --launches "$out/matmul_4bit_probe_sweep.json" 2>&1 | grep -v "it/s]" | tail -8
timeout 110 python3 bench/decode_speed.py --label dense 2>&1 | grep -v "it/s]" | tail -8
exit 0
