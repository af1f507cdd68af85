#!/usr/bin/env bash
# Issue 18's must-show in one device call, must-show jobs first: TRL's GRPO step and this tree's 8 GiB step
# (bench/gpu_tune.py's trl and steady:7.5 jobs, or the JOBS given, none for none; the 7.5 GiB cap, the preset's
# shape) and EXTRA jobs (e.g. profile:7.5, read by bench/trace_gaps.py here), all within DEADLINE seconds
# (default 450: on a fresh machine the setup took 51 s, TRL 130-166 s and our step's cold warm-up and steps
# 143-150 s); then, when asked and while the call's BUDGET seconds last (default 570, so the packing below
# always runs), in this order:
#   TESTS=... pytest on this GPU (e.g. the kernels' CUDA cases);
#   DECODE=1  the rollouts' tok/s at 16 and 64 sequences (bench/decode_speed.py); with AB the baseline's too;
#   AB=1      the baseline tree's step on the same project (the tree in .baseline, carried); AB=decode: only
#             its rollouts (with DECODE=1);
#   MLP=1     the dense gate/up and down kernels against tile-major copies (bench/dense_mlp_probe.py);
#   PROBE=1   the decode attention's launch sweep (bench/decode_attention_probe.py);
#   LINEAR=1  the split-K decode matmul against cuBLAS (bench/decode_linear_probe.py).
# Random weights at the R1-Distill-Qwen-1.5B shape. Carry .pylib (TRL=1 bench/device_pylib.sh), .gpu (the
# reference bench) and, for AB, .baseline. Everything packed in $OUT/call.tar.gz.
#     OUT=... [WINNER=...] [JOBS=steady:7.5] [EXTRA=profile:7.5] [DEADLINE=450] [AB=1] [TESTS=...] [DECODE=1]
#         [MLP=1] [PROBE=1] [LINEAR=1] bash bench/must_show.sh [steady steps, 3]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/.pylib${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
steps=${1:-3}
left() { echo $(( ${BUDGET:-570} - SECONDS )); }
within() {  # within LIMIT LOG CMD...: CMD cut at LIMIT seconds or the call's budget, its output in $OUT/LOG
    local limit=$1 log=$2; shift 2
    [ "$(left)" -lt 20 ] && { echo "skipped (budget): $*" | tee -a "$OUT/skipped.log"; return; }
    [ "$limit" -gt "$(left)" ] && limit=$(left)
    timeout "$limit" "$@" > "$OUT/$log" 2>&1; echo "rc $? in ${SECONDS}s: $*"; tail -c 2000 "$OUT/$log"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"  # also marks the call's start
jobs=${JOBS:-trl,steady:7.5}${EXTRA:+,$EXTRA}
[ "${JOBS:-}" != none ] && within 600 step.log python3 bench/gpu_tune.py --jobs "$jobs" \
    --steady-steps "$steps" --profile-steps 1 --winner "${WINNER:-{\}}" --deadline-s "${DEADLINE:-450}"
trace=/tmp/gpu_stages_work/logs/profile/trace.json.gz
[ -f "$trace" ] && within 40 gaps.log python3 bench/trace_gaps.py "$trace" --top 60 --out "$OUT/trace_gaps.json"
[ -n "${TESTS:-}" ] && within 120 tests.log python3 -m pytest -q -x -p no:cacheprovider $TESTS
[ "${DECODE:-0}" = 1 ] && within 120 decode.log python3 bench/decode_speed.py --label must
[ "${DECODE:-0}" = 1 ] && [ "${AB:-0}" != 0 ] && GRPO_TREE=$PWD/.baseline within 120 decode_old.log \
    python3 bench/decode_speed.py --label old
[ "${AB:-0}" = 1 ] && within 150 old.log python3 .baseline/bench/steady_step.py --project /tmp/gpu_stages_work \
    --out "$OUT/steady_old" --steps "$steps" --cap-gib 7.5 --winner '{}'
[ "${MLP:-0}" = 1 ] && within 120 mlp.log python3 bench/dense_mlp_probe.py --label tiled \
    --ways "cublas,K64 stages 4,tiled"
[ "${PROBE:-0}" = 1 ] && within 60 probe.log python3 bench/decode_attention_probe.py
[ "${LINEAR:-0}" = 1 ] && within 90 linear.log python3 bench/decode_linear_probe.py --label must
cd "$OUT" && rm -f gpu_tune/memory_snapshot.pickle* gpu_tune/trace.json.gz* && \
    tar czf call.tar.gz --remove-files gpu.txt \
        $(find gpu_tune steady_old decode_* dense_mlp_* *.log *.json -maxdepth 0 -newer gpu.txt 2>/dev/null | sort -u)
# (only what this call wrote: a reused machine's $OUT held an earlier session's decode_* files)
