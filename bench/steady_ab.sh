#!/usr/bin/env bash
# The 8 GiB step of this tree against the tree in .baseline, in one device call (issue 18): bench/gpu_tune.py's
# set-up and steady job on the shipped preset here, then the baseline tree's bench/steady_step.py on the same
# project, both under the 7.5 GiB cap, STEPS measured steps after a warm-up (WINNER='{"train.x": ...}': this tree
# with those settings too, in the same job); then bench/gpu_tune.py's EXTRA jobs
# on this tree (e.g. trl,profile:7.5: TRL's step in the same call, a profile read by bench/trace_gaps.py).
# Random weights at the R1-Distill-Qwen-1.5B shape. Packed for the device's 8 files back into $OUT/call.tar.gz.
#     OUT=... [WINNER=...] bash bench/steady_ab.sh [STEPS, default 2] [EXTRA jobs, default none] [seconds for EXTRA, default 300]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/.pylib${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
steps=${1:-2}
extra=${2:-}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 bench/gpu_tune.py --jobs steady:7.5 --steady-steps "$steps" --winner "${WINNER:-{\}}" --deadline-s 300 > "$OUT/new.log" 2>&1
timeout 200 python3 .baseline/bench/steady_step.py --project /tmp/gpu_stages_work --out "$OUT/steady_old" --steps "$steps" \
    --cap-gib 7.5 --winner '{}' > "$OUT/old.log" 2>&1
tail -3 "$OUT/new.log"; tail -3 "$OUT/old.log"
if [ -n "$extra" ]; then
    mv "$OUT/gpu_tune" "$OUT/gpu_tune_ab"
    python3 bench/gpu_tune.py --jobs "$extra" --profile-steps 1 --winner '{}' --deadline-s "${3:-300}" > "$OUT/extra.log" 2>&1
    tail -c 3000 "$OUT/extra.log"
    trace=/tmp/gpu_stages_work/logs/profile/trace.json.gz
    [ -f "$trace" ] && timeout 60 python3 bench/trace_gaps.py "$trace" --out "$OUT/trace_gaps.json" 2>&1 | tail -60
    rm -f "$OUT"/gpu_tune/memory_snapshot.pickle* "$OUT"/gpu_tune/trace.json.gz*
fi
cd "$OUT" && tar czf call.tar.gz --remove-files gpu.txt new.log old.log \
    $(ls -d gpu_tune gpu_tune_ab steady_old extra.log trace_gaps.json 2>/dev/null)
