#!/usr/bin/env bash
# The decoder's MLP read in 4 bits (train.generation_mlp_4bit) in the 8 GiB step, in one device call (issue
# 18), shortest first so a cut call keeps the most: (1) the 4-bit kernels' and the decoder's GPU tests (its
# CUDA-graph capture failed on the H100 on 2026-12-05: a host sync in swiglu_4bit), then the kernels alone
# against the dense MLP (bench/matmul_4bit_probe.py: each kernel, six launches, what Triton built); (2) the
# shipped preset's train stage against the same with generation_mlp_4bit, each over 3 steps after a warm-up
# under a 7.5 GiB cap (bench/gpu_tune.py's steady job); (3) decode speed, 4-bit MLP then dense copy, with
# what time is left.
# Random weights at the R1-Distill-Qwen-1.5B shape: times and memory are real, tokens are not.
#     OUT=... bash bench/step_4bit.sh [seconds for the whole call, default 570]
set -uo pipefail
cd "$(dirname "$0")/.."
end=$((SECONDS + ${1:-570}))
out="${OUT:-bench/results}"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_matmul_4bit.py tests/rollout/test_static_decode.py \
    2>&1 | grep -v "it/s]" | tail -40 | tee "$out/step_4bit_tests.txt"
timeout 150 python3 bench/matmul_4bit_probe.py 2>&1 | grep -v Warning | tail -40
python3 bench/gpu_tune.py --jobs steady:7.5 --steady-steps 3 --winner '{"train.generation_mlp_4bit": true}' \
    --deadline-s $((end - SECONDS - 150))
for label in mlp4bit dense; do
    left=$((end - SECONDS - 5))
    [ "$left" -gt 30 ] || break
    flag=$([ "$label" = mlp4bit ] && echo --read-4bit-mlp)
    timeout "$left" python3 bench/decode_speed.py --label "$label" $flag 2>&1 | grep -v "it/s]" | tail -30
done
