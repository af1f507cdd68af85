"""The training log's writers: DVCLive always, Weights & Biases when ``train.report_to`` names it.

Names are TRL's (``reward``, ``reward_std``, ``completions/mean_length``, ``clip_ratio/low_mean``,
``kl``, ``entropy``, ``rewards/<function>/mean``, ``learning_rate``), validation metrics under
``eval/``, so dashboards built for TRL runs read these runs too. grpo/trainlog.py documents the files.

Resume: each run of the stage starts the DVCLive folder afresh and first replays the history the
checkpoint it resumed from holds, through the same calls as live logging, so a resumed run's files
equal an uninterrupted run's byte for byte (DVCLive's own ``resume=True`` would keep the rows logged
after that checkpoint, which the resumed run then logs again). A W&B run is one per process: the last
one of a resumed training holds the whole, replayed history.

Measured figures (grpo/measured.py: timings, throughput, peak memory) never reach the DVCLive files,
which DVC tracks; they go to logs/train.json, and to W&B, which DVC does not track.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from dvclive import Live

from grpo.io import round_floats
from grpo.measured import is_measured, read_log, write_log
from grpo.trainlog import EVAL

log = logging.getLogger(__name__)

# grpo.train.step's (and grpo.algo.objective's) metric names -> TRL GRPOTrainer's; others keep their name
TRL_NAMES = {
    "reward_mean": "reward",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "response_length_mean": "completions/mean_length",
    "response_length_max": "completions/max_length",
    "truncated_frac": "completions/clipped_ratio",
    "clip_frac_low": "clip_ratio/low_mean",
    "clip_frac_high": "clip_ratio/high_mean",
    "clip_frac_region": "clip_ratio/region_mean",
    "kl_mean": "kl",
    "entropy_mean": "entropy",
    "lr": "learning_rate",
}
NOT_LOGGED = ("step", "checkpoint")  # the step is DVCLive's axis; a checkpoint's name follows from it


def public_name(name: str) -> str:
    """The logged name of one of the loop's metrics: TRL's, ``rewards/<fn>/mean`` for ``reward/<fn>``."""
    if name.startswith("reward/"):
        return f"rewards/{name.split('/', 1)[1]}/mean"
    return TRL_NAMES.get(name, name)


def logged(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``metrics`` under their logged names (rounded as every metrics file here is), without the step,
    and without a measured figure, whatever its source (a checkpoint written before timings moved to
    logs/ holds some in its history)."""
    return {f"{prefix}{public_name(k)}": v for k, v in round_floats(metrics).items()
            if k not in NOT_LOGGED and not is_measured(k)}


class WandbRun:
    """The W&B mirror: one run named after the DVC experiment, with the params as its config."""

    def __init__(self, config: dict[str, Any], run_dir: Path) -> None:
        try:
            import wandb
        except ImportError:
            raise ValueError("train.report_to: wandb is not installed; `pip install wandb` (the tested version "
                             "is pinned in requirements-test.txt), or remove wandb from train.report_to") from None
        mode = wandb.setup().settings.mode
        if mode not in ("offline", "dryrun", "disabled") and not wandb.login(verify=False, prompt=False):
            raise ValueError("train.report_to: wandb is not logged in; run `wandb login` or set WANDB_API_KEY, or "
                             "set WANDB_MODE=offline to keep the run on disk (`wandb sync` uploads it later)")
        run_dir.mkdir(parents=True, exist_ok=True)
        self.wandb = wandb
        # DVC names every `dvc exp run` (DVC_EXP_NAME); a plain `dvc repro` has no name, W&B picks one
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "grpo-dvc"), name=os.environ.get("DVC_EXP_NAME"),
                              config=config, dir=str(run_dir))

    def log(self, step: int, values: dict[str, Any]) -> None:
        self.run.log(values, step=step)

    def finish(self, summary: dict[str, Any], samples: list[dict]) -> None:
        columns = ["step", "id", "gold", "response", "finish_reason", "rewards"]
        rows = [[s["step"], s["id"], s["gold"], s["response"], s["finish_reason"], json.dumps(s["rewards"])]
                for s in samples]
        self.run.log({"completions": self.wandb.Table(columns=columns, data=rows)})
        self.run.summary.update(summary)
        self.run.finish()


class Tracker:
    """Everything the loop logs, in the order it logs it; see the module docstring."""

    def __init__(self, live_dir: Path, measured_path: Path, report_to: list[str], config: dict[str, Any],
                 wandb_dir: Path) -> None:
        # the optional trackers first, so that a missing package or login stops the stage before any work
        self.wandb = WandbRun(config, wandb_dir) if "wandb" in report_to else None
        self.live_dir, self.measured_path = Path(live_dir), Path(measured_path)
        self.live: Live | None = None
        self.measured: list[dict[str, Any]] = []

    def start(self, history: list[dict], validation: list[dict]) -> None:
        """Open the DVCLive folder afresh and replay the checkpointed ``history`` (with its validations)."""
        self.live = Live(str(self.live_dir), resume=False, save_dvc_exp=False, dvcyaml=None, report=None)
        done = {row["step"] for row in history}
        earlier = (read_log(self.measured_path) or {}).get("steps", [])
        self.measured = [row for row in earlier if row.get("step") in done]
        validated = {row["step"]: row for row in validation}
        measured = {row["step"]: {k: v for k, v in row.items() if k != "step"} for row in self.measured}
        for row in history:
            self._log(row, validated.get(row["step"]), measured.get(row["step"]))

    def log_step(self, results: dict[str, Any], validation: dict[str, Any] | None, measured: dict[str, Any]) -> None:
        self.measured.append({"step": results["step"], **measured})
        self._log(results, validation, measured)

    def _log(self, results: dict[str, Any], validation: dict[str, Any] | None,
             measured: dict[str, Any] | None = None) -> None:
        values = logged(results) | (logged(validation, f"{EVAL}/") if validation else {})
        self.live.step = results["step"]
        for name, value in values.items():
            self.live.log_metric(name, value)
        self.live.next_step()  # writes metrics.json, so `dvc exp show` / `dvc plots` see the step now
        if self.wandb is not None:
            self.wandb.log(results["step"], values | round_floats(measured or {}))

    def save_measured(self) -> None:
        """logs/train.json: each step's measured figures and their totals (grpo/measured.py)."""
        totals = {key: sum(row.get(key, 0.0) for row in self.measured)
                  for key in ("time_generate_s", "time_train_s")}
        write_log(self.measured_path, {"steps": self.measured, **totals})

    def finish(self, summary: dict[str, Any], samples: list[dict]) -> None:
        """Add the run's summary figures to metrics.json and close every tracker."""
        self.save_measured()
        self.live.summary = _canonical(_merged(self.live.summary, round_floats(summary)))
        self.live.end()
        self.close()
        if self.wandb is not None:
            self.wandb.finish(round_floats(summary), samples)

    def close(self) -> None:
        """Release the DVC repo that DVCLive opened; also what a run that stops on an error calls, so a
        process that trains again (a notebook, the fault tests) does not pile up its descriptors."""
        if self.live is not None:
            close_dvc_repo(self.live)


def close_dvc_repo(live: Live) -> None:
    """Close the DVC repo that ``Live`` opens to find the project and leaves open after ``end()``: its git
    pack files and caches, about 28 descriptors a run, which a process that trains more than once (the test
    session, a notebook) piles up (DVC's own leak of this kind: treeverse/dvc#9089)."""
    repo = getattr(live, "_dvc_repo", None)  # private: DVCLive has no public way to release it
    if repo is not None:
        repo.close()


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` merged into ``base`` at every level (``rewards/<fn>/mean`` keeps its siblings)."""
    out = dict(base)
    for key, value in extra.items():
        both = isinstance(base.get(key), dict) and isinstance(value, dict)
        out[key] = _merged(base[key], value) if both else value
    return out


def _canonical(summary: dict[str, Any]) -> dict[str, Any]:
    """Keys sorted at every level, inside lists too, as in every metrics file of the project: a resumed
    run's summary is built from checkpointed state (stored sorted), an uninterrupted run's is not."""
    return json.loads(json.dumps(summary, sort_keys=True))
