#!/usr/bin/env bash
# Why the first training steps of a run were 2-3x slower than the later ones (issue 18; bench/RESULTS.md,
# "The slow first steps"): the 8 GB preset's step under an 8 GiB cap, STEPS steps (default 5), each step's
# generate and train times and allocator counters (cudaMalloc/cudaFree calls, retries after a failed
# cudaMalloc), once as the project runs and once with training attention on cuDNN (SDPA_CUDNN=1). Each run
# starts from cleared compile caches (Triton's, inductor's, the CUDA driver's JIT cache), as on a fresh
# machine, so neither inherits the other's compiled kernels. Random weights at the R1-Distill-Qwen-1.5B
# shape. Allocator settings pass through: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True bash ...
#     OUT=... bash bench/first_steps.sh      (writes $OUT/gpu_step_triton_preset{,_cudnn}[_expandable].json)
set -euo pipefail
cd "$(dirname "$0")/.."
export CAP_GIB=8 BACKENDS=triton STEPS=${STEPS:-5}
cold() { rm -rf ~/.nv/ComputeCache ~/.triton/cache /tmp/torchinductor_* ~/.cache/torch/inductor; }
cold; python3 bench/gpu_bench.py step 2>&1 | grep -v "it/s]"
cold; SDPA_CUDNN=1 python3 bench/gpu_bench.py step 2>&1 | grep -v "it/s]"
