#!/usr/bin/env bash
# Issue 18's must-show in one device call, must-show jobs first: TRL's GRPO step and this tree's 8 GiB step
# (bench/gpu_tune.py's trl and steady:7.5 jobs, the 7.5 GiB cap, the preset's shape) and EXTRA gpu_tune jobs
# (e.g. profile:7.5, read by bench/trace_gaps.py here), all within DEADLINE seconds; then, when asked, the
# baseline tree's step on the same project (AB=1, the tree in .baseline, carried), the
# rollouts' tok/s at 16 and 64 sequences (DECODE=1, bench/decode_speed.py) and the decode attention's launch
# sweep (PROBE=1, bench/decode_attention_probe.py) and the dense MLP's against a tile-major copy (MLP=1,
# bench/dense_mlp_probe.py). Random weights at the R1-Distill-Qwen-1.5B shape. Carry
# .pylib (TRL=1 bench/device_pylib.sh) and .gpu (the reference bench). Everything packed in $OUT/call.tar.gz.
#     OUT=... [WINNER=...] [EXTRA=profile:7.5] [DEADLINE=330] [AB=1] [DECODE=1] [PROBE=1] [MLP=1] bash bench/must_show.sh [steady steps, 3]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/.pylib${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 bench/gpu_tune.py --jobs "trl,steady:7.5${EXTRA:+,$EXTRA}" --steady-steps "${1:-3}" --profile-steps 1 \
    --winner "${WINNER:-{\}}" --deadline-s "${DEADLINE:-330}" > "$OUT/step.log" 2>&1
tail -c 2500 "$OUT/step.log"
# the tree in .baseline (git archive REV | tar -x -C .baseline) on the same project: this call's A/B
[ "${AB:-0}" = 1 ] && timeout 150 python3 .baseline/bench/steady_step.py --project /tmp/gpu_stages_work \
    --out "$OUT/steady_old" --steps "${1:-3}" --cap-gib 7.5 --winner '{}' > "$OUT/old.log" 2>&1; tail -4 "$OUT/old.log" 2>/dev/null
trace=/tmp/gpu_stages_work/logs/profile/trace.json.gz
[ -f "$trace" ] && timeout 40 python3 bench/trace_gaps.py "$trace" --out "$OUT/trace_gaps.json" > "$OUT/gaps.log" 2>&1
[ -f "$OUT/gaps.log" ] && head -c 4000 "$OUT/gaps.log"
[ "${DECODE:-0}" = 1 ] && timeout 120 python3 bench/decode_speed.py --label must > "$OUT/decode.log" 2>&1 && tail -c 1500 "$OUT/decode.log"
[ "${PROBE:-0}" = 1 ] && timeout 60 python3 bench/decode_attention_probe.py > "$OUT/probe.log" 2>&1; tail -c 2500 "$OUT/probe.log" 2>/dev/null
[ "${MLP:-0}" = 1 ] && timeout 90 python3 bench/dense_mlp_probe.py --label tiled --ways "cublas,K64 stages 4,tiled" \
    > "$OUT/mlp.log" 2>&1; tail -c 2500 "$OUT/mlp.log" 2>/dev/null
cd "$OUT" && rm -f gpu_tune/memory_snapshot.pickle* gpu_tune/trace.json.gz* && \
    tar czf call.tar.gz --remove-files gpu.txt step.log $(ls -d gpu_tune steady_old decode_* dense_mlp_* *.log *.json 2>/dev/null)
