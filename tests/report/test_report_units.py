"""Report building blocks: the params diff, the two renderers and the figures' missing-input contract."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from grpo.config import SECTIONS, parse_section
from grpo.report import UNSET, ParamChange, params_changes
from grpo.report.figures import benchmark_bars, entropy_curve, reward_curves, sent_histograms, validation_curve
from grpo.report.render import Code, Heading, Image, Para, Table, to_html, to_markdown


def validated(**raw: dict) -> dict:
    return {name: parse_section(name, raw.get(name)) for name in SECTIONS}


def test_defaults_have_no_changes():
    assert params_changes(validated()) == []


def test_changes_compare_validated_values_and_mapping_entries():
    params = validated(train={"lr": 0.0005, "max_steps": 20, "rewards": {"tagged_format_soft": 1}},
                       evaluate={"benchmarks": {"aime24": {"n": 8}}})
    assert params_changes(params) == [  # lr and max_steps equal the defaults however they are written
        ParamChange("train.rewards.correctness", 2.0, UNSET),  # the default entry was dropped
        ParamChange("train.rewards.tagged_format_soft", UNSET, 1.0),
        ParamChange("evaluate.benchmarks.aime24.max_new_tokens", UNSET, 256),
        ParamChange("evaluate.benchmarks.aime24.n", UNSET, 8),
        ParamChange("evaluate.benchmarks.aime24.temperature", UNSET, 0.0),
        ParamChange("evaluate.benchmarks.aime24.top_p", UNSET, 1.0),
    ]


def test_renderers_escape_and_mark_up_inline_text(tmp_path):
    blocks = [Heading(2, "A <b> & `x<y`"), Para("**bold** and `a|b`"), Table(["k|ey", "v"], [["`a`", "<i>"]]),
              Code("if a < b:\n    pass")]
    md = to_markdown(blocks)
    assert "| k\\|ey | v |" in md and "```\nif a < b:\n    pass\n```" in md
    page = to_html(blocks, tmp_path, "t")
    assert "<h2>A &lt;b&gt; &amp; <code>x&lt;y</code></h2>" in page
    assert "<p><strong>bold</strong> and <code>a|b</code></p>" in page
    assert "<td>&lt;i&gt;</td>" in page and "if a &lt; b:" in page


def test_html_embeds_images(tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures/x.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    page = to_html([Image("figures/x.png", "a figure")], tmp_path, "t")
    assert '<img src="data:image/png;base64,iVBORw0KGgpmYWtl" alt="a figure">' in page


def test_figures_return_none_without_their_inputs(tmp_path: Path):
    steps = pd.DataFrame({"step": [1, 2], "reward": [0.1, 0.2]})
    assert entropy_curve(steps, tmp_path / "e.png") is None and not (tmp_path / "e.png").exists()
    assert reward_curves(None, tmp_path / "r.png") is None
    assert reward_curves(steps, tmp_path / "r.png") == tmp_path / "r.png"  # no reward_std, no per-function
    assert validation_curve(None, {"step": 5}, tmp_path / "v.png") is None
    assert benchmark_bars({"base": {}}, tmp_path / "b.png") is None
    assert sent_histograms(None, tmp_path / "s.png") is None
