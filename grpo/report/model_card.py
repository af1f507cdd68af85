"""reports/MODEL_CARD.md: a Hugging Face model card for the selected adapter.

YAML front matter (the hub reads base_model, datasets, license, tags, pipeline_tag, library_name),
then model and training details, the evaluation table shared with the report, usage with PEFT and
with vLLM, and limitations. The adapter folders are PEFT-compatible, so the card's snippets load them
as they are.
"""
from __future__ import annotations

import json
from typing import Any

import yaml

from grpo.config import ProtocolParams
from grpo.data.registry import REGISTRY
from grpo.prompts import R1_INSTRUCTION, PromptStyle
from grpo.report import ReportInputs, base_model_name, eval_benchmarks, eval_lift, fmt, fmt_param
from grpo.report.markdown import LIFT_NOTE, eval_table, lift_table
from grpo.report.render import Block, Bullets, Code, Heading, Para, Table, to_markdown

TAGS = ["grpo", "lora", "reasoning", "dvc"]


def front_matter(inp: ReportInputs) -> dict[str, Any]:
    info = inp.model_info or {}
    detail = info.get("source_detail") or {}
    meta: dict[str, Any] = {}
    # a local folder has no hub id; the hub rejects a path as base_model, so leave the key out
    if info.get("source_kind") != "local" and info:
        meta["base_model"] = base_model_name(info)
    # hub ids of the training sources; bundled copies are byte-identical files of the same datasets
    meta["datasets"] = [REGISTRY[name].hub_id if name in REGISTRY else name
                        for name in inp.params["prepare"].train_sources]
    meta["library_name"] = "peft"
    meta["license"] = str(detail.get("license", "other")).lower()  # hub license ids are lower-case
    meta["pipeline_tag"] = "text-generation"
    meta["tags"] = list(TAGS)
    return meta


def _training_table(inp: ReportInputs) -> Table:
    t = inp.params["train"]
    steps = (inp.train or {}).get("steps", t.max_steps)
    rows = [
        ("algorithm", "GRPO (native loop: grouped rollouts, verifier rewards, clipped policy loss)"),
        ("loss type", t.loss_type),
        ("group size (samples per prompt)", t.group_size),
        ("prompts per step", t.prompts_per_step),
        ("optimizer steps", steps),
        ("learning rate", f"{fmt_param(t.lr)} ({t.lr_schedule}, {t.warmup_steps} warm-up steps)"),
        ("clip range", f"[1 − {fmt_param(t.epsilon_low)}, 1 + {fmt_param(t.epsilon_high)}]"),
        ("KL coefficient (beta)", fmt_param(t.beta)),
        ("max response tokens", t.max_response_length),
        ("sampling temperature", fmt_param(t.temperature)),
        ("LoRA", f"r {t.lora.r}, alpha {fmt_param(t.lora.alpha)}, dropout {fmt_param(t.lora.dropout)}"
                 f"{', rsLoRA' if t.lora.rslora else ''}; targets {', '.join(t.lora.targets)}"),
        ("base weights", f"{t.quantization} (compute dtype {t.compute_dtype})"),
        ("rewards (weight)", ", ".join(f"{name} ({fmt_param(w)})" for name, w in t.rewards.items())),
        ("curriculum", "SENT (semantic-entropy order, easy to hard)" if inp.sent and t.curriculum.use_sent
         else "none (seeded random order)"),
    ]
    return Table(["setting", "value"], [[k, fmt(v) if isinstance(v, int) else str(v)] for k, v in rows])


def _usage(inp: ReportInputs, base: str) -> list[Block]:
    pr, t = inp.params["prompt"], inp.params["train"]
    style = PromptStyle.from_params(pr)
    system = style.resolved_system_prompt
    py = json.dumps  # a JSON string literal is a valid Python one, with the snippet's double quotes
    system_msg = f'{{"role": "system", "content": {py(system)}}}, ' if system else ""
    user = f'question + "\\n" + {py(R1_INSTRUCTION)}' if style.style == "r1" else "question"
    rank = max(8, 1 << (t.lora.r - 1).bit_length())  # vLLM accepts power-of-two max_lora_rank values
    prompt = f"""\
messages = [{system_msg}{{"role": "user", "content": {user}}}]
prefill = {py(style.resolved_prefill)}  # the response starts with this; training conditioned on it
prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + prefill"""
    peft = f"""\
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

base, adapter = {py(base)}, "path/to/this/adapter"  # locally: models/best
tokenizer = AutoTokenizer.from_pretrained(base)
model = AutoModelForCausalLM.from_pretrained(base)
model = PeftModel.from_pretrained(model, adapter)

question = "A baker fills 7 trays with 12 muffins each and sells 60 muffins. How many muffins are left?"
{prompt}
inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
out = model.generate(**inputs, max_new_tokens={t.max_response_length}, do_sample=False)
print(prefill + tokenizer.decode(out[0, inputs.input_ids.shape[1]:], skip_special_tokens=True))"""
    vllm = f"""\
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest

llm = LLM(model={py(base)}, enable_lora=True, max_lora_rank={rank})
# `prompt` built as above (chat template + prefill)
outputs = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens={t.max_response_length}),
                       lora_request=LoRARequest("grpo", 1, "path/to/this/adapter"))
print(prefill + outputs[0].outputs[0].text)"""
    return [Heading(2, "Usage"),
            Para(f"The adapter is a PEFT LoRA folder for `{base}`. Prompts must use the base model's chat "
                 f"template and the training prompt style (`{style.style}`), including the response prefill."),
            Heading(3, "Transformers + PEFT"), Code(peft, "python"),
            Heading(3, "vLLM"), Code(vllm, "python")]


def _limitations(inp: ReportInputs) -> Bullets:
    prep, configured = inp.params["prepare"], inp.params["evaluate"].benchmarks
    protocols = {b: configured.get(b, ProtocolParams()) for b in prep.benchmarks}
    sampled = [b for b, p in protocols.items() if p.n > 1 or p.temperature > 0]
    protocol_note = (f"sampled (n > 1 or temperature > 0) on {', '.join(sampled)}, greedy on the rest" if sampled
                     else "greedy (one sample at temperature 0) on every benchmark")
    caps = ", ".join(f"{b} {prep.max_eval[b]}" for b in prep.benchmarks if b in prep.max_eval)
    n_params = (inp.model_info or {}).get("parameters")
    size = f"A {n_params / 1e6:,.0f}M-parameter model" if n_params else "A small model"
    steps = (inp.train or {}).get("steps", inp.params["train"].max_steps)
    return Bullets([
        f"{size} fine-tuned for {steps} steps with LoRA: expect gains mostly in answer format and on "
        "problems like the training data, not new general reasoning ability.",
        (f"Benchmarks are subsets: questions per benchmark were capped at {caps}. " if caps else "")
        + "Judge a difference from the base by the lift's paired standard error (the Evaluation section), not by "
        "the two scores' own: a lift within about two paired standard errors (|z| < 2) is not evidence of "
        "improvement." + _lift_verdict(inp.eval),
        f"Evaluation protocol: {protocol_note}. Greedy and sampled pass@1 are not comparable with each "
        "other or with numbers published under another protocol or prompt.",
        "Correctness is judged by an automatic answer verifier (math-verify plus numeric rules); "
        "answers it cannot parse count as wrong.",
        "Benchmark questions were removed from the training data, and the checkpoint was selected on a "
        "validation split, never on the benchmarks.",
    ])


def _lift_verdict(eval_data: dict | None, model: str = "best") -> str:
    """The benchmarks where this adapter's lift over the base is at least two paired standard errors
    (either sign) and where it is under two; a lift without a standard error is in neither."""
    beyond, within = [], []
    for bench in eval_benchmarks(eval_data):
        lift = eval_lift(eval_data, model, bench)
        if lift is not None and lift.z is not None:
            (beyond if abs(lift.z) >= 2 else within).append(f"{bench} (z {lift.z:.1f})")
    parts = [f"{label} on {', '.join(names)}" for label, names in (("|z| ≥ 2", beyond), ("|z| < 2", within)) if names]
    return f" This adapter (`{model}`): {'; '.join(parts)}." if parts else ""


def model_card(inp: ReportInputs) -> str:
    """The MODEL_CARD.md text: YAML front matter, then the card body."""
    info = inp.model_info or {}
    base = base_model_name(info)
    sel = inp.selection or {}
    lifts = lift_table(inp.eval)
    details = Table(["field", "value"], [
        ["base model", f"`{base}`" + (f" ({info['parameters'] / 1e6:.1f}M parameters)" if info.get("parameters")
                                      else "")],
        ["architecture", str(info.get("architecture", "—"))],
        ["adapter", "LoRA (PEFT format), selected checkpoint"
                    + (f": step {sel['step']} by validation {sel.get('metric', 'accuracy')}" if "step" in sel else "")],
        ["training data", ", ".join(inp.params["prepare"].train_sources)],
        ["language", "English"],
    ])
    blocks: list[Block] = [
        Heading(1, f"{base} + GRPO LoRA adapter (math reasoning)"),
        Para("A LoRA adapter trained with GRPO (group relative policy optimisation) against verifiable "
             "answer rewards, by a DVC pipeline: `dvc repro` rebuilds it and every number below."),
        Heading(2, "Model details"), details,
        Heading(2, "Training details"), _training_table(inp),
        Heading(2, "Evaluation"),
        Para("pass@1 ± one standard error; `base` is the model without the adapter, `final` the last "
             "training step, `best` the selected checkpoint (this adapter)."),
        eval_table(inp.eval),
        *([Para(f"Lift over the base: {LIFT_NOTE}"), lifts] if lifts else []),
        *_usage(inp, base),
        Heading(2, "Limitations"), _limitations(inp),
    ]
    head = yaml.safe_dump(front_matter(inp), sort_keys=False, allow_unicode=True)
    return f"---\n{head}---\n\n{to_markdown(blocks)}"
