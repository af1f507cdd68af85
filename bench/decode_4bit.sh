#!/usr/bin/env bash
# The static decoder's MLP read in 4 bits (train.generation_mlp_4bit, grpo/kernels/matmul_4bit.py) against
# its dense copy, in one device call (issue 18): first the kernels' and the decoder's tests on the GPU
# (compiled Triton, bf16), then bench/decode_speed.py with the dense copy and with the 4-bit MLP (batch 16
# and 64, 256 and 768 new tokens, graph capture timed apart; peaks), each with a kernel table (--profile),
# the 4-bit kernels also with three other tiles (their 64 x 128 is a guess).
# Random weights at the R1-Distill-Qwen-1.5B shape: times and memory are real, tokens are not.
#     OUT=... bash bench/decode_4bit.sh   (writes $OUT/decode_speed_{dense,mlp4bit}.json,
#     matmul_4bit_probe.json and pytest's tail)
set -euo pipefail
cd "$(dirname "$0")/.."
# a failing test must not cost the call its timings (it did once: pipefail stopped the script here)
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_matmul_4bit.py tests/rollout/test_static_decode.py \
    2>&1 | grep -v "it/s]" | tail -60 | tee "${OUT:-bench/results}/decode_4bit_tests.txt" || true
# the kernels alone at the 1.5B MLP's shapes: eager, captured, timed against the dense MLP (their capture
# inside the train stage failed on the H100, 2026-12-05)
python3 bench/matmul_4bit_probe.py 2>&1 | grep -v Warning | tail -60 || true
python3 bench/decode_speed.py --label dense --profile 2>&1 | grep -v "it/s]"
python3 bench/decode_speed.py --label mlp4bit --read-4bit-mlp --profile --tiles 32x128,64x256,128x128 2>&1 | grep -v "it/s]"
