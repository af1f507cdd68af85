"""Answer extraction, answer equivalence (numeric rules, then math-verify) and GRPO reward functions."""
from grpo.verify.equivalence import (
    ANSWER_TYPES,
    Verdict,
    answers_equivalent,
    is_equivalent,
    judge,
    normalize_number,
    says_unanswerable,
)
from grpo.verify.extract import MODES, clean_answer, extract_answer, last_boxed
from grpo.verify.rewards import REWARD_FUNCTIONS, RewardResult, Rewards, compute_rewards

__all__ = [
    "ANSWER_TYPES", "MODES", "REWARD_FUNCTIONS", "RewardResult", "Rewards", "Verdict", "answers_equivalent",
    "clean_answer", "compute_rewards", "extract_answer", "is_equivalent", "judge", "last_boxed",
    "normalize_number", "says_unanswerable",
]
