"""The training loop: set-up, resume, steps, validation, checkpoints, logs, final adapter.

Outputs (paths from ``TrainPaths``):
- ``checkpoints/step-NNNNNN/``: see grpo.train.checkpoint (a DVC ``persist`` out: it survives a crash
  and the rerun resumes from the newest complete one, unless the run's fingerprint changed);
- ``final/``: the last adapter, PEFT format;
- ``live/``: the DVCLive log (grpo/trainlog.py: per-step and validation metrics, the summary), and
  ``live/samples.jsonl``, the logged completions;
- ``measured``: logs/train.json, the timings and peak memory (untracked, grpo/measured.py).
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from grpo import distributed
from grpo.config import TrainParams, to_dict
from grpo.fault_injection import kill_point
from grpo.io import atomic_dir, write_jsonl
from grpo.measured import split_measured
from grpo.model.adapter import save_adapter
from grpo.model.lora import load_lora_state_dict
from grpo.prompts import PromptStyle
from grpo.train import checkpoint as ckpt
from grpo.train.parts import TrainerParts
from grpo.train.step import Rollouts, StepContext, grpo_step
from grpo.train.validation import validate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainPaths:
    base_model: Path
    checkpoints: Path
    final: Path
    live: Path  # the DVCLive folder
    measured: Path  # the measured figures' log; W&B writes its run folder next to it

    @property
    def samples(self) -> Path:
        return self.live / "samples.jsonl"


# Params that change where the run is reported or how many processes share it, not the run:
# checkpoints stay resumable across them.
NOT_RUN_IDENTITY = ("report_to", "num_processes", "nnodes")


def fingerprint(params: TrainParams, style: PromptStyle, files: list[Path]) -> str:
    """What makes two runs the same run; checkpoints of another run are never resumed."""
    identity = {k: v for k, v in to_dict(params).items() if k not in NOT_RUN_IDENTITY}
    digest = hashlib.sha256(json.dumps([identity, style.__dict__], sort_keys=True).encode())
    for path in files:
        digest.update(path.read_bytes() if path.is_file() else b"-")
    return digest.hexdigest()[:16]


class Trainer:
    def __init__(self, params: TrainParams, style: PromptStyle, paths: TrainPaths, train_rows: list[dict],
                 val_rows: list[dict], parts: TrainerParts, run_fingerprint: str) -> None:
        """``parts`` from ``build_parts`` (grpo/train/parts.py), built over ``train_rows``' ids."""
        self.params, self.style, self.paths = params, style, paths
        self.rows = {row["id"]: row for row in train_rows}
        self.val_rows = val_rows
        self.fingerprint = run_fingerprint
        self.parts = parts
        self.tracker, self.model, self.engine = parts.tracker, parts.model, parts.engine
        self.optimizer, self.scheduler, self.sizes = parts.optimizer, parts.scheduler, parts.sizes
        self.sampler, self.schedule = parts.sampler, parts.schedule
        self.ctx = StepContext(params, style, parts)
        self.history: list[dict] = []  # each step's results (no measured figures: checkpoints are outputs)
        self.validation: list[dict] = []
        self.samples: list[dict] = []  # logged completions, for samples.jsonl
        self.step = 0

    # --- checkpoints -------------------------------------------------------------------------
    def _save_adapter(self, folder: Path) -> None:
        save_adapter(self.model, folder, base_model_name_or_path=self._base_name(), lora_config=self.parts.lora)

    def _base_name(self) -> str:
        info = self.paths.base_model / "MODEL_INFO.json"
        return json.loads(info.read_text())["source"] if info.exists() else str(self.paths.base_model)

    def _state(self) -> dict:
        return {"step": self.step, "fingerprint": self.fingerprint, "sampler": self.sampler.state(),
                "schedule": self.schedule.state(), "sizes": {k: s.state() for k, s in self.sizes.items()},
                "history": self.history, "validation": self.validation, "samples": self.samples}

    def save(self) -> None:
        if not distributed.is_main():  # [data parallel] every rank holds the same state; rank 0 writes it
            return
        ckpt.save_checkpoint(self.paths.checkpoints, self.step, save_adapter_fn=self._save_adapter,
                             optimizer=self.optimizer, scheduler=self.scheduler, state=self._state())
        kill_point("checkpoint.prune")
        ckpt.prune(self.paths.checkpoints, self.params.keep_last, {row["step"] for row in self.validation})

    def resume(self) -> None:
        # [data parallel] rank 0 reads the newest checkpoint and every rank resumes from it, also ranks
        # on hosts that do not see rank 0's checkpoints folder
        found = distributed.broadcast(self._read_latest() if distributed.is_main() else None)
        if found is None:
            return
        path, state, trainer, adapter = found
        if state.get("fingerprint") != self.fingerprint:
            log.warning("checkpoints in %s belong to another run (params, data or base changed): starting "
                        "fresh and deleting them", self.paths.checkpoints)
            if distributed.is_main():
                shutil.rmtree(self.paths.checkpoints)
            return
        load_lora_state_dict(self.model, adapter)
        self.optimizer.load_state_dict(trainer["optimizer"])
        self.scheduler.load_state_dict(trainer["scheduler"])
        ckpt.set_rng_state(trainer["rng"])
        self.sampler.load_state(state["sampler"])
        self.schedule.load_state(state["schedule"])
        for name, size_state in state["sizes"].items():
            self.sizes[name].load_state(size_state)
        self.history, self.validation, self.step = state["history"], state["validation"], state["step"]
        self.samples = state.get("samples", [])
        log.info("resumed from %s (step %d of %d)", path, self.step, self.params.max_steps)

    def _read_latest(self) -> tuple[Path, dict, dict, dict] | None:
        """The newest complete checkpoint: (folder, state.json, trainer state, adapter tensors)."""
        ckpt.sweep_hidden(self.paths.checkpoints)
        found = ckpt.load_latest(self.paths.checkpoints)
        if found is None:
            return None
        from safetensors.torch import load_file

        return *found, load_file(str(found[0] / "adapter" / "adapter_model.safetensors"))

    # --- the loop ----------------------------------------------------------------------------
    def run(self) -> dict:
        self.resume()
        self.tracker.start(self.history, self.validation)
        try:
            return self._steps()
        except BaseException:
            self.tracker.close()
            raise

    def _steps(self) -> dict:
        p = self.params
        bar = tqdm(total=p.max_steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True,
                   disable=not distributed.is_main())
        while self.step < p.max_steps:
            stage = self.schedule.stage_for_step(self.step)
            ids = self.sampler.next_ids(p.prompts_per_step, stage)
            step_metrics, rollouts, reasons = self.train_step([self.rows[i] for i in ids])
            kill_point("train.step")
            metrics, measured = split_measured(step_metrics)
            self.schedule.record_reward(metrics["reward_mean"])
            self.step += 1
            metrics.update(step=self.step, curriculum_stage=stage)
            self.history.append(metrics)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", stage=f"{stage + 1}/{self.schedule.num_stages}")
            log.info("step %d stage %d/%d reward %.3f %s", self.step, stage + 1, self.schedule.num_stages,
                     metrics["reward_mean"], " ".join(f"{k.split('/')[1]}={v:.3f}" for k, v in metrics.items()
                                                      if k.startswith("reward/")))
            if self.step % p.log_completions_every == 0:
                self._log_samples(rollouts, reasons)
            is_val = self.step % p.val_every == 0 or self.step == p.max_steps
            self.tracker.log_step(metrics, self._validate() if is_val else None, measured)
            if is_val or self.step % p.save_every == 0:
                self.save()
                self._write_logs()
        bar.close()
        return self._finish()

    def train_step(self, prompts: list[dict]) -> tuple[dict[str, float], Rollouts, list[dict]]:
        """One GRPO step on ``prompts`` (grpo/train/step.py): (metrics, rollouts, reward reasons). A
        subclass may wrap it, as the tests do to record rollouts or to stop a run at a chosen step."""
        return grpo_step(self.ctx, prompts, self.step)

    def _validate(self) -> dict:
        p = self.params
        result = validate(self.engine, self.parts.tokenizer, self.val_rows, self.style,
                          max_new_tokens=p.val_max_new_tokens, n=p.val_samples, temperature=p.temperature, seed=p.seed)
        result.update(step=self.step, checkpoint=ckpt.checkpoint_name(self.step))
        self.validation.append(result)
        log.info("validation at step %d: accuracy %.3f, format %.3f", self.step, result["accuracy"],
                 result["format_rate"])
        return result

    def _log_samples(self, rollouts, reasons: list[dict]) -> None:
        for i in range(0, len(rollouts.responses), self.params.group_size)[:2]:
            entry = {"step": self.step, "id": rollouts.samples[i]["id"], "gold": rollouts.samples[i]["answer"],
                     "response": rollouts.responses[i], "finish_reason": rollouts.completions[i].finish_reason,
                     "rewards": reasons[i]}
            self.samples.append(entry)
            log.info("sample (step %d, %s): %r → %s", self.step, entry["id"], entry["response"][:300], entry["rewards"])

    def _write_logs(self) -> None:
        """Rewrite the samples and the measured log whole from the state that checkpoints hold, so a
        resumed run's equal an uninterrupted run's: entries made after the last checkpoint are redone,
        never doubled (the DVCLive files are replayed from that state by ``Tracker.start``)."""
        if not distributed.is_main():  # [data parallel] rank 0 writes
            return
        write_jsonl(self.paths.samples, self.samples)
        self.tracker.save_measured()

    def _finish(self) -> dict:
        kill_point("train.finish")
        self._write_logs()
        if distributed.is_main():  # [data parallel] rank 0 writes
            with atomic_dir(self.paths.final) as tmp:
                self._save_adapter(Path(tmp))
        kill_point("train.summary")
        last = self.history[-1] if self.history else {}
        first = self.history[0] if self.history else {}
        summary = {
            "steps": self.step,
            "reward_first": first.get("reward_mean"), "reward_last": last.get("reward_mean"),
            "reward_mean_last5": _mean([h["reward_mean"] for h in self.history[-5:]]),
            "reward_mean_first5": _mean([h["reward_mean"] for h in self.history[:5]]),
            "val_accuracy_last": self.validation[-1]["accuracy"] if self.validation else None,
            "val_accuracy_best": max((v["accuracy"] for v in self.validation), default=None),
            "oom_events_total": sum(s.oom_events for s in self.sizes.values()),
            "curriculum_transitions": self.schedule.transitions,
            "verify_timeouts": sum(h.get("verify_timeouts", 0) for h in self.history),
            # groups whose rewards were all equal carry no gradient: per stage, how much of the
            # curriculum fed the loss nothing (issue 19)
            # (DVCLive's summary holds the last step's value under the plain name)
            **zero_std_summary(self.history),
            # nested as DVCLive nests rewards/<name>/mean, so exp show lists them next to it
            "rewards": {name: {"mean_first5": _mean([h[f"reward/{name}"] for h in self.history[:5]
                                                      if f"reward/{name}" in h]),
                               "mean_last5": _mean([h[f"reward/{name}"] for h in self.history[-5:]
                                                     if f"reward/{name}" in h])}
                        for name in self.params.rewards},
        }
        self.tracker.finish(summary, self.samples)
        return summary


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def zero_std_summary(history: list[dict]) -> dict:
    """The mean of the steps' ``frac_reward_zero_std`` over the run, and per curriculum stage (0-based,
    as ``curriculum_stage`` in the per-step log)."""
    by_stage: dict[int, list[float]] = {}
    for h in history:
        by_stage.setdefault(h.get("curriculum_stage", 0), []).append(h["frac_reward_zero_std"])
    return {"frac_reward_zero_std_mean": _mean([h["frac_reward_zero_std"] for h in history]),
            "frac_reward_zero_std_by_stage": {str(stage): _mean(v) for stage, v in sorted(by_stage.items())}}
