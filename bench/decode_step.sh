#!/usr/bin/env bash
# Issue 18, one device call for a decoder change: (1) the decoder's kernel tests and its CUDA-graph tests
# against generate; (2) decode speed, this tree (with its kernel list a step) against the tree in .baseline
# (the code before the change) where there is one, dense copy then 4-bit MLP; (3) with the time left,
# bench/gpu_tune.py's JOBS (default: the shipped preset's train stage against the same with
# generation_mlp_4bit, each over 3 steps after a warm-up under a 7.5 GiB cap); (4) bench/trace_gaps.py on a profile
# job's trace. Random weights at the
# R1-Distill-Qwen-1.5B shape: times and memory are real, tokens are not.
#     OUT=... [FOUR_BIT=0] [TESTS=...] bash bench/decode_step.sh [seconds for the whole call, default 570] [JOBS, default steady:7.5]
# FOUR_BIT=0 skips the 4-bit MLP's decode run; TESTS="..." replaces the test files; WINNER='{}' runs the steady
# job on the shipped settings alone.
set -uo pipefail
cd "$(dirname "$0")/.."
end=$((SECONDS + ${1:-570}))
out="${OUT:-bench/results}"
tests=${TESTS:-tests/kernels/test_swiglu_dense.py tests/kernels/test_matmul_4bit.py tests/rollout/test_static_decode.py \
    tests/rollout/test_continuous_batching.py tests/rollout/test_sampling.py}
timeout 180 python3 -m pytest -q -p no:cacheprovider $tests 2>&1 | grep -v "it/s]" | tail -30 | tee "$out/decode_step_tests.txt"
for label in new old; do
    tree=$([ $label = old ] && echo "$PWD/.baseline" || echo "$PWD")
    [ -d "$tree" ] || continue
    GRPO_TREE=$tree timeout 150 python3 bench/decode_speed.py --label "dense_$label" $([ $label = new ] && echo --profile) \
        2>&1 | grep -v "it/s]" | tail -7
done
[ "${FOUR_BIT:-1}" = 1 ] && timeout 110 python3 bench/decode_speed.py --label mlp4bit --read-4bit-mlp 2>&1 | grep -v "it/s]" | tail -7
reserve=$([[ "${2:-}" == *profile* ]] && echo 70 || echo 10)  # trace_gaps reads the trace after the jobs
left=$((end - SECONDS - reserve))
[ "$left" -gt 120 ] && python3 bench/gpu_tune.py --jobs "${2:-steady:7.5}" --steady-steps 3 --profile-steps 1 \
    --winner "${WINNER:-{\"train.generation_mlp_4bit\": true\}}" --deadline-s "$left"
trace=/tmp/gpu_stages_work/logs/profile/trace.json.gz
[ -f "$trace" ] && timeout 60 python3 bench/trace_gaps.py "$trace" --out "$out/trace_gaps.json" 2>&1 | tail -80
exit 0
