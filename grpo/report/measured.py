"""The report's untracked companion: the wall-clock figures of the machine that ran the stages.

reports/ is a function of the tracked inputs alone (grpo/report/__init__.py), so a rerun on them
writes the same bytes and ``dvc.lock`` does not change. What a run measured (grpo/measured.py:
seconds, tokens per second, peak memory) differs between runs and machines, so the report stage
writes it here instead: ``logs/report_measured.md`` and, when training logged its throughput,
``logs/report_figures/throughput.png``, under logs/, which git ignores and no stage declares. Both are
rewritten on every run of the stage from what logs/ holds then; a section whose log is missing says
so (a fresh clone that pulled its outputs has no logs/).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from grpo.io import atomic_write_text
from grpo.measured import LOGS, SENT, TRAIN, eval_log, read_log
from grpo.report import MODELS, ReportInputs, eval_benchmarks, fmt, frame
from grpo.report.figures import throughput_curve
from grpo.report.render import Block, Heading, Image, Para, Table, to_markdown

MEASURED_REPORT = LOGS / "report_measured.md"
MEASURED_FIGURES = LOGS / "report_figures"  # relative to the project root; the markdown links under LOGS
THROUGHPUT = "throughput.png"


def _rows_table(rows: list[dict[str, Any]], first: tuple[str, ...]) -> Table:
    """One row per mapping; the columns are ``first``, then every other key in first-seen order."""
    keys = dict.fromkeys(first)
    for row in rows:
        keys.update(dict.fromkeys(row))
    return Table(list(keys), [[fmt(row.get(k)) for k in keys] for row in rows])


def _training(log: dict | None, figure: Path | None) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Training")]
    if not log:
        return blocks + [Para(f"{TRAIN.as_posix()} is missing: the train stage did not run on this machine.")]
    blocks.append(Para(f"Time generating {fmt(log.get('time_generate_s'))} s, training "
                       f"{fmt(log.get('time_train_s'))} s, summed over the steps of {TRAIN.as_posix()} (a resumed "
                       "step counts its last run)."))
    if figure is not None:
        blocks.append(Image(figure.relative_to(LOGS).as_posix(), "Tokens per second per training step"))
    steps = log.get("steps") or []
    return blocks + ([Para("Per step:"), _rows_table(steps, ("step",))] if steps else [])


def _sent(log: dict | None) -> list[Block]:
    blocks: list[Block] = [Heading(2, "SENT")]
    if not log:
        return blocks + [Para(f"{SENT.as_posix()} is missing: SENT did not run on this machine.")]
    return blocks + [Table(["figure", "value"], [[k, fmt(v)] for k, v in log.items()])]


def _evaluation(inputs: ReportInputs, root: Path) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Evaluation")]
    benchmarks = dict.fromkeys([*inputs.params["prepare"].benchmarks, *eval_benchmarks(inputs.eval)])
    rows = [{"model": model, "benchmark": bench, **log} for model in MODELS for bench in benchmarks
            if (log := read_log(eval_log(root, model, bench)))]
    if not rows:
        return blocks + [Para(f"{(LOGS / 'eval').as_posix()}/ has no log: no evaluation ran on this machine.")]
    return blocks + [_rows_table(rows, ("model", "benchmark"))]


def measured_blocks(inputs: ReportInputs, root: Path, train: dict | None, figure: Path | None) -> list[Block]:
    """The companion, in order: training (``train``: logs/train.json's content), SENT, evaluation;
    ``figure`` is the throughput PNG or None."""
    return ([Heading(1, "Measured figures of this machine's run"),
             Para(f"Wall-clock figures from {LOGS.as_posix()}/ (grpo/measured.py), which git and DVC do not "
                  "track: they differ between runs and machines, so reports/ leaves them out to stay "
                  "reproducible. Rewritten by every run of the report stage.")]
            + _training(train, figure) + _sent(read_log(root / SENT)) + _evaluation(inputs, root))


def write_measured(inputs: ReportInputs, root: Path = Path(".")) -> Path:
    """Write logs/report_measured.md (and the throughput figure when logs/train.json has one) under
    ``root``, replacing what an earlier run wrote; returns the markdown's path."""
    shutil.rmtree(root / MEASURED_FIGURES, ignore_errors=True)  # a figure this run cannot draw is not kept
    train = read_log(root / TRAIN)
    figure = MEASURED_FIGURES / THROUGHPUT
    drawn = throughput_curve(frame((train or {}).get("steps") or []), root / figure)
    path = root / MEASURED_REPORT
    atomic_write_text(path, to_markdown(measured_blocks(inputs, root, train, figure if drawn else None)))
    return path
