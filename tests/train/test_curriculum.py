"""SENT curriculum: order, stages, drop rules, schedule and the resumable sampler."""
from __future__ import annotations

import json

import pytest

from grpo.sent.curriculum import (CurriculumSampler, StageSchedule, build_curriculum, load_curriculum,
                                  order_easy_to_hard)


def score(i: str, entropy: float, pass_rate: float) -> dict:
    return {"id": i, "entropy": entropy, "pass_rate": pass_rate}


def test_order_by_entropy_then_pass_rate_then_seeded_shuffle():
    scores = [score("a", 1.0, 0.5), score("b", 0.0, 0.25), score("c", 0.0, 0.75), score("d", 1.0, 0.5)]
    order = order_easy_to_hard(scores, seed=0, order="entropy")
    assert order[:2] == ["c", "b"]  # lowest entropy first; tie broken by higher pass rate
    assert set(order[2:]) == {"a", "d"}
    # the a/d tie is broken by the seed, deterministically
    assert order_easy_to_hard(scores, seed=0, order="entropy") == order
    assert {tuple(order_easy_to_hard(scores, seed=s, order="entropy")[2:]) for s in range(20)} == {("a", "d"), ("d", "a")}


def sent_score(i: str, answers: list[str | None], gold: str = "7") -> dict:
    """A score as grpo.sent.entropy writes it, from M sampled answers."""
    import math
    from collections import Counter
    counts = Counter(answers)
    n = len(answers)
    entropy = 0.0 - sum(c / n * math.log(c / n) for c in counts.values())
    return {"id": i, "entropy": entropy, "pass_rate": counts[gold] / n, "n": n,
            "clusters": [{"answer": a, "count": c, "correct": a == gold} for a, c in counts.items()]}


def test_signal_order_puts_mixed_outcomes_first_and_never_answered_last():
    scores = [
        sent_score("never", [None] * 4),                 # entropy 0 (one no-answer cluster), pass 0
        sent_score("consistent_wrong", ["5"] * 4),       # entropy 0, pass 0
        sent_score("varied_wrong", ["5", "6", "8", "9"]),  # high entropy, pass 0
        sent_score("all_right", ["7"] * 4),              # entropy 0, pass 1
        sent_score("mostly_right", ["7", "7", "7", "5"]),
        sent_score("half_right", ["7", "7", None, "5"]),
    ]
    signal = order_easy_to_hard(scores, seed=0)
    assert signal == ["mostly_right", "half_right", "all_right", "varied_wrong", "consistent_wrong", "never"]
    # the seed engine's order puts both zero-signal, all-wrong questions among the easiest
    assert order_easy_to_hard(scores, seed=0, order="entropy")[0] == "all_right"
    assert set(order_easy_to_hard(scores, seed=0, order="entropy")[1:3]) == {"consistent_wrong", "never"}
    with pytest.raises(ValueError, match="sent.order: unknown order 'random'"):
        order_easy_to_hard(scores, seed=0, order="random")


def test_stages_partition_and_drop_rules():
    scores = [score(f"q{i}", i / 10, 0.5) for i in range(10)]
    scores += [score("easy", 0.0, 1.0), score("hard", 2.0, 0.0)]
    cur = build_curriculum(scores, 3, drop_all_correct=True, drop_all_wrong=True, seed=0, order="entropy")
    assert cur["dropped"] == {"all_correct": ["easy"], "all_wrong": ["hard"]}
    assert [len(s) for s in cur["stages"]] == [3, 4, 3]
    assert [i for s in cur["stages"] for i in s] == [f"q{i}" for i in range(10)]
    kept = build_curriculum(scores, 3, drop_all_correct=False, drop_all_wrong=False, seed=0, order="entropy")
    assert kept["stages"][0][0] == "easy" and kept["stages"][-1][-1] == "hard"


def test_everything_dropped_is_an_error():
    with pytest.raises(ValueError, match="every question was dropped"):
        build_curriculum([score("a", 0, 1.0)], 2, drop_all_correct=True, drop_all_wrong=False, seed=0)


def test_load_rejects_unknown_ids(tmp_path):
    path = tmp_path / "curriculum.json"
    path.write_text(json.dumps(build_curriculum([score("a", 0, 0.5), score("b", 1, 0.5)], 2,
                                                drop_all_correct=False, drop_all_wrong=False, seed=0,
                                                order="entropy")))
    assert load_curriculum(path, {"a", "b"}) == [["a"], ["b"]]
    with pytest.raises(ValueError, match="not in the training data"):
        load_curriculum(path, {"a"})


def test_schedule_by_step_fraction_reaches_every_stage():
    schedule = StageSchedule(num_stages=3, max_steps=9)
    assert [schedule.stage_for_step(s) for s in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [t["step"] for t in schedule.transitions] == [3, 6]


def test_schedule_plan_matches_the_steps_it_takes():
    schedule = StageSchedule(num_stages=3, max_steps=16)
    plan = schedule.plan([22, 21, 21])
    assert plan == "stage 1 (22 questions) steps 1-6, stage 2 (+21 questions) steps 7-11, stage 3 (+21 questions) steps 12-16"
    taken = [schedule.stage_for_step(s) for s in range(16)]
    assert [taken.count(k) for k in range(3)] == [6, 5, 5]
    assert StageSchedule(1, 16).plan([64]) == "stage 1 (64 questions) steps 1-16"
    assert StageSchedule(2, 4, advance="reward", reward_threshold=0.5).plan([1, 1]).endswith(
        "; a stage ends early once its last 3 steps average reward >= 0.5")


def test_schedule_advances_early_on_reward():
    schedule = StageSchedule(num_stages=3, max_steps=30, advance="reward", reward_threshold=0.5)
    stages = []
    for step in range(6):
        stages.append(schedule.stage_for_step(step))
        schedule.record_reward(0.9)
    assert stages == [0, 0, 0, 1, 1, 1]  # after 3 steps above the threshold, not at step 10
    assert schedule.transitions[0] == {"step": 3, "from": 0, "to": 1, "reason": "reward"}


def test_sampler_pool_grows_and_resumes_identically():
    stages = [["a", "b"], ["c", "d"], ["e", "f"]]
    sampler = CurriculumSampler(stages, seed=1)
    first = sampler.next_ids(2, stage=0)
    assert sorted(first) == ["a", "b"]
    state = sampler.state()
    expected = [sampler.next_ids(3, stage=1) for _ in range(3)]
    resumed = CurriculumSampler(stages, seed=1)
    resumed.load_state(state)
    assert [resumed.next_ids(3, stage=1) for _ in range(3)] == expected
    seen = [i for ids in expected for i in ids]
    assert set(seen) == {"a", "b", "c", "d"}  # stage 1 samples stages 0 and 1
    assert sorted(seen[:4]) == ["a", "b", "c", "d"]  # every pool item once before repeats
