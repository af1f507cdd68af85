"""One table from the GPU benchmark JSONs (bench/gpu_bench.py, gpu_anchor.py, trl_anchor.py), with the
ratios against plain ``generate`` and TRL; writes ``$OUT/gpu_summary.json`` (default bench/results/).

    OUT=bench/results python bench/gpu_report.py
"""
from __future__ import annotations

import json
import os
from pathlib import Path

OUT = Path(os.environ.get("OUT") or Path(__file__).parent / "results")


def main() -> None:
    def load(name):
        path = OUT / name
        return json.loads(path.read_text()) if path.exists() else {}

    ro, ke, an = load("gpu_rollout.json"), load("gpu_kernels.json"), load("anchor.json")
    steps = {path.stem[len("gpu_step_"):]: json.loads(path.read_text()) for path in sorted(OUT.glob("gpu_step_*.json"))}
    trl = load("trl_cap8.json") or load("gpu_trl_cap8.json")  # trl_anchor.py's name, or as kept here
    lines = ["| path | batch | new tokens | tok/s | vs plain generate nf4 (this run; anchor) | "
             "vs plain generate bf16 (this run; anchor) |", "| --- | --- | --- | --- | --- | --- |"]

    def ratio(value: float, base: dict | float | None) -> str:
        base = base.get("tok_per_s") if isinstance(base, dict) else base
        return f"{value / base:.0f}x" if base else "n/a"

    for key, val in ro.items():
        if key.startswith("fast_") and isinstance(val, dict):
            batch = int(key.split("_B")[1].split("_")[0])
            new = key.split("_N")[1]
            tps = val["tok_per_s"]
            cells = [f"{ratio(tps, ro.get(f'plain_generate_{q}_B{batch}'))}; "
                     f"{ratio(tps, an.get(f'hf_generate_{q}_B{batch}_tok_per_s'))}" for q in ("nf4", "bf16")]
            lines.append(f"| {key[5:].split('_B')[0]} | {batch} | {new} | {tps:,} "
                         f"(excl. capture {val['tok_per_s_excl_capture']:,}) | {cells[0]} | {cells[1]} |")
    for key, val in ro.items():
        if key.startswith(("plain_generate", "hf_generate")):
            lines.append(f"| {key} | {key.split('_B')[1]} | {val['new_tokens']} | {val['tok_per_s']:,} | | |")
    for key, val in ro.items():  # decode-only rate: the extra 256 tokens of the 768 run over the 512 run
        if key.startswith("fast_") and key.endswith("_N768") and key.replace("_N768", "_N512") in ro:
            short = ro[key.replace("_N768", "_N512")]
            extra = (val["s"] - val["capture_s"]) - (short["s"] - short["capture_s"])
            batch = int(key.split("_B")[1].split("_")[0])
            lines.append(f"| {key[5:].split('_B')[0]} decode only (tokens 512-768) | {batch} | 256 | "
                         f"{round(batch * 256 / extra):,} | | |")
    trl_s = trl.get("step_s", [None])[-1]
    for label, st in steps.items():  # one file per step run (backend, micro-batch, dense copy kept or not)
        for backend in ("triton", "torch"):
            if f"{backend}_steady_s_per_step" not in st:
                continue
            s, last = st[f"{backend}_steady_s_per_step"], st[f"{backend}_step1"]
            # TRL's step covers 4 prompts x 4 (ACC=4); the preset's 16 prompts take 4 such steps
            per_prompt = f"{trl_s * 4 / s:.1f}x (TRL {trl_s} s per 4 prompts x 4, x4 for 16)" if trl_s else "n/a"
            lines.append(f"| GRPO step [{label}], 8 GiB cap | 64 seq | 768 | {s} s/step | TRL: {per_prompt} | "
                         f"peak {last['train_peak_GiB']} GiB train, {last.get('generate_peak_GiB')} GiB generate |")
    summary = {"rollout": ro, "step": steps, "kernels": ke, "anchor": an, "trl": trl}
    (OUT / "gpu_summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
