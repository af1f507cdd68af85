#!/usr/bin/env bash
# The 8 GiB step of this tree against the tree in .baseline, in one device call (issue 18): bench/gpu_tune.py's
# set-up and steady job on the shipped preset here, then the baseline tree's bench/steady_step.py on the same
# project, both under the 7.5 GiB cap, STEPS measured steps after a warm-up. Random weights at the
# R1-Distill-Qwen-1.5B shape. Packed for the device's 8 files back into $OUT/call.tar.gz.
#     OUT=... bash bench/steady_ab.sh [STEPS, default 2]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/.pylib${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
steps=${1:-2}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 bench/gpu_tune.py --jobs steady:7.5 --steady-steps "$steps" --winner '{}' --deadline-s 200 > "$OUT/new.log" 2>&1
python3 .baseline/bench/steady_step.py --project /tmp/gpu_stages_work --out "$OUT/steady_old" --steps "$steps" \
    --cap-gib 7.5 --winner '{}' > "$OUT/old.log" 2>&1
tail -3 "$OUT/new.log"; tail -3 "$OUT/old.log"
cd "$OUT" && tar czf call.tar.gz --remove-files gpu.txt new.log old.log $(ls -d gpu_tune steady_old 2>/dev/null)
