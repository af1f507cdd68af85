#!/usr/bin/env bash
# One device call around bench/decode_step.sh (issue 18), packed for the device's 8 files back: the GPU's name,
# decode_step.sh's log, JSON and gpu_tune output in call.tar.gz, a profile's trace beside it when it is at most
# two 15 MiB parts (the memory snapshot is dropped). Same arguments and environment as decode_step.sh:
#     OUT=... [FOUR_BIT=0] [TESTS=...] [WINNER=...] bash bench/device_call.sh [seconds] [JOBS]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/.pylib${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
bash bench/decode_step.sh "$@" > "$OUT/log.txt" 2>&1
cd "$OUT" || exit 1
tail -c 7000 log.txt
rm -f gpu_tune/memory_snapshot.pickle*
[ "$(ls gpu_tune/trace.json.gz* 2>/dev/null | wc -l)" -le 2 ] && mv gpu_tune/trace.json.gz* . 2>/dev/null
rm -f gpu_tune/trace.json.gz*
tar czf call.tar.gz --remove-files gpu.txt log.txt $(ls -d gpu_tune decode_* trace_gaps.json 2>/dev/null)
ls -la
