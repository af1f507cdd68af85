"""The report's figures, drawn with matplotlib (``dvc plots show`` would load its charts from a CDN).

One function per figure; each takes the data it plots and the PNG path to write, and returns that
path, or None when its inputs are missing (the report then says which panel was skipped and why).
Figures are built on ``matplotlib.figure.Figure`` directly, never through pyplot's global state, and
saved with a fixed size, dpi and no "Software" metadata: identical inputs give identical PNG bytes,
so a rerun does not churn the DVC cache.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402 - the backend must be chosen before anything draws
import pandas as pd  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from grpo.report import MODELS, PASS1, PASS1_STDERR, ReportInputs, eval_benchmarks, eval_metric  # noqa: E402

DPI = 110
WIDE, SINGLE = (10.0, 4.0), (7.0, 4.0)
MODEL_COLORS = {"base": "#8c8c8c", "final": "#1f77b4", "best": "#ff7f0e"}
STYLE = {"font.family": "DejaVu Sans", "font.size": 9.5, "axes.grid": True, "grid.alpha": 0.3,
         "axes.spines.top": False, "axes.spines.right": False, "legend.frameon": False}


def _styled(draw: Callable[..., Path | None]) -> Callable[..., Path | None]:
    """Run a figure function under the report's rc style (artists read rcParams when created)."""
    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(STYLE):
            return draw(*args, **kwargs)

    return wrapper


def _new_figure(size: tuple[float, float], ncols: int = 1, nrows: int = 1, **kw) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kw).ravel()


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    return path


def _columns(steps: pd.DataFrame | None, *names: str) -> list[str]:
    """The named columns that exist and hold at least one number."""
    if steps is None:
        return []
    return [n for n in names if n in steps.columns and steps[n].notna().any()]


def _step_axis(ax: Axes, label: str = "training step") -> None:
    ax.set_xlabel(label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _mark_stages(ax: Axes, steps: pd.DataFrame) -> None:
    """Dotted lines where the curriculum stage changes, so reward jumps can be read against them."""
    if "curriculum_stage" not in steps.columns:
        return
    stage = steps["curriculum_stage"].to_numpy()
    for i in np.flatnonzero(np.diff(stage) != 0) + 1:
        ax.axvline(steps["step"].iloc[i] - 0.5, color="0.4", linestyle=":", linewidth=1)


@_styled
def reward_curves(steps: pd.DataFrame | None, path: Path) -> Path | None:
    """Total reward (mean ± std over the step's rollouts) and each reward function's mean."""
    if not _columns(steps, "reward"):
        return None
    per_fn = sorted(c for c in steps.columns
                    if c.startswith("rewards/") and c.endswith("/mean") and steps[c].notna().any())
    fig, axes = _new_figure(WIDE if per_fn else SINGLE, ncols=2 if per_fn else 1)
    ax, x = axes[0], steps["step"]
    ax.plot(x, steps["reward"], marker="o", markersize=3, label="mean reward")
    if "reward_std" in steps.columns:
        low, high = steps["reward"] - steps["reward_std"], steps["reward"] + steps["reward_std"]
        ax.fill_between(x, low, high, alpha=0.2, label="± 1 std (within step)")
    _mark_stages(ax, steps)
    ax.set(title="Total reward per step", ylabel="reward")
    ax.legend(loc="best")
    _step_axis(ax)
    if per_fn:
        ax = axes[1]
        for col in per_fn:
            ax.plot(x, steps[col], marker="o", markersize=3, label=col.split("/")[1])
        _mark_stages(ax, steps)
        ax.set(title="Reward per function (unweighted mean)", ylabel="reward")
        ax.legend(loc="best")
        _step_axis(ax)
    return _save(fig, path)


@_styled
def accuracy_curve(steps: pd.DataFrame | None, path: Path) -> Path | None:
    """Training-batch accuracy: the fraction of rollouts the verifier marks correct."""
    if not _columns(steps, "accuracy"):
        return None
    fig, (ax,) = _new_figure(SINGLE)
    ax.plot(steps["step"], steps["accuracy"], marker="o", markersize=3, label="rollout accuracy")
    if len(steps) >= 5:  # a rolling mean only helps once there is something to smooth
        ax.plot(steps["step"], steps["accuracy"].rolling(5, min_periods=1).mean(), label="rolling mean (5 steps)")
    _mark_stages(ax, steps)
    ax.set(title="Accuracy of training rollouts", ylabel="fraction correct", ylim=(-0.02, 1.02))
    ax.legend(loc="best")
    _step_axis(ax)
    return _save(fig, path)


@_styled
def length_curves(steps: pd.DataFrame | None, path: Path) -> Path | None:
    """Response length (mean and max tokens) and, below it, the fraction cut off at the length limit."""
    lengths = _columns(steps, "completions/mean_length", "completions/max_length")
    if not lengths:
        return None
    truncated = _columns(steps, "completions/clipped_ratio")
    fig, axes = _new_figure((7.0, 5.5) if truncated else SINGLE, nrows=2 if truncated else 1,
                            sharex=True, height_ratios=[2, 1] if truncated else None)
    ax = axes[0]
    for col, label in (("completions/mean_length", "mean"), ("completions/max_length", "max")):
        if col in lengths:
            ax.plot(steps["step"], steps[col], marker="o", markersize=3, label=label)
    ax.set(title="Response length", ylabel="tokens")
    ax.legend(loc="best")
    if not truncated:
        _step_axis(ax)
    if truncated:
        ax = axes[1]
        ax.plot(steps["step"], steps["completions/clipped_ratio"], color="#d62728", marker="o", markersize=3)
        ax.set(title="Truncated responses (hit the length limit)", ylabel="fraction", ylim=(-0.02, 1.02))
        _step_axis(ax)
    return _save(fig, path)


@_styled
def entropy_curve(steps: pd.DataFrame | None, path: Path) -> Path | None:
    """Mean token entropy of the policy over response tokens (logged only when the loss computes it)."""
    if not _columns(steps, "entropy"):
        return None
    fig, (ax,) = _new_figure(SINGLE)
    ax.plot(steps["step"], steps["entropy"], marker="o", markersize=3, color="#2ca02c")
    _mark_stages(ax, steps)
    ax.set(title="Policy token entropy", ylabel="nats per token")
    _step_axis(ax)
    return _save(fig, path)


# The diagnostics figure's panels: title → training-log metrics ("name*" matches every metric with that
# prefix). The throughput is measured (logs/train.json), so it is drawn apart, by ``throughput_curve``.
DIAGNOSTIC_PANELS = {
    "Gradient norm (before clipping)": ("grad_norm",),
    "KL to the reference policy": ("kl",),
    "Clipped token fraction": ("clip_ratio/*",),
    "Groups with zero reward spread": ("frac_reward_zero_std",),
    "Tokens kept by the entropy mask": ("kept_token_frac",),
    "Learning rate": ("learning_rate",),
}


def panel_columns(steps: pd.DataFrame | None, patterns: tuple[str, ...]) -> list[str]:
    """The columns of ``steps`` a diagnostics panel plots (empty: the panel is skipped)."""
    if steps is None:
        return []
    names = [c for p in patterns for c in (sorted(c for c in steps.columns if c.startswith(p[:-1]))
                                              if p.endswith("*") else [p])]
    return _columns(steps, *names)


@_styled
def diagnostics(steps: pd.DataFrame | None, path: Path) -> Path | None:
    """Small multiples of the optimisation signals that were logged (``DIAGNOSTIC_PANELS``)."""
    panels = [(title, cols) for title, patterns in DIAGNOSTIC_PANELS.items()
              if (cols := panel_columns(steps, patterns))]
    if not panels:
        return None
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = _new_figure((10.0, 3.0 * nrows), ncols=ncols, nrows=nrows)
    for ax, (title, cols) in zip(axes, panels):
        for col in cols:
            ax.plot(steps["step"], steps[col], marker="o", markersize=2.5, label=col)
        if len(cols) > 1:
            ax.legend(loc="best", fontsize=8)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))  # the lr would print as 0.000200
        ax.set_title(title)
        _step_axis(ax)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return _save(fig, path)


@_styled
def validation_curve(validation: pd.DataFrame | None, selection: dict | None, path: Path) -> Path | None:
    """Validation accuracy (and format rate) per evaluated step, with the selected checkpoint marked."""
    if not _columns(validation, "accuracy"):
        return None
    fig, (ax,) = _new_figure(SINGLE)
    ax.plot(validation["step"], validation["accuracy"], marker="o", label="accuracy")
    if _columns(validation, "format_rate"):
        ax.plot(validation["step"], validation["format_rate"], marker="s", markersize=4, linestyle="--",
                label="format rate")
    chosen = (selection or {}).get("step")
    row = validation[validation["step"] == chosen]
    if len(row):
        ax.axvline(chosen, color="#ff7f0e", linestyle=":", linewidth=1.2)
        ax.plot([chosen], [row["accuracy"].iloc[0]], marker="*", markersize=16, color="#ff7f0e",
                linestyle="none", label=f"selected: step {chosen}")
    ax.set(title="Validation during training", ylabel="fraction of validation questions", ylim=(-0.02, 1.05))
    ax.legend(loc="best")
    _step_axis(ax)
    return _save(fig, path)


@_styled
def benchmark_bars(eval_data: dict | None, path: Path) -> Path | None:
    """pass@1 per benchmark for base, final and best, with ± 1 standard error bars."""
    benchmarks = eval_benchmarks(eval_data)
    models = [m for m in MODELS if any(eval_metric(eval_data, m, b, PASS1) is not None for b in benchmarks)]
    if not models:
        return None
    fig, (ax,) = _new_figure((max(7.0, 1.6 * len(benchmarks) + 2), 4.2))
    ax.grid(axis="x", visible=False)
    width = 0.8 / len(models)
    x = np.arange(len(benchmarks))
    top = 0.0
    for i, model in enumerate(models):
        values = [eval_metric(eval_data, model, b, PASS1) for b in benchmarks]
        errors = [eval_metric(eval_data, model, b, PASS1_STDERR) or 0.0 for b in benchmarks]
        pos = x + (i - (len(models) - 1) / 2) * width
        # NaN draws neither bar nor error bar, so a missing result is not mistaken for a score of 0
        ax.bar(pos, [np.nan if v is None else v for v in values], width, color=MODEL_COLORS[model], label=model,
               yerr=[np.nan if v is None else e for v, e in zip(values, errors)], capsize=3)
        for p, v, e in zip(pos, values, errors):
            label, y = ("n/a", 0.005) if v is None else (f"{v:.2f}", v + e + 0.01)
            ax.text(p, y, label, ha="center", va="bottom", fontsize=8)
            top = max(top, y)
    ax.set_xticks(x, benchmarks)
    ax.set(title="Benchmarks: pass@1 ± 1 standard error", ylabel="pass@1", ylim=(0, max(0.1, top * 1.15 + 0.03)))
    fig.legend(loc="outside upper center", ncols=len(models))
    return _save(fig, path)


@_styled
def sent_histograms(scores: pd.DataFrame | None, path: Path) -> Path | None:
    """SENT's view of the training questions: semantic entropy and base-model pass rate."""
    if scores is None or "entropy" not in scores.columns:
        return None
    # M samples per question: entropy lies in [0, ln M] and pass rates are c/M, so bin on those values
    m = int(scores["n"].max()) if "n" in scores.columns else 8
    has_pass = "pass_rate" in scores.columns
    fig, axes = _new_figure(WIDE if has_pass else SINGLE, ncols=2 if has_pass else 1)
    h_max = math.log(m)
    axes[0].hist(scores["entropy"], bins=np.linspace(0.0, h_max * 1.0001, 2 * m + 1), color="#9467bd",
                 edgecolor="white")
    axes[0].axvline(h_max, color="0.4", linestyle="--", linewidth=1)
    axes[0].set(title=f"Semantic entropy ({len(scores)} training questions, M = {m})", ylabel="questions",
                xlabel=f"entropy (nats); dashed: ln M = {h_max:.2f}, all M answers differ")
    if has_pass:
        axes[1].hist(scores["pass_rate"], bins=(np.arange(m + 2) - 0.5) / m, rwidth=0.8, color="#17becf")
        if m <= 16:
            axes[1].set_xticks(np.arange(m + 1) / m, [f"{k}/{m}" for k in range(m + 1)])
        axes[1].set(title="Base-model pass rate per question", xlabel="fraction of samples correct",
                    ylabel="questions")
    return _save(fig, path)


@_styled
def throughput_curve(steps: pd.DataFrame | None, path: Path) -> Path | None:
    """Rollout and training tokens per second per step: measured (logs/train.json), so this figure goes
    to the untracked companion of the report (grpo/report/measured.py), never into reports/."""
    columns = _columns(steps, "rollout_tokens_per_s", "train_tokens_per_s")
    if not columns:
        return None
    fig, (ax,) = _new_figure(SINGLE)
    for col in columns:
        ax.plot(steps["step"], steps[col], marker="o", markersize=3, label=col)
    ax.set(title="Throughput (wall clock of the machine that trained)", ylabel="tokens/s")
    ax.legend(loc="best")
    _step_axis(ax)
    return _save(fig, path)


def render_figures(inputs: ReportInputs, out_dir: Path) -> dict[str, Path | None]:
    """Every figure, by name (in report order); a value is None when that figure's inputs are missing."""
    return {
        "reward": reward_curves(inputs.steps, out_dir / "reward.png"),
        "accuracy": accuracy_curve(inputs.steps, out_dir / "accuracy.png"),
        "length": length_curves(inputs.steps, out_dir / "length.png"),
        "entropy": entropy_curve(inputs.steps, out_dir / "entropy.png"),
        "diagnostics": diagnostics(inputs.steps, out_dir / "diagnostics.png"),
        "validation": validation_curve(inputs.validation, inputs.selection, out_dir / "validation.png"),
        "benchmarks": benchmark_bars(inputs.eval, out_dir / "benchmarks.png"),
        "sent": sent_histograms(inputs.sent_scores, out_dir / "sent.png"),
    }
