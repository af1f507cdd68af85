"""The report's sections as blocks (grpo.report.render), written to reports/report.md and report.html."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo.config import ProtocolParams
from grpo.data.registry import REGISTRY
from grpo.report import (LIFT, LIFT_N, LIFT_STDERR, MISSING, MODELS, PASS1, PASS1_STDERR, ReportInputs,
                         base_model_name, eval_benchmarks, eval_lift, eval_metric, fmt, fmt_param)
from grpo.report.figures import DIAGNOSTIC_PANELS, panel_columns
from grpo.report.gaming import gaming_evidence
from grpo.report.measured import MEASURED_REPORT
from grpo.report.render import Block, Bullets, Code, Heading, Image, Para, Table, to_html, to_markdown

SECTION_TITLES = ("Summary", "Evaluation", "Training", "Checkpoint selection", "Data lineage",
                  "Params that differ from the defaults", "Reproduce")


def pass1_cell(eval_data: dict | None, model: str, benchmark: str) -> str:
    value = eval_metric(eval_data, model, benchmark, PASS1)
    if value is None:
        return MISSING
    err = eval_metric(eval_data, model, benchmark, PASS1_STDERR)
    return f"{value:.3f}" if err is None else f"{value:.3f} ± {err:.3f}"


def eval_table(eval_data: dict | None) -> Table:
    """Benchmark × model, pass@1 ± standard error (shared with the model card)."""
    rows = []
    for bench in eval_benchmarks(eval_data):
        n = next((v for m in MODELS if (v := eval_metric(eval_data, m, bench, "num_questions")) is not None), None)
        rows.append([bench, fmt(n)] + [pass1_cell(eval_data, m, bench) for m in MODELS])
    return Table(["benchmark", "questions"] + [f"{m} pass@1" for m in MODELS], rows)


TRAINED = tuple(m for m in MODELS if m != "base")  # the models with a lift over the base
LIFT_NOTE = ("in points, the mean change in correctness on the same questions, ± its paired standard error (the "
             "standard error of the per-question differences), z = lift / SE, over n questions. A lift within about "
             "two paired standard errors (|z| < 2) is not evidence that training helped.")


def lift_cell(eval_data: dict | None, model: str, benchmark: str) -> str:
    """``model``'s lift over the base on ``benchmark`` in points, "+10.2 pts ± 3.5 (paired SE, z 2.9, n 256)";
    without the paired figures (a metrics/eval.json from before them) the plain difference of the pass@1."""
    lift = eval_lift(eval_data, model, benchmark)
    if lift is None:
        base, value = (eval_metric(eval_data, m, benchmark, PASS1) for m in ("base", model))
        return MISSING if base is None or value is None else f"{(value - base) * 100:+.1f} pts (no paired SE)"
    z = "" if lift.z is None else f", z {lift.z:.1f}"
    return f"{lift.lift * 100:+.1f} pts ± {lift.stderr * 100:.1f} (paired SE{z}, n {fmt(lift.n)})"


def lift_table(eval_data: dict | None) -> Table | None:
    """Benchmark × trained model, the lift over the base (shared with the model card); None when no
    benchmark has both the base and a trained model."""
    rows = [[bench] + [lift_cell(eval_data, m, bench) for m in TRAINED] for bench in eval_benchmarks(eval_data)]
    rows = [row for row in rows if any(cell != MISSING for cell in row[1:])]
    return Table(["benchmark"] + [f"{m} − base" for m in TRAINED], rows) if rows else None


_METRIC_TAIL = ("answer_rate", "truncation_rate", "mean_length", "n")


def _metric_order(key: str) -> tuple[int, int, str]:
    """pass@k by k, then maj@k by k, then the rest in the order a reader scans them."""
    head, _, k = key.partition("@")
    if k.isdigit():
        return (0 if head == "pass" else 1), int(k), key
    return 2 + (_METRIC_TAIL.index(key) if key in _METRIC_TAIL else len(_METRIC_TAIL)), 0, key


def _other_metrics_table(eval_data: dict | None) -> Table | None:
    skip = {PASS1, PASS1_STDERR, "num_questions", LIFT, LIFT_STDERR, LIFT_N}
    keys: dict[str, None] = {}
    for model in MODELS:
        for metrics in ((eval_data or {}).get(model) or {}).values():
            keys.update(dict.fromkeys(k for k, v in (metrics or {}).items()
                                      if k not in skip and isinstance(v, (int, float))))
    if not keys:
        return None
    keys = dict.fromkeys(sorted(keys, key=_metric_order))
    rows = [[bench, model] + [fmt(eval_metric(eval_data, model, bench, k)) for k in keys]
            for bench in eval_benchmarks(eval_data) for model in MODELS]
    return Table(["benchmark", "model"] + list(keys), rows)


def _kv_table(pairs: dict[str, Any], header: tuple[str, str] = ("key", "value")) -> Table:
    return Table(list(header), [[str(k), fmt(v) if isinstance(v, (int, float)) else fmt_param(v)]
                                for k, v in pairs.items()])


# --- the report ---------------------------------------------------------------------------------

def _summary(inp: ReportInputs) -> list[Block]:
    t, prep = inp.params["train"], inp.params["prepare"]
    steps = (inp.train or {}).get("steps", t.max_steps)
    n_params = (inp.model_info or {}).get("parameters")
    size = f" ({n_params / 1e6:.1f}M parameters)" if n_params else ""
    text = (f"**{base_model_name(inp.model_info)}**{size} fine-tuned with GRPO (loss `{t.loss_type}`, "
            f"{t.group_size} samples per prompt, {t.prompts_per_step} prompts per step, {steps} steps) and "
            f"LoRA r{t.lora.r} on {', '.join(prep.train_sources)}, with `{t.quantization}` base weights.")
    sel = inp.selection or {}
    if "step" in sel:
        text += (f" The selected checkpoint is step {sel['step']} ({sel.get('metric', 'accuracy')} "
                 f"{fmt(sel.get('value'))} on the validation split).")
    blocks: list[Block] = [Heading(2, "Summary"), Para(text)]
    gaming = gaming_evidence(inp.steps, inp.eval)
    if gaming:
        blocks += [Para("**Warning: this run games its rewards.** The format rewards rose while the model "
                        "stopped answering and correctness did not rise, so the reward measures the template, "
                        "not the answers (grpo/report/gaming.py):"), Bullets(gaming)]
    benches = eval_benchmarks(inp.eval)
    if not benches:
        return blocks + [Para("No evaluation results yet (metrics/eval.json is missing).")]
    rows = []
    for bench in benches:
        scores = (eval_metric(inp.eval, m, bench, PASS1) for m in MODELS)
        rows.append([bench] + [MISSING if v is None else f"{v:.3f}" for v in scores]
                    + [lift_cell(inp.eval, m, bench) for m in TRAINED])
    return blocks + [Para(f"pass@1 (standard errors in the Evaluation section) and each trained model's lift over "
                          f"the base: {LIFT_NOTE}"),
                     Table(["benchmark"] + list(MODELS) + [f"{m} − base" for m in TRAINED], rows)]


def _evaluation(inp: ReportInputs, figures: dict[str, Path | None]) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Evaluation")]
    if not inp.eval:
        return blocks + [Para("metrics/eval.json is missing: the evaluate stage has not run.")]
    blocks += [Para("pass@1 ± one standard error of the mean over questions, per benchmark and model "
                    "(`base`: no adapter; `final`: the last training step; `best`: the selected checkpoint)."),
               eval_table(inp.eval)]
    if figures.get("benchmarks"):
        blocks.append(Image("figures/benchmarks.png", "pass@1 per benchmark with ± 1 standard error"))
    # a benchmark without its own evaluate.benchmarks entry runs ProtocolParams' defaults (grpo/eval/run.py)
    protocols = {b: inp.params["evaluate"].benchmarks.get(b, ProtocolParams()) for b in eval_benchmarks(inp.eval)}
    header = ["benchmark", "samples (n)", "temperature", "top_p", "max new tokens"]
    blocks += [Heading(3, "Protocols"), Table(header, [
        [b, fmt(p.n), fmt(p.temperature), fmt(p.top_p), fmt(p.max_new_tokens)] for b, p in protocols.items()])]
    other = _other_metrics_table(inp.eval)
    if other:
        blocks += [Heading(3, "Other metrics"), other]
    return blocks


_FIGURES = {  # name → (caption, the training-log metric whose absence explains a skipped figure)
    "reward": ("Total reward and reward per function; dotted lines mark curriculum stage changes", "reward"),
    "accuracy": ("Fraction of training rollouts the verifier marks correct", "accuracy"),
    "length": ("Response length in tokens and the fraction truncated at the limit", "completions/mean_length"),
    "entropy": ("Mean policy token entropy over response tokens", "entropy"),
    "diagnostics": ("Optimisation diagnostics", "grad_norm"),
}
TRAIN_LOG = "metrics/train/plots/metrics"  # grpo/trainlog.py


def _training(inp: ReportInputs, figures: dict[str, Path | None]) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Training")]
    tr = inp.train or {}
    if tr:
        blocks.append(Para(
            f"{fmt(tr.get('steps'))} steps. Mean reward over the first five steps {fmt(tr.get('reward_mean_first5'))}, "
            f"over the last five {fmt(tr.get('reward_mean_last5'))}."))
    skipped = []
    for name, (caption, column) in _FIGURES.items():
        if figures.get(name):
            if name == "diagnostics":
                missing = [t for t, cols in DIAGNOSTIC_PANELS.items() if not panel_columns(inp.steps, cols)]
                caption += f" (not logged: {', '.join(missing)})" if missing else ""
            blocks.append(Image(f"figures/{name}.png", caption))
        else:
            why = f"{TRAIN_LOG} is missing" if inp.steps is None else f"the training log has no `{column}`"
            skipped.append(f"{name}: {why}")
    if skipped:
        blocks += [Para("Figures not drawn:"), Bullets(skipped)]

    blocks.append(Heading(3, "Curriculum"))
    if inp.sent:
        unused = "" if inp.params["train"].curriculum.use_sent else (
            " Training did not use this order (`train.curriculum.use_sent: false`).")
        blocks += [Para(f"SENT scoring of the training questions with the base model (metrics/sent.json).{unused}"),
                   _kv_table({k: v for k, v in inp.sent.items() if k != "enabled"}, ("metric", "value"))]
    else:
        blocks.append(Para("SENT did not run (`sent.enabled: false`, or metrics/sent.json is missing): questions "
                           "were drawn in a seeded random order, in one stage."))
    if figures.get("sent"):
        blocks.append(Image("figures/sent.png", "Semantic entropy and base-model pass rate of the training questions"))
    transitions = tr.get("curriculum_transitions") or []
    if transitions:
        # stored 0-based (the schedule's step index and stage); shown 1-based, as the train log counts
        blocks += [Para("Curriculum stage transitions:"), Table(["first step", "from stage", "to stage", "reason"], [
            [fmt(t["step"] + 1), fmt(t["from"] + 1), fmt(t["to"] + 1), str(t.get("reason", MISSING))]
            for t in transitions])]
    else:
        blocks.append(Para("No curriculum stage transitions."))
    by_stage = tr.get("frac_reward_zero_std_by_stage") or {}
    if by_stage:
        blocks += [Para(f"Groups whose rewards were all equal (no gradient), `frac_reward_zero_std`, per stage "
                        f"(`sent.order: {inp.params['sent'].order}`):"),
                   Table(["stage", "mean frac_reward_zero_std"],
                         [[str(int(k) + 1), fmt(v)] for k, v in by_stage.items()])]

    blocks.append(Heading(3, "Out-of-memory events"))
    phases = {}
    if inp.steps is not None:
        last = inp.steps.iloc[-1]
        phases = {c.split("/", 1)[1]: (last[c], last.get(f"micro_batch/{c.split('/', 1)[1]}"))
                  for c in inp.steps.columns if c.startswith("oom_events/")}
    total = tr.get("oom_events_total")
    blocks.append(Para(f"Out-of-memory errors recovered by halving the micro-batch and retrying: "
                       f"{MISSING if total is None else int(total)}."))
    if phases:
        blocks.append(Table(["phase", "OOM events", "micro-batch size at the end"],
                            [[p, str(int(n)), fmt(size)] for p, (n, size) in phases.items()]))
    return blocks


def _selection(inp: ReportInputs, figures: dict[str, Path | None]) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Checkpoint selection")]
    figure = Image("figures/validation.png", "Validation accuracy per evaluated step; the star marks the selection")
    sel = inp.selection
    if not sel:
        return blocks + [Para("models/best/SELECTION.json is missing: the select stage has not run.")] + (
            [figure] if figures.get("validation") else [])
    blocks.append(Para(
        f"Rule: the checkpoint with the **{sel.get('mode', 'max')}** `{sel.get('metric', 'accuracy')}` in the "
        f"validation log ({TRAIN_LOG}/eval/), ties broken by the **{sel.get('tie', 'earliest')}** step. "
        "The benchmarks are never consulted, so their numbers stay a held-out test. "
        f"Chosen: **step {sel.get('step', MISSING)}** (`{sel.get('checkpoint', MISSING)}`, "
        f"{sel.get('metric', 'accuracy')} {fmt(sel.get('value'))})."))
    if figures.get("validation"):
        blocks.append(figure)
    candidates = sel.get("candidates") or []
    if candidates:
        metric = sel.get("metric", "value")
        rows = [["✓" if c.get("checkpoint") == sel.get("checkpoint") else "", fmt(c.get("step")),
                 f"`{c.get('checkpoint', MISSING)}`", fmt(c.get("value")), "yes" if c.get("available") else "no",
                 c.get("problem") or ""] for c in candidates]
        blocks.append(Table(["chosen", "step", "checkpoint", metric, "available", "problem"], rows))
    return blocks


def _datasets_table(inp: ReportInputs) -> Table:
    prep = inp.params["prepare"]
    roles = {name: "train" for name in prep.train_sources}
    for name in prep.benchmarks:
        roles[name] = "train + benchmark" if name in roles else "benchmark"
    rows = []
    for name, role in roles.items():
        spec, bundled = REGISTRY.get(name), inp.datasets.get(name)
        rows.append([name, role, f"`{spec.hub_id}`" if spec else MISSING,
                     bundled.license if bundled else (spec.license if spec else MISSING),
                     bundled.origin if bundled else "not bundled (hub only)"])
    return Table(["dataset", "role", "hub id", "license", "bundled copy from"], rows)


def _prepare_blocks(prep: dict) -> list[Block]:
    """metrics/prepare.json (grpo/data/prepare.py): per-source counts, benchmark sizes, dropped rows."""
    by_train, by_val = (prep.get(k, {}).get("by_source", {}) for k in ("train", "val"))
    sources = [[name, fmt(s.get("read")), fmt(s.get("unparsable")), fmt(s.get("duplicates")),
                fmt(s.get("overlap_eval")), fmt(s.get("usable")), fmt(by_train.get(name, 0)), fmt(by_val.get(name, 0))]
               for name, s in prep.get("sources", {}).items()]
    benches = [[name, fmt(e.get("available")), fmt(e.get("unparsable")), fmt(e.get("rows"))]
               for name, e in prep.get("eval", {}).items()]
    dropped = prep.get("dropped", {})
    overlap = ", ".join(f"{b} {fmt(n)}" for b, n in dropped.get("overlap_eval_by_benchmark", {}).items() if n)
    return [
        Heading(3, "Row counts"),
        Table(["training source", "read", "unparsable", "duplicates", "benchmark overlap", "usable", "train", "val"],
              sources),
        Para(f"Training rows {fmt(prep.get('train', {}).get('rows'))}, validation rows "
             f"{fmt(prep.get('val', {}).get('rows'))}. Dropped from the training sources:"),
        Bullets([f"unparsable gold answers: {fmt(dropped.get('unparsable'))}",
                 f"repeated questions: {fmt(dropped.get('duplicates'))}",
                 f"questions that appear in a benchmark: {fmt(dropped.get('overlap_eval'))}"
                 + (f" ({overlap})" if overlap else ""),
                 f"over the caps: {fmt(dropped.get('cap_train'))} train, {fmt(dropped.get('cap_val'))} validation"]),
    ] + ([Table(["benchmark", "available", "unparsable", "evaluated"], benches)] if benches else [])


def _lineage(inp: ReportInputs) -> list[Block]:
    blocks: list[Block] = [
        Heading(2, "Data lineage"), Heading(3, "Datasets"),
        Para(f"Loaded with `prepare.source: {inp.params['prepare'].source}` (`auto`: the bundled copy when the "
             "project has one, else the hub). Bundled files are byte-identical copies; data/bundled/README.md "
             "and each SOURCE.md give commits and sha256 sums."),
        _datasets_table(inp)]
    if inp.prepare:
        blocks += _prepare_blocks(inp.prepare)
    else:
        blocks.append(Para("metrics/prepare.json is missing: the prepare stage has not run."))
    blocks.append(Heading(3, "Base model"))
    info = inp.model_info
    if not info:
        return blocks + [Para("models/base/MODEL_INFO.json is missing: the base_model stage has not run.")]
    keys = ("source", "source_kind", "architecture", "parameters", "dtype", "vocab_size", "chat_template")
    pairs = {k: info[k] for k in keys if k in info}
    pairs.update({f"source_detail.{k}": v for k, v in (info.get("source_detail") or {}).items()})
    return blocks + [_kv_table(pairs)]


def _params(inp: ReportInputs) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Params that differ from the defaults")]
    if not inp.changes:
        return blocks + [Para("None: params.yaml uses the defaults of grpo/config.py everywhere.")]
    return blocks + [Para("Defaults are the dataclasses in grpo/config.py; `(unset)` marks a mapping entry "
                          "that only one side has."),
                     Table(["key", "default", "value"],
                           [[f"`{c.key}`", fmt_param(c.default), fmt_param(c.value)] for c in inp.changes])]


def _reproduce(inp: ReportInputs) -> list[Block]:
    t = inp.params["train"]
    commands = f"""\
make repro                # first time: install into .venv, then dvc repro
dvc pull                  # optional: fetch a teammate's cached artifacts from the remote
dvc repro                 # rebuild everything whose inputs changed; the rest is skipped
dvc metrics show          # this run's metrics
dvc metrics diff          # metrics of the workspace vs HEAD
dvc params diff           # params of the workspace vs HEAD
dvc exp run -S train.lr={t.lr / 2:g} -S train.max_steps={2 * t.max_steps}   # an experiment with changed params
dvc exp show              # compare experiments
"""
    return [Heading(2, "Reproduce"), Para("From the project root, with the environment active:"),
            Code(commands, "bash")]


WALL_CLOCK_NOTE = (  # the one place the report mentions the measured figures (grpo/report/measured.py)
    "The wall-clock figures of the machine that ran the stages (timings, tokens/s) are not in this report but "
    f"in the untracked `{MEASURED_REPORT.as_posix()}`: they differ between runs and machines, and this report "
    "is reproducible (the same tracked inputs give the same bytes).")


def report_blocks(inp: ReportInputs, figures: dict[str, Path | None]) -> list[Block]:
    """The whole report, in order; section headings are ``SECTION_TITLES``."""
    return ([Heading(1, "GRPO fine-tuning report"), Para(WALL_CLOCK_NOTE)]
            + _summary(inp) + _evaluation(inp, figures) + _training(inp, figures) + _selection(inp, figures)
            + _lineage(inp) + _params(inp) + _reproduce(inp))


def write_report(inp: ReportInputs, figures: dict[str, Path | None], out_dir: Path) -> tuple[Path, Path]:
    """Write report.md and report.html into ``out_dir`` (figures are already under out_dir/figures)."""
    blocks = report_blocks(inp, figures)
    md, page = out_dir / "report.md", out_dir / "report.html"
    md.write_text(to_markdown(blocks), encoding="utf-8")
    page.write_text(to_html(blocks, out_dir, "GRPO fine-tuning report"), encoding="utf-8")
    return md, page
