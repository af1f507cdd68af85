"""eval_summary: per-pair metrics files merge into one nested metrics/eval.json and a flat CSV."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.eval.summary import collect_metrics, write_summary

ROOT = Path(__file__).resolve().parents[2]


def write_pair(root: Path, model: str, benchmark: str, **metrics) -> None:
    path = root / "metrics" / "eval" / model / f"{benchmark}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics))


def test_nesting_and_csv(tmp_path):
    write_pair(tmp_path, "final", "math500", **{"pass@1": 0.1234567891, "n": 1})
    write_pair(tmp_path, "base", "gsm8k", **{"pass@1": 0.25, "n": 4, "maj@2": 0.5})
    write_pair(tmp_path, "best", "gsm8k", **{"pass@1": 1 / 3, "n": 1})
    write_pair(tmp_path, "base", "math500", **{"pass@1": 0.0, "n": 1})
    nested = collect_metrics(tmp_path / "metrics" / "eval")
    write_summary(nested, tmp_path / "metrics" / "eval.json", tmp_path / "eval" / "summary.csv")

    text = (tmp_path / "metrics" / "eval.json").read_text()
    merged = json.loads(text)
    assert merged == {
        "base": {"gsm8k": {"pass@1": 0.25, "n": 4, "maj@2": 0.5}, "math500": {"pass@1": 0.0, "n": 1}},
        "best": {"gsm8k": {"pass@1": 0.333333, "n": 1}},
        "final": {"math500": {"pass@1": 0.123457, "n": 1}},
    }
    assert text.index('"best"') < text.index('"final"') and text.index('"maj@2"') < text.index('"n"')  # sorted

    with (tmp_path / "eval" / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["model"], r["benchmark"]) for r in rows] == [
        ("base", "gsm8k"), ("base", "math500"), ("final", "math500"), ("best", "gsm8k")]
    assert list(rows[0]) == ["model", "benchmark", "maj@2", "n", "pass@1"]
    assert rows[0]["maj@2"] == "0.5" and rows[1]["maj@2"] == "" and rows[3]["pass@1"] == "0.333333"


def test_no_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the evaluate stages first"):
        collect_metrics(tmp_path / "metrics" / "eval")


def test_stage_script(tmp_path):
    write_pair(tmp_path, "base", "gsm8k", **{"pass@1": 0.5, "n": 1})
    (tmp_path / "params.yaml").write_text("select: {}\n")
    proc = subprocess.run([sys.executable, "-m", "stages.eval_summary"], cwd=tmp_path, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "metrics" / "eval.json").read_text()) == {"base": {"gsm8k": {"n": 1, "pass@1": 0.5}}}
    assert (tmp_path / "eval" / "summary.csv").read_text().splitlines()[1] == "base,gsm8k,1,0.5"
