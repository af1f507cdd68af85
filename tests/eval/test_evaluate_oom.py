"""Out of memory in evaluate's generation (a real native engine over the tiny model, errors injected by
``GRPO_FAULT_OOM``): the records equal an unfaulted run's, sampled protocol included."""
from __future__ import annotations

from grpo.config import ProtocolParams
from grpo.eval.run import evaluate_rows
from grpo.model.loading import load_tokenizer
from grpo.prompts import PromptStyle
from grpo.rollout.engines import make_engine

SAMPLED = ProtocolParams(n=4, temperature=1.0, top_p=0.95, max_new_tokens=8)
QUESTIONS = ["Natalia sold 48 clips. How many?", "What is 15 + 27?", "What is 2 + 3?"]


def test_out_of_memory_in_generation_changes_no_record(tiny_model_dir, monkeypatch):
    rows = [{"id": f"q{i}", "question": q, "answer": "5", "answer_type": "integer"} for i, q in enumerate(QUESTIONS)]
    tokenizer = load_tokenizer(tiny_model_dir)

    def evaluate(faults: str) -> tuple[list[dict], int]:
        monkeypatch.setenv("GRPO_FAULT_OOM", faults)
        engine = make_engine("native", model_dir=tiny_model_dir, dtype="float32", batch_size=8)
        try:
            records, _, _ = evaluate_rows(engine, tokenizer, rows, SAMPLED, PromptStyle("tagged"), adapter_dir=None,
                                       seed=3)
        finally:
            engine.close()
        return records, engine.size.oom_events

    clean, no_events = evaluate("")
    faulted, events = evaluate("generate:0,generate:2")  # 8 rows -> 4 -> 2 in flight
    assert no_events == 0 and events == 2
    assert faulted == clean
    assert len({r["completion"] for r in clean}) > 1
