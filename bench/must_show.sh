#!/usr/bin/env bash
# Issue 18's must-show in one device call, must-show jobs first: TRL's GRPO step and this tree's 8 GiB step
# (bench/gpu_tune.py's trl and steady:7.5 jobs, the 7.5 GiB cap, the preset's shape), then the rollouts' tok/s at
# 16 and 64 sequences (bench/decode_speed.py), then, with the time left, the decode attention's launch sweep
# (bench/decode_attention_probe.py). Random weights at the R1-Distill-Qwen-1.5B shape. Carry .pylib (TRL=1
# bench/device_pylib.sh) and .gpu (the reference bench). Everything packed in $OUT/call.tar.gz.
#     OUT=... [WINNER=...] bash bench/must_show.sh [steady steps, default 3]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/.pylib${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 bench/gpu_tune.py --jobs trl,steady:7.5 --steady-steps "${1:-3}" --winner "${WINNER:-{\}}" \
    --deadline-s 330 > "$OUT/step.log" 2>&1
tail -c 2500 "$OUT/step.log"
timeout 120 python3 bench/decode_speed.py --label must > "$OUT/decode.log" 2>&1
tail -c 1500 "$OUT/decode.log"
timeout 100 python3 bench/decode_attention_probe.py > "$OUT/probe.log" 2>&1
tail -c 2500 "$OUT/probe.log"
cd "$OUT" && rm -f gpu_tune/memory_snapshot.pickle* gpu_tune/trace.json.gz* && \
    tar czf call.tar.gz --remove-files gpu.txt step.log decode.log probe.log $(ls -d gpu_tune decode_* 2>/dev/null)
