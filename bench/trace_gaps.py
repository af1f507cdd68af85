"""Where a profiled step leaves the GPU idle, and what the host was doing then (issue 18).

    python3 bench/trace_gaps.py logs/profile/trace.json.gz [--out gaps.json] [--min-gap-us 20]

Reads the Chrome trace that ``python -m grpo.profile`` writes. For each phase range (``grpo/generate``,
``grpo/train``, ``grpo/train_micro_batch``, ...) on the host: its wall time, the time the device was busy
(kernels and copies, their union), and the idle gaps of at least ``--min-gap-us`` inside it. Each gap is
charged to the host work running at its middle: the innermost CPU event (an aten op, a
``record_function`` label, a CUDA runtime call) on the thread that launched the kernel after the gap
(where the next launch came from is what the device waited for). Prints, per phase, the idle time by
host event name and the kernels' time by name (those that start inside the phase), and keeps the longest
gaps with their host stacks; ``--out`` writes all of it as JSON.
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from grpo.profile import overlap, union  # noqa: E402

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATS = {"cpu_op", "user_annotation", "cuda_runtime", "python_function", "cuda_driver"}


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return [e for e in data.get("traceEvents", data) if e.get("ph") == "X" and "dur" in e]


def gaps_in(busy: list[tuple[float, float]], start: float, end: float, min_gap: float) -> list[tuple[float, float]]:
    """Idle intervals of at least ``min_gap`` inside [start, end] between the busy intervals."""
    out, cursor = [], start
    for a, b in busy[max(bisect.bisect_left(busy, (start,)) - 1, 0):]:
        if a >= end:
            break
        if a - cursor >= min_gap:
            out.append((cursor, a))
        cursor = max(cursor, b)
    if end - cursor >= min_gap:
        out.append((cursor, end))
    return out


class HostStacks:
    """The host events of each thread, to ask which were running at a moment (innermost last)."""

    def __init__(self, events: list[dict]) -> None:
        self.by_tid: dict[object, list[dict]] = defaultdict(list)
        for e in events:
            if e.get("cat") in HOST_CATS:
                self.by_tid[e["tid"]].append(e)
        for evs in self.by_tid.values():
            evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        self.starts = {tid: [e["ts"] for e in evs] for tid, evs in self.by_tid.items()}

    def stack(self, tid: object, t: float, window: float = 5e6) -> list[str]:
        evs, starts = self.by_tid.get(tid, []), self.starts.get(tid, [])
        hi = bisect.bisect_right(starts, t)
        lo = bisect.bisect_left(starts, t - window)  # no host event here lasts longer than a step
        running = [e for e in evs[lo:hi] if e["ts"] + e["dur"] >= t]
        return [e["name"] for e in sorted(running, key=lambda e: (e["ts"], -e["dur"]))]


def analyse(events: list[dict], min_gap_us: float = 20.0, top: int = 15) -> dict:
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    busy = union([(e["ts"], e["ts"] + e["dur"]) for e in device])
    device.sort(key=lambda e: e["ts"])
    device_starts = [e["ts"] for e in device]
    # each kernel's launch (the runtime call with the same correlation id) says which thread waited on it
    launch_tid = {e["args"]["correlation"]: e["tid"] for e in events
                  if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    hosts = HostStacks(events)
    phases = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("grpo/")]
    main_tid = phases[0]["tid"] if phases else None
    report: dict[str, dict] = {}
    for phase in sorted({p["name"] for p in phases}):
        ranges = [(p["ts"], p["ts"] + p["dur"]) for p in phases if p["name"] == phase]
        wall = sum(b - a for a, b in ranges)
        idle_by: dict[str, float] = defaultdict(float)
        kernel_us: dict[str, float] = defaultdict(float)
        longest = []
        busy_us = 0.0
        for start, end in ranges:
            busy_us += overlap(busy, start, end)
            for e in device[bisect.bisect_left(device_starts, start):bisect.bisect_left(device_starts, end)]:
                kernel_us[e["name"][:100]] += e["dur"]
            for a, b in gaps_in(busy, start, end, min_gap_us):
                nxt = bisect.bisect_left(device_starts, b)
                tid = main_tid
                if nxt < len(device):
                    tid = launch_tid.get(device[nxt].get("args", {}).get("correlation"), main_tid)
                stack = hosts.stack(tid, (a + b) / 2)
                labels = [n for n in stack if not n.startswith("grpo/")]
                inner = labels[-1] if labels else (stack[-1] if stack else "(no host event)")
                idle_by[inner] += b - a
                longest.append((b - a, a, stack[-6:]))
        longest.sort(key=lambda g: -g[0])
        report[phase] = {
            "count": len(ranges), "wall_ms": round(wall / 1e3, 1), "gpu_busy_ms": round(busy_us / 1e3, 1),
            "idle_ms": round((wall - busy_us) / 1e3, 1),
            "idle_by_host_event_ms": {k: round(v / 1e3, 2)
                                      for k, v in sorted(idle_by.items(), key=lambda kv: -kv[1])[:top]},
            "kernels_ms": {k: round(v / 1e3, 2) for k, v in sorted(kernel_us.items(), key=lambda kv: -kv[1])[:top]},
            "longest_gaps": [{"us": round(d), "at_ms": round((t - ranges[0][0]) / 1e3, 2), "host": s}
                             for d, t, s in longest[:top]],
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--min-gap-us", type=float, default=20.0)
    parser.add_argument("--top", type=int, default=15, help="rows a list keeps (the JSON; the printout keeps 15)")
    args = parser.parse_args()
    report = analyse(load(args.trace), args.min_gap_us, args.top)
    for phase, r in report.items():
        print(f"{phase}: {r['count']}x, wall {r['wall_ms']} ms, GPU busy {r['gpu_busy_ms']} ms, idle {r['idle_ms']} ms")
        for name, ms in list(r["idle_by_host_event_ms"].items())[:15]:
            print(f"    {ms:9.2f} ms idle while the host ran {name}")
        for name, ms in list(r["kernels_ms"].items())[:15]:
            print(f"    {ms:9.2f} ms in {name}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
