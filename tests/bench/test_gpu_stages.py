"""bench/gpu_stages.py's project params: the shipped 8 GB preset with the model folder, the data caps and
the issue's evaluate protocols, valid for every stage. (The whole script ran end to end with --smoke on
CPU; the device run is the lead's, recorded in bench/RESULTS.md.)"""
from __future__ import annotations

import yaml

from bench.gpu_stages import PRESET, PROTOCOLS, stage_list, write_params
from grpo.config import SECTIONS, load_params


def test_params_are_the_preset_with_the_model_caps_and_protocols(tmp_path):
    raw, changed = write_params(tmp_path, tmp_path / "model", smoke=False, extra=["evaluate.batch_size=14"])
    params = load_params(tmp_path / "params.yaml", list(SECTIONS))
    preset = yaml.safe_load(PRESET.read_text())
    assert params["model"].source == str(tmp_path / "model")
    assert params["train"].max_steps == 3 and params["prepare"].max_train == 48
    assert params["prepare"].max_eval == {"gsm8k": 16, "math500": 8, "aime24": 2}
    for benchmark, protocol in PROTOCOLS.items():
        got = params["evaluate"].benchmarks[benchmark]
        assert (got.n, got.max_new_tokens) == (protocol["n"], protocol["max_new_tokens"])
    assert changed == []  # the shipped preset already has the protocols
    assert params["evaluate"].batch_size == 14  # --set
    untouched = {k: v for k, v in preset["train"].items() if k != "max_steps"}
    assert {k: raw["train"][k] for k in untouched} == untouched


def test_smoke_runs_on_the_cpu_with_tiny_lengths(tmp_path):
    write_params(tmp_path, tmp_path / "model", smoke=True, extra=[])
    params = load_params(tmp_path / "params.yaml", list(SECTIONS))
    assert params["train"].device == "cpu" and params["sent"].engine == params["evaluate"].engine == "native"
    assert params["evaluate"].benchmarks["aime24"].max_new_tokens == 8 and params["train"].max_response_length == 8
    names = [name for name, _ in stage_list()]
    assert names[:4] == ["base_model", "prepare", "sent", "train"] and "evaluate final/aime24" in names
