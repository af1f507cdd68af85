"""The SENT curriculum: order questions easy → hard, cut them into stages, and advance during training.

File format (``data/sent/curriculum.json``, written by the sent stage, read by the train stage)::

    {"version": 1,
     "num_stages": K,
     "stages": [[id, ...], ...],          # K lists, easiest first; every kept id appears once
     "dropped": {"all_correct": [id, ...], "all_wrong": [id, ...]}}

Order (``sent.order``), remaining ties by a seeded shuffle in both:

- ``signal`` (default): questions with learning signal first. A GRPO group carries gradient only when
  its rewards differ, which for correctness means a pass rate strictly between 0 and 1; those come
  first, easiest (highest pass rate) first. Then the all-correct questions, then the all-wrong ones:
  answered-but-wrong before never-answered (a question the model never answers is the hardest, not
  the most certain), and among equal answer rates the more varied answers first.
- ``entropy``: the seed engine's order, ascending semantic entropy (a model that answers consistently
  finds the question easy), ties by descending pass rate. With ``no_answer_cluster`` a never-answered
  question has entropy 0 and so does a consistently wrong one: both land among the easiest, and early
  stages fill with all-wrong groups that carry no gradient (issue 19).

Stages are consecutive, near-equal slices of the order.

Schedule: stage k is entered at step ``k * max_steps / K`` at the latest; with ``advance="reward"`` it
is entered earlier once the mean reward over the current stage's recent steps passes a threshold.
Training at stage k samples from stages 0..k together (the easy questions stay in the pool), so the
whole curriculum is reached and earlier material is not forgotten.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

CURRICULUM_VERSION = 1
REWARD_WINDOW = 3  # steps of the current stage averaged for reward-based advancement


def _unanswered(score: dict) -> float:
    return sum(c["count"] for c in score.get("clusters", []) if c["answer"] is None) / score.get("n", 1)


def _entropy_key(s: dict) -> tuple:
    return (round(s["entropy"], 9), -s["pass_rate"])


def _signal_key(s: dict) -> tuple:
    p = s["pass_rate"]
    if 0.0 < p < 1.0:
        return (0, -p)
    if p == 1.0:
        return (1, round(s["entropy"], 9))
    return (2, round(_unanswered(s), 9), -round(s["entropy"], 9))


# params' sent.order names one of these (grpo/config.py validates against this dict)
ORDER_KEYS = {"signal": _signal_key, "entropy": _entropy_key}


def order_easy_to_hard(scores: Sequence[dict], seed: int, order: str = "signal") -> list[str]:
    """Ids sorted by ``order``'s key (module docstring), then a seeded shuffle."""
    if order not in ORDER_KEYS:
        raise ValueError(f"sent.order: unknown order {order!r}; allowed: {', '.join(ORDER_KEYS)}")
    rng = random.Random(seed)
    tiebreak = {s["id"]: rng.random() for s in sorted(scores, key=lambda s: s["id"])}
    ranked = sorted(scores, key=lambda s: (*ORDER_KEYS[order](s), tiebreak[s["id"]]))
    return [s["id"] for s in ranked]


def build_curriculum(scores: Sequence[dict], num_stages: int, *, drop_all_correct: bool,
                     drop_all_wrong: bool, seed: int, order: str = "signal") -> dict:
    """The curriculum.json payload. Dropping uniform-outcome questions is offline dynamic sampling:
    a group whose samples are all right or all wrong has zero reward variance and no GRPO signal."""
    dropped: dict[str, list[str]] = {"all_correct": [], "all_wrong": []}
    kept = []
    for s in scores:
        if drop_all_correct and s["pass_rate"] == 1.0:
            dropped["all_correct"].append(s["id"])
        elif drop_all_wrong and s["pass_rate"] == 0.0:
            dropped["all_wrong"].append(s["id"])
        else:
            kept.append(s)
    if not kept:
        raise ValueError("sent: every question was dropped (all samples right or all wrong); "
                         "turn off sent.drop_all_correct / sent.drop_all_wrong or sample more (sent.M)")
    ids = order_easy_to_hard(kept, seed, order)
    k = min(num_stages, len(ids))
    bounds = [round(i * len(ids) / k) for i in range(k + 1)]
    stages = [ids[bounds[i] : bounds[i + 1]] for i in range(k)]
    return {"version": CURRICULUM_VERSION, "num_stages": k, "stages": stages,
            "dropped": {key: sorted(v) for key, v in dropped.items()}}


def load_curriculum(path: Path, known_ids: set[str]) -> list[list[str]]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("version") != CURRICULUM_VERSION or not isinstance(data.get("stages"), list):
        raise ValueError(f"{path}: not a version-{CURRICULUM_VERSION} curriculum file (see grpo/sent/curriculum.py)")
    unknown = [i for stage in data["stages"] for i in stage if i not in known_ids]
    if unknown:
        raise ValueError(f"{path}: {len(unknown)} ids are not in the training data (first: {unknown[0]!r}); "
                         "rerun the sent stage on the current data/prepared/train.jsonl")
    return [list(stage) for stage in data["stages"] if stage]


@dataclass
class StageSchedule:
    num_stages: int
    max_steps: int
    advance: str = "step_fraction"  # or "reward"
    reward_threshold: float = 0.5
    stage: int = 0
    stage_rewards: list[float] = field(default_factory=list)
    transitions: list[dict] = field(default_factory=list)

    def stage_for_step(self, step: int) -> int:
        """The stage to train step ``step`` (0-based) at; call once per step, in order."""
        by_fraction = self._stage_by_fraction(step)
        by_reward = self.stage
        recent = self.stage_rewards[-REWARD_WINDOW:]
        if (self.advance == "reward" and len(recent) == REWARD_WINDOW
                and sum(recent) / len(recent) >= self.reward_threshold):
            by_reward = min(self.num_stages - 1, self.stage + 1)
        new = max(self.stage, by_fraction, by_reward)
        if new != self.stage:
            reason = "reward" if new == by_reward and new > by_fraction else "step_fraction"
            self.transitions.append({"step": step, "from": self.stage, "to": new, "reason": reason})
            self.stage, self.stage_rewards = new, []
        return self.stage

    def plan(self, stage_sizes: list[int]) -> str:
        """The schedule in words for the train log, e.g. "stage 1 (22 questions) steps 1-6, stage 2 (+21
        questions) steps 7-11, ..." (a stage samples from its own questions and every earlier stage's)."""
        firsts = [next((s for s in range(self.max_steps) if self._stage_by_fraction(s) >= k), self.max_steps)
                  for k in range(self.num_stages)] + [self.max_steps]
        parts = [f"stage {k + 1} ({'+' if k else ''}{size} questions) steps {firsts[k] + 1}-{firsts[k + 1]}"
                 for k, size in enumerate(stage_sizes)]
        rule = (f"; a stage ends early once its last {REWARD_WINDOW} steps average reward >= {self.reward_threshold}"
                if self.advance == "reward" else "")
        return ", ".join(parts) + rule

    def _stage_by_fraction(self, step: int) -> int:
        return min(self.num_stages - 1, step * self.num_stages // self.max_steps)

    def record_reward(self, mean_reward: float) -> None:
        self.stage_rewards.append(mean_reward)

    def state(self) -> dict:
        return {"stage": self.stage, "stage_rewards": list(self.stage_rewards), "transitions": list(self.transitions)}

    def load_state(self, state: dict) -> None:
        self.stage, self.stage_rewards = state["stage"], list(state["stage_rewards"])
        self.transitions = list(state["transitions"])


@dataclass
class CurriculumSampler:
    """Deterministic, resumable prompt sampler over the pool of stages 0..k.

    Each (stage, epoch) has its own seeded permutation of the pool; the cursor walks it and a new
    epoch starts when it runs out, so every question of the pool is seen once before any repeats.
    """

    stages: list[list[str]]
    seed: int
    stage: int = 0
    epoch: int = 0
    cursor: int = 0

    def _pool(self) -> list[str]:
        pool = [i for stage in self.stages[: self.stage + 1] for i in stage]
        random.Random(f"{self.seed}-{self.stage}-{self.epoch}").shuffle(pool)
        return pool

    def next_ids(self, count: int, stage: int) -> list[str]:
        if stage != self.stage:
            self.stage, self.epoch, self.cursor = stage, 0, 0
        ids: list[str] = []
        while len(ids) < count:
            pool = self._pool()
            take = pool[self.cursor : self.cursor + count - len(ids)]
            ids += take
            self.cursor += len(take)
            if self.cursor >= len(pool):
                self.epoch, self.cursor = self.epoch + 1, 0
        return ids

    def state(self) -> dict:
        return {"stage": self.stage, "epoch": self.epoch, "cursor": self.cursor}

    def load_state(self, state: dict) -> None:
        self.stage, self.epoch, self.cursor = state["stage"], state["epoch"], state["cursor"]
