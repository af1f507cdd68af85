#!/usr/bin/env bash
# Build .pylib: the Python packages the stages need that the device image lacks (see the device tool's
# package list), small enough to carry (< 64 MiB with the tree). Pure-Python distributions are copied from
# .venv with their .dist-info (packages such as flatten-dict and latex2sympy2 read their own version at
# import); compiled ones come as cp312 wheels; bitsandbytes keeps only its CUDA 13.0 and CPU libraries.
# On the device: `export PYTHONPATH=$PWD/.pylib` (carry .pylib).
# TRL=1 adds TRL and what it needs beyond the device image (trl, datasets, dill, multiprocess), for the
# reference GRPOTrainer that bench/gpu_tune.py's `trl` job runs (its script is carried in .gpu/, see there).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .pylib && mkdir .pylib
grep -qx '/.pylib/' .git/info/exclude 2>/dev/null || echo /.pylib/ >> .git/info/exclude
.venv/bin/python - <<'PY'
import shutil
from importlib.metadata import distribution
from pathlib import Path

PURE = ["math-verify", "latex2sympy2_extended", "antlr4-python3-runtime", "dvclive", "dvc", "dvc-render",
        "dvc-studio-client", "funcy", "flatten-dict", "ruamel.yaml", "voluptuous", "wcwidth", "diskcache", "dpath",
        "dvc-data", "dvc-http", "dvc-objects", "atpublic", "scmrepo", "sqltrie", "flufl.lock", "zc.lockfile",
        "pygtrie", "bitsandbytes", "pytest", "pluggy", "iniconfig"]
for name in PURE:
    dist = distribution(name)
    site = Path(dist.locate_file(""))
    tops = {f.parts[0] for f in dist.files if f.parts[0] not in ("..", "bin", "__pycache__") and not f.parts[0].endswith(".pth")}
    for top in tops:
        src, dst = site / top, Path(".pylib") / top
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, dst)
for lib in Path(".pylib/bitsandbytes").glob("libbitsandbytes_*.so"):
    if not lib.name.endswith(("_cpu.so", "_cuda130.so")):
        lib.unlink()
PY
wheels=$(mktemp -d)
pins=()
for name in dulwich orjson; do
    pins+=("$name==$(.venv/bin/python -m pip show "$name" | sed -n 's/^Version: //p')")
done
# TRL 1.16 (the version of the H200 figures, beside the image's transformers 5.17); datasets 4.7, the oldest
# it accepts, asks only for the image's pyarrow and huggingface-hub; dill and multiprocess within its pins
[ "${TRL:-0}" = 1 ] && pins+=(trl==1.16.0 datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18)
for w in "${pins[@]}"; do
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$wheels" "$w"
done
for w in "$wheels"/*.whl; do .venv/bin/python -m zipfile -e "$w" .pylib/; done
rm -rf "$wheels"
du -sh .pylib
