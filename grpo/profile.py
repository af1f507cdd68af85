"""Where a training step's time and memory go: ``python -m grpo.profile [--params params.yaml] [--steps N]
[--out logs/profile] [--budget-gib G]``.

Runs the train stage for one warm-up step and N profiled steps, as ``grpo.tune``'s trials do (your model
and data, a scratch project, its own process; on a GPU the allocator capped at ``--budget-gib``), under
``torch.profiler``. Writes to ``--out``:

- ``trace.json.gz``: the Chrome/Perfetto trace (open it at ui.perfetto.dev or chrome://tracing), phases
  labelled ``grpo/generate`` (inside it the static decoder's ``grpo/decoder.refresh``, ``.prefill`` and
  ``.capture``, and ``grpo/engine.detokenize``: bench/trace_gaps.py gives each its own idle row), ``grpo/score``,
  ``grpo/train`` (of which ``grpo/train_micro_batch`` and ``grpo/optimizer``);
- on CUDA, ``memory_snapshot.pickle`` (drag it onto pytorch.org/memory_viz) and ``memory.png``, the
  allocated memory over the run drawn offline (torch's own HTML viewer loads its script from the network);
- ``phases.txt`` / ``phases.json``: per phase, wall time, GPU busy time (the time the device ran kernels or
  copies inside the phase's window, whichever thread or CUDA graph launched them) and the peak memory of
  the training log (CUDA allocated, or on CPU the process's resident set);
- on CUDA, ``live_memory.json`` and a table in ``phases.txt``: what is allocated as each training step
  starts, by the code that allocated it, so memory a run keeps between steps (and memory that grows from
  step to step) has an owner.
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
import pickle
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

from grpo.cli import positive_number, whole_number
from grpo.measured import TRAIN, read_log

PHASES = ("generate", "score", "train", "train_micro_batch", "optimizer")
GIB = 2**30


def memory_history_safe(raw: dict) -> bool:
    """Whether the allocator's history can be recorded for a run of these params: since torch 2.11 recording
    it makes compiled code inside an activation checkpoint fail ("apply of FunctionMeta returned NULL
    without setting an exception", pytorch/pytorch#179536), which is what ``train.compile_layers`` with
    ``train.gradient_checkpointing`` runs; such a profile has a trace and phases but no memory snapshot."""
    train = raw.get("train") or {}
    return not (train.get("compile_layers") and train.get("gradient_checkpointing", True))


@contextmanager
def profiled(out: Path, cuda: bool, measured_steps: int, memory: bool = True) -> Iterator[None]:
    """Profile the stage run in the block into ``out``: the loading and the warm-up step are skipped (the
    schedule advances as each training step starts), the next ``measured_steps`` steps are traced. On CUDA
    with ``memory``, the memory snapshot covers the whole run (see ``memory_history_safe``)."""
    import torch

    from grpo.microbatch import STEP_START_HOOKS

    out.mkdir(parents=True, exist_ok=True)
    (out / "profile_meta.json").write_text(json.dumps({"cuda": cuda, "memory_history": cuda and memory}))
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    live = LiveMemory()
    cuda_memory = cuda and memory
    if cuda_memory:
        torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")  # C++ stacks: too big
        STEP_START_HOOKS.append(live)
    schedule = torch.profiler.schedule(wait=2, warmup=0, active=measured_steps, repeat=1)  # 0: loading, 1: warm-up
    with torch.profiler.profile(activities=activities, schedule=schedule) as prof:
        STEP_START_HOOKS.append(prof.step)
        try:
            yield
        finally:
            STEP_START_HOOKS.remove(prof.step)
            if cuda_memory:  # before the profiler's own processing: the history's time axis ends with the run
                STEP_START_HOOKS.remove(live)
                torch.cuda.memory._dump_snapshot(str(out / "memory_snapshot.pickle"))
                torch.cuda.memory._record_memory_history(enabled=None)
    trace = out / "trace.json"
    prof.export_chrome_trace(str(trace))
    with trace.open("rb") as src, gzip.open(out / "trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()
    (out / "phase_events.json").write_text(json.dumps(phase_times(prof.events())))
    if cuda_memory:
        (out / "live_memory.json").write_text(json.dumps(live.steps))


class LiveMemory:
    """A step-start hook: CUDA memory allocated at that moment, by owner (``live_by_owner``)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def __call__(self) -> None:
        import torch

        self.steps.append({"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
                           "owners": live_by_owner(torch.cuda.memory_snapshot())})


def owner(frames: list[dict]) -> str:
    """Who allocated a block: the innermost frame of the project's code (grpo/, stages/) in its recorded
    stack, else its innermost frame; ``(no stack)`` when it was allocated before recording began."""
    if not frames:
        return "(no stack)"
    for frame in frames:  # innermost first
        name = frame["filename"].replace("\\", "/")
        for root in ("/grpo/", "/stages/"):
            if root in name and not name.endswith("/grpo/profile.py"):
                return f"{root[1:]}{name.split(root, 1)[1]}:{frame['line']} {frame['name']}"
    return f"{frames[0]['filename'].rsplit('/', 1)[-1]}:{frames[0]['line']} {frames[0]['name']}"


def live_by_owner(segments: list[dict]) -> dict[str, int]:
    """Bytes of the allocated blocks of a ``torch.cuda.memory_snapshot()``, summed by ``owner``."""
    owners: dict[str, int] = {}
    for segment in segments:
        for block in segment.get("blocks", []):
            if block.get("state") == "active_allocated":
                who = owner(block.get("frames") or [])
                owners[who] = owners.get(who, 0) + block["size"]
    return owners


def live_table(steps: list[dict[str, Any]], top: int = 12) -> list[str]:
    """The owners holding the most at the last step start, GiB at each step start and the growth; the
    rest summed as one row."""
    if not steps:
        return []
    last = steps[-1]["owners"]
    names = sorted(last, key=last.get, reverse=True)[:top]
    heads = "".join(f"{f'step {i}':>9}" for i in range(len(steps)))
    lines = [f"allocated at each training step's start, GiB, by owner (step 0: the warm-up)",
             f"{'owner':<64}{heads}{'growth':>9}"]
    rows = [(name, [s["owners"].get(name, 0) for s in steps]) for name in names]
    rows.append(("(the rest)", [sum(v for k, v in s["owners"].items() if k not in names) for s in steps]))
    rows.append(("total allocated", [s["allocated"] for s in steps]))
    rows.append(("reserved by the allocator", [s["reserved"] for s in steps]))
    for name, sizes in rows:
        cells = "".join(f"{b / GIB:>9.3f}" for b in sizes)
        lines.append(f"{name[:63]:<64}{cells}{(sizes[-1] - sizes[0]) / GIB:>+9.3f}")
    return lines


def phase_times(events: Any) -> dict[str, list[dict[str, float]]]:
    """{phase: [{wall_s, gpu_s} per occurrence, in time order]} of the ``grpo/<phase>`` labels' host ranges.
    On CUDA the profiler also lists each label as GPU-timeline annotations (pieces around graph replays);
    those are not phases. GPU time is how long the device was busy (kernels and copies, their union) inside
    the host range's window: the profiler links neither a CUDA graph replay's kernels nor backward's
    (launched from autograd's thread) to the range, so counting the kernels it links read 0.13 s for a
    6.6 s generate (bench/RESULTS.md)."""
    from torch.autograd import DeviceType

    found: dict[str, list[tuple[float, float, float]]] = {}
    device: list[tuple[float, float]] = []
    for e in events:
        if e.device_type == DeviceType.CPU and e.name.startswith("grpo/") and e.name[5:] in PHASES:
            found.setdefault(e.name[5:], []).append((e.time_range.start, e.time_range.end, e.cpu_time_total))
        elif e.device_type != DeviceType.CPU and not e.name.startswith(("grpo/", "ProfilerStep")):
            device.append((e.time_range.start, e.time_range.end))
    busy = union(device)
    return {phase: [{"wall_s": cpu_us / 1e6, "gpu_s": overlap(busy, start, end) / 1e6}
                    for start, end, cpu_us in sorted(items)] for phase, items in found.items()}


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering ``intervals`` (kernels of several streams overlap)."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def overlap(busy: list[tuple[float, float]], start: float, end: float) -> float:
    """How much of [start, end] the disjoint sorted ``busy`` intervals cover."""
    first = bisect.bisect_left(busy, (start,)) - 1  # the interval that may straddle ``start``
    total = 0.0
    for a, b in busy[max(first, 0):]:
        if a >= end:
            break
        total += max(0.0, min(b, end) - max(a, start))
    return total


def phase_table(events: dict[str, list[dict[str, float]]], steps: list[dict], measured_steps: int) -> list[dict]:
    """Per phase over the traced steps: wall and GPU seconds a step, and the peak memory the training
    log recorded for it (the warm-up step's excluded)."""
    rows = []
    for phase in PHASES:
        traced = events.get(phase, [])
        if not traced:
            continue
        peaks = [s[f"peak_memory_gib/{phase}"] for s in steps[1:] if f"peak_memory_gib/{phase}" in s]
        rows.append({"phase": phase, "count": len(traced),
                     "wall_s_per_step": sum(t["wall_s"] for t in traced) / measured_steps,
                     "gpu_s_per_step": sum(t["gpu_s"] for t in traced) / measured_steps,
                     "peak_gib": max(peaks) if peaks else None})
    return rows


def format_table(rows: list[dict], cuda: bool) -> list[str]:
    mem = "peak alloc GiB" if cuda else "peak RSS GiB"
    lines = [f"{'phase':<19}{'count':>6}{'wall s/step':>13}{'GPU s/step':>12}{mem:>16}"]
    for r in rows:
        peak = f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "-"
        gpu = f"{r['gpu_s_per_step']:.3f}" if cuda else "-"
        lines.append(f"{r['phase']:<19}{r['count']:>6}{r['wall_s_per_step']:>13.3f}{gpu:>12}{peak:>16}")
    return lines


def memory_png(snapshot: Path, png: Path) -> tuple[float, float]:
    """Draw allocated memory over the snapshot's allocator history; returns (seconds the history spans,
    its peak in GiB). The history is a ring of the last events, so it starts mid-run: the level is
    anchored at its end to what the snapshot's segments hold allocated, which makes it absolute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = pickle.loads(snapshot.read_bytes())
    events = [e for e in (data.get("device_traces") or [[]])[0] if e["action"] in ("alloc", "free_completed")]
    t0 = events[0]["time_us"] if events else 0
    times, deltas, now = [], [], 0
    for e in events:
        now += e["size"] if e["action"] == "alloc" else -e["size"]
        times.append((e["time_us"] - t0) / 1e6)
        deltas.append(now)
    allocated_at_end = sum(b["size"] for seg in data.get("segments", []) for b in seg.get("blocks", [])
                           if b.get("state") == "active_allocated")
    level = [(d - now + allocated_at_end) / GIB for d in deltas]
    span = times[-1] if times else 0.0
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot(times, level, lw=0.8)
    ax.set(xlabel="seconds since the first event the allocator's history kept", ylabel="allocated GiB",
           title=f"CUDA memory allocated over the last {span:.0f} s of the profiled run ({len(events)} events)")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return span, max(level, default=0.0)


def main(argv: list[str] | None = None) -> int:
    from grpo.tuning.trial import Workload, run_trial

    parser = argparse.ArgumentParser(prog="python -m grpo.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--steps", type=whole_number(1), default=2, help="profiled steps after one warm-up step")
    parser.add_argument("--out", type=Path, default=Path("logs/profile"))
    parser.add_argument("--budget-gib", type=positive_number, help="cap the CUDA allocator (a smaller card)")
    parser.add_argument("--timeout-s", type=positive_number, default=1800.0)
    args = parser.parse_args(argv)
    try:
        raw = yaml.safe_load(args.params.read_text())
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.out.resolve()
    with tempfile.TemporaryDirectory(prefix="grpo-profile-") as scratch:
        try:
            outcome = run_trial(args.params.resolve().parent, Path(scratch), raw, "train", {},
                                workload=Workload(steps=args.steps), cap_gib=args.budget_gib,
                                timeout_s=args.timeout_s, profile_dir=out)
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        steps = (read_log(Path(scratch) / TRAIN) or {}).get("steps", [])
    if outcome.status not in ("ok", "oom") or not (out / "phase_events.json").exists():
        print(f"error: the profiled run {outcome.status}: {outcome.detail}", file=sys.stderr)
        return 1
    meta = json.loads((out / "profile_meta.json").read_text())
    cuda, memory = meta["cuda"], meta["memory_history"]
    rows = phase_table(json.loads((out / "phase_events.json").read_text()), steps, args.steps)
    lines = format_table(rows, cuda) + [f"step: {outcome.speed:.3f} s (median of {args.steps} after the warm-up)"
                                        if outcome.speed else "step: not measured"]
    if cuda and not memory:
        lines.append("no memory snapshot: train.compile_layers under gradient checkpointing (pytorch#179536)")
    if memory:
        span, peak = memory_png(out / "memory_snapshot.pickle", out / "memory.png")
        lines.append(f"memory.png: the allocator's last {span:.0f} s, peak {peak:.2f} GiB allocated in them")
        lines += live_table(json.loads((out / "live_memory.json").read_text()))
    (out / "phases.json").write_text(json.dumps({"rows": rows, "step_s": outcome.speed, "outcome": outcome.status}))
    (out / "phases.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    extra = ", memory_snapshot.pickle, memory.png, live_memory.json" if memory else ""
    print(f"wrote {out}/: trace.json.gz{extra}, phases.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
