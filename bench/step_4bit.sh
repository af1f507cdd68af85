#!/usr/bin/env bash
# The decoder's MLP read in 4 bits (train.generation_mlp_4bit), in one device call (issue 18), shortest first so
# a cut call keeps the most: (1) the 4-bit kernels' and the decoder's GPU tests; (2) the kernels alone against
# the dense MLP (bench/matmul_4bit_probe.py at the launcher's choice; its sweep is bench/sweep_4bit.sh), then
# the same probe on the tree in .baseline (the code before a change), where there is one, and where Nsight
# Compute is installed, each tree's kernels' occupancy and issue rate (bench/results/gpu_4bit_h100/tenth/
# call3_ncu_*.txt were taken so, by this section's first copy, bench/lookup_4bit.sh); (3) decode speed,
# 4-bit MLP then the dense copy; (4) with what time is left, the shipped preset's train stage against the same with
# generation_mlp_4bit, each over 3 steps after a warm-up under a 7.5 GiB cap (bench/gpu_tune.py's steady job).
# Random weights at the R1-Distill-Qwen-1.5B shape: times and memory are real, tokens are not.
#     OUT=... bash bench/step_4bit.sh [seconds for the whole call, default 570]
set -uo pipefail
cd "$(dirname "$0")/.."
end=$((SECONDS + ${1:-570}))
out="${OUT:-bench/results}"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_matmul_4bit.py tests/rollout/test_static_decode.py \
    2>&1 | grep -v "it/s]" | tail -40 | tee "$out/step_4bit_tests.txt"
timeout 60 python3 bench/matmul_4bit_probe.py --label new --no-sweep 2>&1 | grep -v Warning | tail -8
[ -d .baseline ] && GRPO_TREE=$PWD/.baseline timeout 60 python3 bench/matmul_4bit_probe.py --label old --no-sweep \
    2>&1 | grep -v Warning | tail -8
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for tree in this baseline; do  # where Nsight Compute is installed: both kernels' warp stalls, one call at 64 rows
    root=$([ $tree = baseline ] && echo "$PWD/.baseline" || echo "$PWD")
    [ -n "$ncu" ] && [ -d "$root" ] || continue
    GRPO_TREE=$root timeout 90 "$ncu" --kernel-name regex:_matmul_4bit_kernel --launch-skip 0 --launch-count 2 \
        --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis \
        python3 bench/matmul_4bit_probe.py --label "ncu_$tree" --no-sweep --rows 64 > "$out/ncu_$tree.txt" 2>&1
    grep -E "_matmul_4bit_kernel \(|Active Warps Per Scheduler|Issued Warp|Occupancy  |Memory Throughput" "$out/ncu_$tree.txt"
done
for label in mlp4bit dense; do
    left=$((end - SECONDS - 5))
    [ "$left" -gt 30 ] || break
    flag=$([ "$label" = mlp4bit ] && echo --read-4bit-mlp)
    timeout "$left" python3 bench/decode_speed.py --label "$label" $flag 2>&1 | grep -v "it/s]" | tail -12
done
left=$((end - SECONDS - 10))
[ "$left" -gt 120 ] && python3 bench/gpu_tune.py --jobs steady:7.5 --steady-steps 3 \
    --winner '{"train.generation_mlp_4bit": true}' --deadline-s "$left"
