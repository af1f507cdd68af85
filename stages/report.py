"""DVC stage report: tables, figures and a model card comparing the base, final and best models.

Reads params.yaml (all sections: the report lists the params that differ from the defaults),
models/base/MODEL_INFO.json, metrics/{prepare,sent,train,eval}.json, metrics/train/{steps,validation}.csv,
data/sent/scores.jsonl, models/best/SELECTION.json and data/bundled/*/SOURCE.md; any of them may be
missing (the report says so). Writes reports/ (report.md, report.html, MODEL_CARD.md, figures/) atomically:
a function of those inputs alone. The wall-clock figures of logs/ (grpo/measured.py) go to the untracked
logs/report_measured.md and logs/report_figures/ instead (grpo/report/measured.py).
Run from the project root: python -m stages.report [--params params.yaml]
"""
from pathlib import Path

from grpo.cli import run_stage
from grpo.config import SECTIONS
from grpo.io import atomic_dir
from grpo.report import load_inputs
from grpo.report.figures import render_figures
from grpo.report.markdown import write_report
from grpo.report.measured import write_measured
from grpo.report.model_card import model_card

OUT = Path("reports")


def main(params, args) -> None:
    inputs = load_inputs(params)
    with atomic_dir(OUT) as tmp:
        figures = render_figures(inputs, tmp / "figures")
        write_report(inputs, figures, tmp)
        (tmp / "MODEL_CARD.md").write_text(model_card(inputs), encoding="utf-8")
    write_measured(inputs)


if __name__ == "__main__":
    run_stage("report", list(SECTIONS), main)
