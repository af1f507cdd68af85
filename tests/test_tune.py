"""grpo.tune on the tiny model, for real: every trial is the stage script run in its own process on the
project's model and data. An injected out-of-memory error (GRPO_FAULT_OOM, the same hook the fault suite
uses) in every training micro-batch of more than 2 rows stands in for a setting that does not fit."""
from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from grpo.tune import main as tune_main
from grpo.tuning.knobs import MIN_GAIN, faster, knob_values, leaner
from grpo.tuning.params_edit import update_params
from grpo.tuning.trial import run_seconds_a_step
from tests.pipeline.project import copy_project, edit_params, run, tiny_params


@pytest.fixture(scope="module")
def prepared_project(tmp_path_factory, tiny_model_dir) -> Path:
    """The project on the tiny model with models/base and data/prepared built (what the tuner needs)."""
    project = copy_project(tmp_path_factory.mktemp("tune") / "project")
    tiny_params(project, tiny_model_dir, ["gsm8k"])
    edit_params(project, prepare={"benchmarks": ["gsm8k"]},
                train={"generation_batch_size": 4, "train_batch_size": 2},
                evaluate={"batch_size": 2, "dtype": "float32"})
    run("python -m stages.base_model && python -m stages.prepare", project)
    return project


def test_tune_measures_skips_an_oom_trial_caches_and_writes(prepared_project):
    params = prepared_project / "params.yaml"
    before = params.read_text()
    out = run("python -m grpo.tune --budget-gib 8 --stages train,evaluate --steps 1 --write", prepared_project,
              GRPO_FAULT_OOM="train:size>2").stdout
    cache = next((prepared_project / "logs" / "tune").glob("*gib.json"))
    trials = list(json.loads(cache.read_text()).items())
    by_settings = {(json.loads(k)[0], json.dumps(json.loads(k)[2], sort_keys=True)): v for k, v in trials}
    # the injected OOM: micro-batches of 4 rows fail, and that trial is recorded, not fatal
    ooms = [json.loads(k)[2] for k, v in trials if v["status"] == "oom"]
    assert ooms and all(s["train.train_batch_size"] == 4 for s in ooms)
    # each trial's output is kept beside the cache: the OOM trial's log holds the absorbed error
    logs = {log.name: log.read_text() for log in cache.with_suffix("").glob("*.log")}
    oom_logs = [text for name, text in logs.items() if "train-batch-size-4" in name]
    assert oom_logs and all("OOM in train" in text for text in oom_logs)
    assert all(v["status"] == "ok" for k, v in trials if json.loads(k)[2].get("train.train_batch_size", 0) <= 2)
    # every measured trial has its speed: seconds a step for train, tokens/s for evaluate
    assert all(v["speed"] > 0 for v in by_settings.values() if v["status"] == "ok")
    assert "winner:" in out and "train:" in out and "evaluate:" in out
    # --write put the winner in params.yaml: a clean trial, never slower than the shipped settings
    written = yaml.safe_load(params.read_text())
    shipped_params = yaml.safe_load(before)
    train_keys = list(json.loads(next(k for k, _ in trials if json.loads(k)[0] == "train"))[2])

    def settings_of(raw: dict) -> str:
        return json.dumps({k: raw[k.split(".")[0]][k.split(".")[1]] for k in train_keys}, sort_keys=True)

    def ranked(entry: dict) -> float:  # what the search compares: the warm-up spread over the run's steps
        f = entry["figures"]
        return run_seconds_a_step(f["warm_up_s"], f["steady_s"], shipped_params["train"]["max_steps"])

    winner, shipped = by_settings[("train", settings_of(written))], by_settings[("train", settings_of(shipped_params))]
    # (the steady step alone may be slower: a winner with a cheaper first step wins a short run)
    assert winner["status"] == "ok" and ranked(winner) <= ranked(shipped)
    assert written["train"]["train_batch_size"] <= 2  # never the setting that ran out of memory
    # the winners file beside the cache holds exactly what --write changed
    winners = json.loads(cache.with_suffix(".winners.json").read_text())
    changed = {f"{section}.{key}": value for section in ("train", "evaluate") for key, value in written[section].items()
               if shipped_params[section].get(key) != value}
    assert winners == changed
    # comments survive the edit
    assert [line for line in before.splitlines() if "#" in line][:5] == \
        [line for line in params.read_text().splitlines() if "#" in line][:5]
    # a rerun measures nothing: every trial comes from the cache
    params.write_text(before)
    rerun = run("python -m grpo.tune --budget-gib 8 --stages train,evaluate --steps 1", prepared_project).stdout
    assert "(measured)" not in rerun and "(cached)" in rerun


def test_a_cached_trial_is_reused_only_for_the_same_inputs(tmp_path):
    """trial_inputs: the knobs' own values are the trial's settings, not its inputs (so a rerun after
    --write hits the cache); another stage's section is no input; the stage's other params, the model
    and the code are."""
    from grpo.tune import code_fingerprint, trial_inputs

    raw = {"model": {"source": "m"}, "prompt": {"style": "r1"},
           "train": {"lr": 1e-5, "train_batch_size": 4}, "evaluate": {"batch_size": 8}}
    settings = {"train.train_batch_size": 2}
    base = trial_inputs(raw, "train", settings, "code")

    def changed(section: str, key: str, value, code: str = "code") -> str:
        return trial_inputs({**raw, section: {**raw[section], key: value}}, "train", settings, code)

    assert changed("train", "train_batch_size", 2) == base  # written back by --write: still cached
    assert changed("evaluate", "batch_size", 16) == base
    assert changed("train", "lr", 1e-4) != base and changed("model", "source", "other") != base
    assert changed("train", "lr", 1e-5, code="new code") != base
    (tmp_path / "grpo").mkdir()
    source = tmp_path / "grpo" / "step.py"
    source.write_text("x = 1\n")
    before = code_fingerprint(tmp_path)
    code_fingerprint.cache_clear()
    source.write_text("x = 2\n")
    assert code_fingerprint(tmp_path) != before


def test_tune_rejects_an_unknown_stage(prepared_project, capsys):
    assert tune_main(["--params", str(prepared_project / "params.yaml"), "--stages", "trian"]) == 2
    assert "--stages: unknown stage 'trian'" in capsys.readouterr().err


def test_knob_candidates_hold_the_current_value_and_stay_within_a_step():
    raw = {"train": {"prompts_per_step": 4, "group_size": 4, "generation_batch_size": 8, "train_batch_size": 16,
                     "quantization": "nf4", "compute_dtype": "float32", "logprob_chunk_size": 1024}}
    knobs = knob_values("train", raw, gpu=False)
    assert knobs["train.generation_batch_size"] == [4, 8, 16]  # half, same, double = the whole step
    assert knobs["train.train_batch_size"] == [8, 16]  # double would exceed the step's 16 sequences
    assert knobs["train.compute_dtype"] == ["float32", "bfloat16"]
    assert "train.generation_merge_lora" not in knobs and "train.generation_merge_lora" in knob_values("train", raw, True)
    assert knobs["train.compile_layers"] == [False, True]


def test_leaner_values_are_the_ones_that_only_save_memory():
    assert leaner("train.train_batch_size", 8, 16) and not leaner("train.train_batch_size", 32, 16)
    assert leaner("train.gradient_checkpointing", True, False) and not leaner("train.gradient_checkpointing", False, True)
    assert leaner("train.dense_training", False, True) and not leaner("train.dense_training", True, False)
    assert not leaner("train.generation_merge_lora", False, True)  # neither way only saves memory
    assert not leaner("train.compile_layers", False, True)
    # faster at 16 sequences a call, slower at 64 (H100): measured either way, not only once the copy fails
    assert not leaner("train.generation_mlp_4bit", True, False) and not leaner("train.generation_mlp_4bit", False, True)


def test_on_a_gpu_the_search_measures_a_leaner_value_only_after_the_current_one_fails(prepared_project, monkeypatch,
                                                                                        tmp_path):
    """The search's order on a GPU, with the trial runner replaced by a table of outcomes (a mock: the
    GPU's trials cannot run here; the CPU's real trials are the first test's). Micro-batches above 2 run
    out of memory: the shipped 2 runs, so 1 is skipped unmeasured; with 4 shipped, the failure sends the
    search down to 2."""
    import grpo.tune as tune
    from grpo.tuning.trial import Outcome, Workload

    measured: list[dict] = []

    def fake_trial(project, scratch, raw, stage, settings, **kwargs) -> Outcome:
        measured.append(settings)
        size = settings["train.train_batch_size"]
        return Outcome("oom", 9.0) if size > 2 else Outcome("ok", 5.0 + size)

    monkeypatch.setattr(tune, "run_trial", fake_trial)
    raw = yaml.safe_load((prepared_project / "params.yaml").read_text())

    def search(train_batch_size: int) -> tuple[dict, list[dict]]:
        measured.clear()
        project = tmp_path / f"shipped-{train_batch_size}"
        project.mkdir()
        edited = {**raw, "train": {**raw["train"], "train_batch_size": train_batch_size}}
        (project / "params.yaml").write_text(yaml.safe_dump(edited, sort_keys=False))
        tuner = tune.Tuner(project, edited, 64 * 2**30, True, project / "cache.json", workload=Workload(1),
                           trial_s=60, prompt_tokens=64)
        best, _, _ = tuner.search("train")
        return best, tuner.rows

    best, rows = search(2)
    sizes = [s["train.train_batch_size"] for s in measured]
    assert 1 not in sizes and best["train.train_batch_size"] == 2
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert [r["settings"]["train.train_batch_size"] for r in skipped if r["settings"]["train.train_batch_size"] != 2] == [1]
    best, rows = search(4)
    assert 2 in [s["train.train_batch_size"] for s in measured] and best["train.train_batch_size"] == 2


def test_a_shipped_compile_is_paid_by_two_trials_and_a_change_must_beat_the_shipped_settings(prepared_project,
                                                                                              monkeypatch, tmp_path):
    """Shipped with compiled layers, the search measures the other knobs eager and compiles again only for
    the last knob (mocked trial runner, as above: the figures are a table, the order is the search's). A
    compile that wins keeps its place; an eager setting that ties the shipped compile leaves params alone."""
    import grpo.tune as tune
    from grpo.tuning.trial import Outcome, Workload

    measured: list[dict] = []
    raw = yaml.safe_load((prepared_project / "params.yaml").read_text())
    raw = {**raw, "train": {**raw["train"], "compile_layers": True}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))

    def search(compiled_s: float) -> tuple[dict, dict]:
        def fake_trial(project, scratch, raw, stage, settings, **kwargs) -> Outcome:
            measured.append(settings)
            return Outcome("ok", compiled_s if settings["train.compile_layers"] else 5.0)

        monkeypatch.setattr(tune, "run_trial", fake_trial)
        measured.clear()
        (tmp_path / "cache.json").unlink(missing_ok=True)
        tuner = tune.Tuner(tmp_path, raw, 64 * 2**30, False, tmp_path / "cache.json", workload=Workload(1),
                           trial_s=60, prompt_tokens=64)
        best, _, _ = tuner.search("train")
        return best, tuner.rows

    best, rows = search(compiled_s=4.0)  # 20% faster compiled: the shipped compile stays
    compiled = [s for s in measured if s["train.compile_layers"]]
    assert len(compiled) == 1 and len(measured) > 3  # the shipped trial; the last knob's is the shipped one's
    assert best["train.compile_layers"] is True
    assert [r["settings"]["train.compile_layers"] for r in rows].count(True) == 1  # and the table lists it once
    best, _ = search(compiled_s=5.2)  # eager 4% faster: within the margin, so the shipped settings stay
    assert best["train.compile_layers"] is True
    best, _ = search(compiled_s=6.0)  # eager 17% faster: it wins
    assert best["train.compile_layers"] is False


def test_a_pruned_setting_is_measured_again_at_the_micro_batch_that_fits(prepared_project, monkeypatch, tmp_path):
    """A dense training copy does not fit the budget at the shipped micro-batch of 2 but does at 1: the
    search plans it again with the training phase's batch cut to what fits and measures that (mocked trial
    runner, as above: the figures are a table, the plan is the real one); a larger micro-batch, the knob
    that overflows, is not cut back to itself."""
    import grpo.tune as tune
    from grpo.tuning.trial import Outcome, Workload

    measured: list[dict] = []

    def fake_trial(project, scratch, raw, stage, settings, **kwargs) -> Outcome:
        measured.append(settings)
        return Outcome("ok", 4.0 if settings["train.dense_training"] else 5.0)

    monkeypatch.setattr(tune, "run_trial", fake_trial)
    raw = yaml.safe_load((prepared_project / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))

    def tuner(budget: int) -> tune.Tuner:
        return tune.Tuner(tmp_path, raw, budget, True, tmp_path / f"cache-{budget}.json", workload=Workload(1),
                          trial_s=60, prompt_tokens=64)

    probe = tuner(64 * 2**30)
    shipped = probe.planned_peak("train", None, {})
    assert probe.params["train"].train_batch_size == 2 and not probe.params["train"].dense_training
    dense_at = {size: probe.planned_peak("train", None, {"train.dense_training": True, "train.train_batch_size": size})
                for size in (1, 2)}
    assert dense_at[1] < shipped < dense_at[2]  # the copy costs more than halving the micro-batch saves
    budget = int((shipped + dense_at[2]) / 2 * 2**30)
    search = tuner(budget)
    best, outcome, _ = search.search("train")
    assert {"train.dense_training": True, "train.train_batch_size": 1}.items() <= best.items() and outcome.speed == 4.0
    rows = [(r["settings"]["train.dense_training"], r["settings"]["train.train_batch_size"], r["status"])
            for r in search.rows if r["settings"]["train.dense_training"]]
    assert rows[:2] == [(True, 2, "pruned"), (True, 1, "ok")]
    assert all(s["train.train_batch_size"] <= 2 for s in measured)  # micro-batch 4 was pruned, never cut to 2 and run
    assert any(r["settings"]["train.train_batch_size"] == 4 and r["status"] == "pruned" for r in search.rows)
    assert search.shrunk_to_fit("train", None, {**best, "train.train_batch_size": 4}, "train.train_batch_size") is None


def test_the_tuners_plan_uses_the_longest_prompt_of_the_users_data(prepared_project):
    """Without --prompt-tokens the plan prunes with the prompts in data/prepared: each stage's own longest
    (validation's questions count for train), a plan that grows with the prompt it is given."""
    import grpo.tune as tune
    from grpo.stage_plans import data_prompt_tokens
    from grpo.tuning.trial import Workload

    raw = yaml.safe_load((prepared_project / "params.yaml").read_text())
    by = data_prompt_tokens(prepared_project, raw)
    assert set(by) == {"sent", "train", *raw["prepare"]["benchmarks"]}
    assert 0 < by["sent"] <= by["train"] and all(v > 0 for v in by.values())

    def plan(prompt_tokens: int | None) -> float:
        tuner = tune.Tuner(prepared_project, raw, 8 * 2**30, True, prepared_project / "unused.json",
                           workload=Workload(1), trial_s=60, prompt_tokens=prompt_tokens)
        return tuner.planned_peak("train", None, {})

    assert plan(None) == plan(by["train"]) < plan(4 * by["train"])
    empty = prepared_project.parent / "no-data"
    empty.mkdir(exist_ok=True)
    with pytest.raises(FileNotFoundError, match="dvc repro prepare base_model"):
        data_prompt_tokens(empty, raw)


def test_a_trial_spreads_the_first_steps_one_off_cost_over_the_users_run():
    """A setting that compiles for 25 s to make a 5 s step take 4 s: its warm-up step takes 29 s. By hand,
    over 500 steps (29 + 499 * 4) / 500 = 4.05 s a step against the eager 5.0, so it wins; over 8 steps
    (29 + 7 * 4) / 8 = 7.125 s against 5.0, so it loses."""
    assert run_seconds_a_step(29, 4, 500) == pytest.approx(4.05)
    assert run_seconds_a_step(5, 5, 500) == pytest.approx(5.0)
    assert run_seconds_a_step(29, 4, 8) == pytest.approx(7.125)
    assert run_seconds_a_step(5, 5, 8) == pytest.approx(5.0)


def test_a_training_trial_measures_the_steady_step_and_keeps_the_warm_up_beside_it(tmp_path):
    """What a trial reports (and grpo.profile prints as the step) is the median step after the warm-up;
    weighing the warm-up over a run is the tuner's ranking, not the measurement. By hand: steps of
    10 (warm-up), 4, 6 and 5 s -> 5 s."""
    from grpo.measured import TRAIN, write_log
    from grpo.tuning.trial import measure

    (tmp_path / TRAIN).parent.mkdir(parents=True)
    write_log(tmp_path / TRAIN, {"steps": [
        {"time_generate_s": g, "time_train_s": t, "peak_memory_gib/generate": pg, "peak_memory_gib/train": pt}
        for g, t, pg, pt in ((6.0, 4.0, 6.5, 4.9), (1.5, 2.5, 6.7, 5.0), (2.0, 4.0, 6.6, 4.8), (2.0, 3.0, 6.6, 4.9))]})
    speed, figures = measure(tmp_path, "train", None)
    assert speed == pytest.approx(5.0) and figures["steady_s"] == pytest.approx(5.0)
    assert figures["warm_up_s"] == pytest.approx(10.0) and figures["step_s"] == pytest.approx([4.0, 6.0, 5.0])
    assert figures["peak_gib"] == {"generate": 6.7, "train": 5.0}  # each phase's largest, warm-up included


def test_a_trials_peak_is_the_runs_not_the_last_phases():
    """Each phase resets the allocator's peak to measure its own, so the peak the trial's process reads at
    its end is its last phase's (training: 4.98 GiB in the H200 tune of bench/RESULTS.md, while generation
    had peaked higher). The trial reports the largest of that and every phase's peak."""
    from grpo.tuning.trial import run_peak

    assert run_peak(4.98, {"peak_gib": {"generate": 6.7, "train": 4.98}}) == 6.7
    assert run_peak(5.2, {"peak_gib": {"generate": 4.0}}) == 5.2  # a later phase (validation) peaked higher
    assert run_peak(1.5, {}) == 1.5 and run_peak(None, {}) is None  # sent and evaluate: no phases


def test_sent_engine_candidates_leave_out_what_auto_resolves_to():
    """`auto` stays a candidate (a tuned params file keeps choosing by capability); the other candidate is
    the engine `auto` does not pick here, never the same engine a second time under its own name."""
    raw = {"sent": {"batch_size": 16, "dtype": "auto", "engine": "auto"}}
    engines = knob_values("sent", raw, gpu=False).get("sent.engine")
    if importlib.util.find_spec("vllm"):  # auto is vLLM here
        assert engines == ["auto", "native"]
        assert knob_values("sent", {"sent": {**raw["sent"], "engine": "native"}}, gpu=False)["sent.engine"] == [
            "native", "vllm"]
    else:
        assert engines is None  # nothing to choose between


def test_a_setting_must_win_by_the_margin_to_replace_the_current_one():
    # s/step: lower wins; 10% faster is the least that counts, 5% (run-to-run spread) does not
    assert MIN_GAIN == pytest.approx(0.10)
    assert faster("train", 9.0, 10.0) and not faster("train", 9.5, 10.0) and not faster("train", 11.0, 10.0)
    # tokens/s: higher wins
    assert faster("sent", 112.0, 100.0) and not faster("evaluate", 105.0, 100.0) and not faster("sent", 90.0, 100.0)


def test_update_params_keeps_comments_nulls_and_quotes(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text('train:\n  lr: 1.0e-4   # why this lr\n  delta: null\n  prefill: ""\n  batch: 8  # rows\n')
    assert update_params(path, {"train.batch": 16, "train.lr": 1.0e-4}) == ["train.batch: 8 -> 16"]
    assert path.read_text() == 'train:\n  lr: 1.0e-4   # why this lr\n  delta: null\n  prefill: ""\n  batch: 16 # rows\n'
    with pytest.raises(KeyError, match="no section 'sent'"):
        update_params(path, {"sent.batch_size": 2})


def test_profile_writes_a_trace_with_labelled_phases_and_a_table(prepared_project):
    printed = run("python -m grpo.profile --steps 1", prepared_project).stdout
    out = prepared_project / "logs" / "profile"

    trace = json.loads(gzip.open(out / "trace.json.gz").read())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"grpo/generate", "grpo/score", "grpo/train", "grpo/train_micro_batch", "grpo/optimizer"} <= names
    assert "grpo/engine.detokenize" in names  # a sub-phase of generate (the static decoder's run on a GPU only)
    rows = {r["phase"]: r for r in json.loads((out / "phases.json").read_text())["rows"]}
    # one profiled step after the warm-up: one of each phase, micro-batches as the step had them
    assert rows["generate"]["count"] == rows["train"]["count"] == rows["optimizer"]["count"] == 1
    assert rows["train_micro_batch"]["count"] >= 1
    # nested phases take no longer than the phase that holds them; the step holds them all
    assert rows["optimizer"]["wall_s_per_step"] <= rows["train"]["wall_s_per_step"]
    assert rows["train_micro_batch"]["wall_s_per_step"] <= rows["train"]["wall_s_per_step"]
    step_s = json.loads((out / "phases.json").read_text())["step_s"]
    assert rows["generate"]["wall_s_per_step"] + rows["train"]["wall_s_per_step"] <= step_s * 1.05
    assert rows["generate"]["peak_gib"] > 0  # the process's resident set on CPU
    assert "phase" in printed and "trace.json.gz" in printed


def test_memory_history_is_left_off_where_it_breaks_compiled_layers_under_checkpointing():
    """pytorch#179536 (torch 2.11): recording the allocator's history fails compiled code inside an activation
    checkpoint, which train.compile_layers with gradient checkpointing is; any other combination records."""
    from grpo.profile import memory_history_safe

    assert not memory_history_safe({"train": {"compile_layers": True, "gradient_checkpointing": True}})
    assert not memory_history_safe({"train": {"compile_layers": True}})  # checkpointing is on by default
    assert memory_history_safe({"train": {"compile_layers": True, "gradient_checkpointing": False}})
    assert memory_history_safe({"train": {"compile_layers": False, "gradient_checkpointing": True}})
    assert memory_history_safe({})


def test_phase_times_are_host_ranges_and_the_device_busy_inside_them():
    """On CUDA the profiler lists a label as its host range and again as GPU-timeline pieces; only the
    host range is the phase. Its GPU time is the union of the device's kernel intervals inside its
    window, whoever launched them (graph replays and backward are not linked to the range). Plain
    records stand in for a CUDA profile, which cannot run here; times in µs."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from grpo.profile import phase_times

    def event(name: str, device: DeviceType, start: float, end: float) -> SimpleNamespace:
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end),
                               cpu_time_total=end - start, device_time_total=0)

    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    events = [event("grpo/generate", cpu, 100, 1100), event("grpo/train", cpu, 2000, 2500),
              event("grpo/generate", cpu, 3000, 3100),
              event("grpo/generate", gpu, 100, 1100),  # the label's GPU-timeline annotation: not a kernel
              event("replayed_kernel", gpu, 50, 400),  # straddles the window's start
              event("other_stream", gpu, 300, 500),  # overlaps it: together 100-500 inside, 400
              event("later", gpu, 900, 1300),  # straddles the end: 900-1100 inside, 200
              event("backward_kernel", gpu, 2100, 2200), event("Memcpy DtoH", gpu, 2200, 2250),
              event("between", gpu, 1500, 1600)]  # in no phase's window
    assert phase_times(events) == {"generate": [{"wall_s": 1e-3, "gpu_s": 600e-6}, {"wall_s": 1e-4, "gpu_s": 0.0}],
                                   "train": [{"wall_s": 5e-4, "gpu_s": 150e-6}]}


def test_memory_png_anchors_the_history_at_what_is_allocated_at_the_end(tmp_path):
    """The allocator's history starts mid-run: 1 GiB was allocated before it, then +1, +2, -1 GiB; the
    snapshot's segments hold 3 GiB at the end, so the levels are 2, 4, 3 GiB and the peak 4."""
    import pickle

    from grpo.profile import memory_png

    gib = 2**30
    trace = [{"action": "alloc", "size": gib, "time_us": 1_000_000},
             {"action": "alloc", "size": 2 * gib, "time_us": 2_000_000},
             {"action": "segment_alloc", "size": 8 * gib, "time_us": 2_500_000},
             {"action": "free_completed", "size": gib, "time_us": 4_000_000}]
    segments = [{"blocks": [{"size": 2 * gib, "state": "active_allocated"}, {"size": gib, "state": "inactive"},
                            {"size": gib, "state": "active_allocated"}]}]
    snapshot = tmp_path / "memory_snapshot.pickle"
    snapshot.write_bytes(pickle.dumps({"device_traces": [trace], "segments": segments}))
    span, peak = memory_png(snapshot, tmp_path / "memory.png")
    assert (span, peak) == (3.0, 4.0)
    assert (tmp_path / "memory.png").stat().st_size > 0


def test_live_memory_is_summed_by_the_innermost_project_frame_and_tabled_with_its_growth():
    """Blocks in torch's snapshot format: two owners in grpo/, one stack with no project frame, one block
    allocated before recording, an inactive (free) block that counts for nobody. (A hand-built snapshot:
    CUDA cannot run here.)"""
    from grpo.profile import live_by_owner, live_table

    mib = 2**20
    cache = [{"filename": "/x/torch/nn/functional.py", "line": 9, "name": "pad"},
             {"filename": "/proj/grpo/rollout/static_decode.py", "line": 40, "name": "alloc_cache"},
             {"filename": "/proj/stages/train.py", "line": 5, "name": "main"}]
    adam = [{"filename": "/proj/grpo/profile.py", "line": 1, "name": "hook"},
            {"filename": "/proj/grpo/train/step.py", "line": 7, "name": "step"}]
    torch_only = [{"filename": "/x/torch/optim/adamw.py", "line": 3, "name": "_init_group"}]
    segments = [{"blocks": [{"size": 512 * mib, "state": "active_allocated", "frames": cache},
                            {"size": 256 * mib, "state": "inactive", "frames": cache},
                            {"size": 64 * mib, "state": "active_allocated", "frames": adam}]},
                {"blocks": [{"size": 32 * mib, "state": "active_allocated", "frames": torch_only},
                            {"size": 1024 * mib, "state": "active_allocated"},
                            {"size": 512 * mib, "state": "active_allocated", "frames": cache}]}]
    owners = live_by_owner(segments)
    assert owners == {"grpo/rollout/static_decode.py:40 alloc_cache": 1024 * mib,
                      "grpo/train/step.py:7 step": 64 * mib,
                      "adamw.py:3 _init_group": 32 * mib,
                      "(no stack)": 1024 * mib}
    first = {"allocated": 1024 * mib, "reserved": 2048 * mib, "owners": {"(no stack)": 1024 * mib}}
    last = {"allocated": sum(owners.values()), "reserved": 4096 * mib, "owners": owners}
    lines = live_table([first, last], top=2)
    rows = {line[:64].strip(): line[64:].split() for line in lines[2:]}
    assert rows["grpo/rollout/static_decode.py:40 alloc_cache"] == ["0.000", "1.000", "+1.000"]
    assert rows["(no stack)"] == ["1.000", "1.000", "+0.000"]
    assert rows["(the rest)"] == ["0.000", "0.094", "+0.094"]  # step.py's 64 MiB and adamw's 32 MiB
    assert rows["total allocated"][-1] == "+1.094"
    assert rows["reserved by the allocator"] == ["2.000", "4.000", "+2.000"]


def test_a_failed_trial_is_described_by_its_error_not_the_progress_bar_redrawn_after_it():
    from grpo.tuning.trial import failure_line

    # the stderr of the H100 trial with generation_mlp_4bit (2026-12-05): the bar is redrawn after the error
    stderr = ("train:   0%|          | 0/3 [00:00<?, ?step/s]\n"
              "error: AcceleratorError: CUDA error: operation failed due to a previous error during capture\n"
              "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n\n"
              "train:   0%|          | 0/3 [00:05<?, ?step/s]\n")
    assert failure_line(stderr, 1) == ("error: AcceleratorError: CUDA error: operation failed due to a previous "
                                       "error during capture")
    # no error line (a crash outside grpo.cli): the last line that is not a bar
    assert failure_line("Traceback ...\nKeyError: 'x'\nsft:  50%|#####     | 1/2 [00:01<00:01]\n", 1) == "KeyError: 'x'"
    assert failure_line("", -9) == "exit -9"
