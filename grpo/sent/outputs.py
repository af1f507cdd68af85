"""What the sent stage writes: scores.jsonl, curriculum.json, the entropy histogram and metrics/sent.json.

The data folder is written through ``atomic_dir``, so a killed stage leaves either the previous
complete folder or none; the metrics file is written atomically after it.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen before pyplot loads
import numpy as np  # noqa: E402

from grpo.io import atomic_dir, atomic_write_json, write_jsonl  # noqa: E402
from grpo.sent.scoring import ScoringRun  # noqa: E402

SCORES = "scores.jsonl"
CURRICULUM = "curriculum.json"
HISTOGRAM = "entropy_hist.png"
QUANTILES = (10, 25, 50, 75, 90)
# Pass-rate buckets of the histogram: the two uniform outcomes (no GRPO signal) and the split between.
PASS_BUCKETS = (
    ("pass rate 0", "#c0392b", lambda p: p == 0.0),
    ("0 < pass rate < 0.5", "#e67e22", lambda p: 0.0 < p < 0.5),
    ("0.5 ≤ pass rate < 1", "#2e86c1", lambda p: 0.5 <= p < 1.0),
    ("pass rate 1", "#27ae60", lambda p: p == 1.0),
)


def _pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    """None when either side is constant: the correlation is undefined, not zero."""
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def _rounded(metrics: dict) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}


def sent_metrics(run: ScoringRun, curriculum: dict, *, engine: str, M: int) -> dict:
    """metrics/sent.json: flat keys, so `dvc metrics diff` shows one row each. Results only: the run's
    timings go to logs/sent.json (``measured_figures``)."""
    entropy = np.array([s["entropy"] for s in run.scores], dtype=float)
    pass_rate = np.array([s["pass_rate"] for s in run.scores], dtype=float)
    metrics = {
        "enabled": True,
        "engine": engine,
        "M": M,
        "questions": len(run.scores),
        "entropy_mean": float(entropy.mean()),
        "entropy_std": float(entropy.std()),
        "entropy_min": float(entropy.min()),
        "entropy_max": float(entropy.max()),
        # SENT orders by entropy: few distinct values means many ties, broken by pass rate and a shuffle
        "entropy_distinct_fraction": len({round(e, 9) for e in entropy}) / len(entropy),
        "entropy_pass_rate_pearson": _pearson(entropy, pass_rate),
        "pass_rate_mean": float(pass_rate.mean()),
        "questions_all_correct": int((pass_rate == 1.0).sum()),
        "questions_all_wrong": int((pass_rate == 0.0).sum()),
        "dropped_all_correct": len(curriculum["dropped"]["all_correct"]),
        "dropped_all_wrong": len(curriculum["dropped"]["all_wrong"]),
        "curriculum_stages": curriculum["num_stages"],
        "truncated_fraction": float(np.mean([s["truncated"] for s in run.scores])),
        "mean_length": float(np.mean([s["mean_length"] for s in run.scores])),
        "generated_tokens": run.generated_tokens,
    }
    for q, value in zip(QUANTILES, np.percentile(entropy, QUANTILES)):
        metrics[f"entropy_p{q}"] = float(value)
    return _rounded(metrics)


def measured_figures(run: ScoringRun) -> dict:
    """logs/sent.json (grpo/measured.py): this process's timings; ``questions_resumed`` were scored
    by an earlier, interrupted process and are not in them."""
    return {"time_s": run.time_s, "generate_s": run.generate_s, "tokens_per_s": run.tokens_per_s,
            "questions_resumed": run.resumed}


def plot_entropy_histogram(scores: Sequence[dict], M: int, path: Path) -> None:
    """Stacked histogram of entropies, one colour per pass-rate bucket, on [0, ln M] (ln M: all M
    answers differ)."""
    entropy = np.array([s["entropy"] for s in scores], dtype=float)
    pass_rate = [s["pass_rate"] for s in scores]
    h_max = math.log(M)
    bins = np.linspace(0.0, h_max * 1.0001, 2 * M + 1)  # the tiny stretch keeps H = ln M in the last bin
    groups, labels, colors = [], [], []
    for label, color, member in PASS_BUCKETS:
        values = entropy[[member(p) for p in pass_rate]]
        groups.append(values)
        labels.append(f"{label} ({len(values)})")
        colors.append(color)
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=120)
    ax.hist(groups, bins=bins, stacked=True, label=labels, color=colors, edgecolor="white", linewidth=0.5)
    ax.axvline(h_max, color="0.3", linestyle="--", linewidth=1)
    ax.annotate(f"ln M = {h_max:.2f}", (h_max, 0.97), xycoords=("data", "axes fraction"),
                ha="right", va="top", fontsize=9, color="0.3")
    ax.set_xlabel("semantic entropy (nats)")
    ax.set_ylabel("questions")
    ax.set_title(f"SENT: semantic entropy of {len(scores)} training questions, M = {M} samples each")
    ax.legend(title="questions by pass rate", fontsize=9, title_fontsize=9, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))  # outside the axes: it never hides bars
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_outputs(out_dir: Path, metrics_path: Path, run: ScoringRun, curriculum: dict, *,
                  engine: str, M: int) -> dict:
    metrics = sent_metrics(run, curriculum, engine=engine, M=M)
    with atomic_dir(out_dir) as tmp:
        tmp = Path(tmp)
        write_jsonl(tmp / SCORES, run.scores)
        atomic_write_json(tmp / CURRICULUM, curriculum)
        plot_entropy_histogram(run.scores, M, tmp / HISTOGRAM)
    atomic_write_json(metrics_path, metrics)
    return metrics


def write_disabled(out_dir: Path, metrics_path: Path) -> None:
    """sent.enabled false: an empty scores file and no curriculum.json, which the train stage reads
    as "no curriculum" (an empty curriculum would instead mean "no questions")."""
    with atomic_dir(out_dir) as tmp:
        write_jsonl(Path(tmp) / SCORES, [])
    atomic_write_json(metrics_path, {"enabled": False})
