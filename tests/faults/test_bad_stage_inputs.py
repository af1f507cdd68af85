"""Bad inputs through the stage entry points, as DVC runs them: each stops with exit code 2 and one
clear line naming the key, file or row, and leaves no output behind (or, for a few unparsable gold
answers, a counted skip in the metrics). The library-level checks behind these live in tests/data,
tests/model and tests/test_config.py; here the whole stage is run (in-process, through runpy)."""
from __future__ import annotations

import json
import runpy
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file, save_file

from grpo.io import write_jsonl

PREPARE = {"source": "bundled", "train_sources": ["gsm8k"], "benchmarks": [], "val_fraction": 0.25,
           "max_unparsable_fraction": 0.0}


def run_stage(project: Path, stage: str, params: dict, monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """(exit code, stderr) of ``python -m stages.<stage> --params params.yaml args`` run in ``project``."""
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "argv", [f"stages/{stage}.py", "--params", "params.yaml", *args])
    try:
        runpy.run_module(f"stages.{stage}", run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def gsm8k_lines(n: int) -> list[bytes]:
    return [json.dumps({"question": f"Question {i}?", "answer": f"Work.\n#### {i}"}).encode() for i in range(n)]


def write_bundled(project: Path, rel: str, lines: list[bytes]) -> Path:
    path = project / "data/bundled" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def no_outputs(project: Path, *outs: str) -> bool:
    hidden = [p for p in project.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]
    return not hidden and not any((project / out).exists() for out in outs)


def _missing_field(lines):
    return lines[:1] + [json.dumps({"question": "No answer here?"}).encode()] + lines[2:]


def _bad_utf8(lines):
    return lines[:2] + [b'{"question": "caf\xe9", "answer": "#### 1"}'] + lines[3:]


def _unparsable(lines):
    return lines[:3] + [json.dumps({"question": "Q?", "answer": "no marker"}).encode()] + lines[4:]


@pytest.mark.parametrize(("damage", "message"), [
    (_missing_field, "data/bundled/gsm8k/train.jsonl: line 2: missing field 'answer'"),
    (lambda lines: [], "data/bundled/gsm8k/train.jsonl: empty file"),
    (_bad_utf8, "data/bundled/gsm8k/train.jsonl: line 3: invalid UTF-8"),
    (lambda lines: lines[:4] + [b'{"question": '] + lines[5:], "data/bundled/gsm8k/train.jsonl: line 5: invalid JSON"),
    (_unparsable, "gsm8k (train): 1 of 8 gold answers do not parse (12.50%, more than max_unparsable_fraction "
                  "0.0); first at data/bundled/gsm8k/train.jsonl: line 4"),
], ids=["missing-field", "empty-file", "invalid-utf8", "invalid-json", "unparsable-over-threshold"])
def test_prepare_stops_on_a_bad_dataset_file(tmp_path, monkeypatch, capsys, damage, message):
    write_bundled(tmp_path, "gsm8k/train.jsonl", damage(gsm8k_lines(8)))
    code, err = run_stage(tmp_path, "prepare", {"prepare": PREPARE}, monkeypatch, capsys)
    assert code == 2 and "error: stage prepare failed" in err and message in err, err
    assert no_outputs(tmp_path, "data/prepared", "metrics/prepare.json")


def test_prepare_stops_on_duplicate_ids(tmp_path, monkeypatch, capsys):
    write_bundled(tmp_path, "gsm8k/train.jsonl", gsm8k_lines(8))
    row = {"problem": "Find x.", "answer": "2", "unique_id": "test/algebra/1.json"}
    write_bundled(tmp_path, "math500/test.jsonl", [json.dumps(row).encode(), json.dumps({**row, "problem": "y?"}).encode()])
    code, err = run_stage(tmp_path, "prepare", {"prepare": {**PREPARE, "benchmarks": ["math500"]}}, monkeypatch, capsys)
    assert code == 2 and "math500/test.jsonl: line 2: duplicate id 'math500-test/algebra/1.json'" in err, err
    assert no_outputs(tmp_path, "data/prepared", "metrics/prepare.json")


def test_prepare_counts_unparsable_gold_answers_under_the_threshold(tmp_path, monkeypatch, capsys):
    write_bundled(tmp_path, "gsm8k/train.jsonl", _unparsable(gsm8k_lines(8)))
    code, err = run_stage(tmp_path, "prepare", {"prepare": {**PREPARE, "max_unparsable_fraction": 0.2}},
                          monkeypatch, capsys)
    assert code == 0, err
    metrics = json.loads((tmp_path / "metrics/prepare.json").read_text())
    assert metrics["dropped"]["unparsable"] == 1 and metrics["sources"]["gsm8k"] == {
        "read": 8, "unparsable": 1, "duplicates": 0, "overlap_eval": 0, "usable": 7}


@pytest.mark.parametrize(("prepare", "message"), [
    ({"val_fraction": "a lot"}, "prepare.val_fraction: expected a number, got 'a lot'"),
    ({"max_unparsable_fraction": 1.5}, "prepare.max_unparsable_fraction: got 1.5; allowed: a number in [0, 1]"),
    ({"max_trian": 5}, "prepare.max_trian: unknown key; allowed keys: source"),
    ({"arith_levels": [1, 4]}, "prepare.arith_levels: got [1, 4]; allowed: values from 0, 1, 2, 3 (got 4)"),
], ids=["wrong-type", "out-of-range", "unknown-key", "unknown-arith-level"])
def test_prepare_stops_on_bad_params(tmp_path, monkeypatch, capsys, prepare, message):
    write_bundled(tmp_path, "gsm8k/train.jsonl", gsm8k_lines(8))
    code, err = run_stage(tmp_path, "prepare", {"prepare": {**PREPARE, **prepare}}, monkeypatch, capsys)
    assert code == 2 and message in err, err
    assert no_outputs(tmp_path, "data/prepared", "metrics/prepare.json")


@pytest.mark.parametrize(("remove", "message"), [
    (("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"),
     "is a folder without a tokenizer"),
    (("chat_template.jinja",), "has no chat template"),
], ids=["no-tokenizer", "no-chat-template"])
def test_base_model_stops_on_a_folder_without_tokenizer_or_chat_template(tmp_path, tiny_model_dir, monkeypatch,
                                                                          capsys, remove, message):
    folder = tmp_path / "my_model"
    shutil.copytree(tiny_model_dir, folder)
    for name in remove:
        (folder / name).unlink(missing_ok=True)
    config = folder / "tokenizer_config.json"
    if config.exists():  # older transformers keep the template inside tokenizer_config.json
        cfg = json.loads(config.read_text())
        cfg.pop("chat_template", None)
        config.write_text(json.dumps(cfg))
    code, err = run_stage(tmp_path, "base_model", {"model": {"source": str(folder)}}, monkeypatch, capsys)
    assert code == 2 and f"model.source={str(folder)!r}" in err and message in err, err
    assert no_outputs(tmp_path, "models/base")


@pytest.fixture
def eval_project(tmp_path, tiny_model_dir) -> Path:
    """models/base (the tiny model, MODEL_INFO source "tiny-base"), models/final from a short training
    run's adapter format, and a two-question benchmark."""
    shutil.copytree(tiny_model_dir, tmp_path / "models/base")
    (tmp_path / "models/base/MODEL_INFO.json").write_text(json.dumps({"source": "tiny-base"}))
    from grpo.model.adapter import LoraSettings, save_adapter
    from grpo.model.lora import inject_lora
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    inject_lora(model, targets=["q_proj", "v_proj"], r=4, alpha=8)
    save_adapter(model, tmp_path / "models/final", base_model_name_or_path="tiny-base",
                 lora_config=LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj")))
    write_jsonl(tmp_path / "data/prepared/eval/gsm8k.jsonl",
                [{"id": f"g{i}", "source": "gsm8k", "question": f"What is {i} + 1?", "answer": str(i + 1),
                  "answer_type": "integer", "meta": {}} for i in range(2)])
    return tmp_path


EVALUATE = {"evaluate": {"engine": "native", "benchmarks": {"gsm8k": {"max_new_tokens": 2}}}, "prompt": {}}


def _edit_adapter_config(folder: Path, **changes) -> None:
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _rank_8(folder: Path) -> None:
    _edit_adapter_config(folder, r=8, lora_alpha=16)


def _targets(folder: Path) -> None:
    _edit_adapter_config(folder, target_modules=["q_proj", "k_proj", "v_proj"])


def _truncated(folder: Path) -> None:
    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _other_shape(folder: Path) -> None:  # an adapter for a wider model: hidden size 256, not 128
    weights = folder / "adapter_model.safetensors"
    save_file({k: v.new_zeros(v.shape[0], 256) if "lora_A" in k else v for k, v in load_file(str(weights)).items()},
              str(weights))


@pytest.mark.parametrize(("damage", "message"), [
    (lambda f: _edit_adapter_config(f, base_model_name_or_path="Qwen/Qwen2.5-0.5B"),
     "base_model_name_or_path mismatch: the adapter was trained on 'Qwen/Qwen2.5-0.5B'"),
    (_rank_8, "adapter_model.safetensors: LoRA weight base_model.model.model.layers.0.self_attn.q_proj.lora_A"
              ".weight: shape (4, 128), the model needs (8, 128)"),
    (_targets, "adapter_model.safetensors: LoRA weights do not fit the model: 4 missing"),
    (_other_shape, "q_proj.lora_A.weight: shape (4, 256), the model needs (4, 128)"),
    (_truncated, "not a readable safetensors file (truncated or corrupt?)"),
], ids=["other-base", "other-rank", "other-targets", "other-shape", "truncated"])
def test_evaluate_stops_on_an_adapter_that_does_not_fit(eval_project, monkeypatch, capsys, damage, message):
    damage(eval_project / "models/final")
    code, err = run_stage(eval_project, "evaluate", EVALUATE, monkeypatch, capsys,
                          "--model", "final", "--benchmark", "gsm8k")
    assert code == 2 and "error: stage evaluate failed" in err and message in err, err
    assert "models/final" in err
    assert no_outputs(eval_project, "eval/final/gsm8k.jsonl", "metrics/eval/final/gsm8k.json")


def test_evaluate_runs_the_intact_adapter(eval_project, monkeypatch, capsys):
    """The control for the test above: the same project, adapter untouched, evaluates."""
    code, err = run_stage(eval_project, "evaluate", EVALUATE, monkeypatch, capsys,
                          "--model", "final", "--benchmark", "gsm8k")
    assert code == 0, err
    assert json.loads((eval_project / "metrics/eval/final/gsm8k.json").read_text())["num_questions"] == 2
