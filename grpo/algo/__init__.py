"""The GRPO algorithm as pure tensor functions: advantages, token log-probs and entropies, the
entropy keep-mask and the clipped policy loss. No model, tokenizer or device knowledge."""
from grpo.algo.advantages import AdvantageResult, compute_advantages, skip_zero_variance
from grpo.algo.entropy_mask import entropy_keep_mask, entropy_threshold, keep_mask_from_threshold
from grpo.algo.logprobs import chunked_token_logprobs_and_entropy, naive_token_logprobs_and_entropy
from grpo.algo.loss import LOSS_TYPES, LossOutput, grpo_loss, loss_normaliser

__all__ = [
    "LOSS_TYPES",
    "AdvantageResult",
    "LossOutput",
    "chunked_token_logprobs_and_entropy",
    "compute_advantages",
    "entropy_keep_mask",
    "entropy_threshold",
    "grpo_loss",
    "keep_mask_from_threshold",
    "loss_normaliser",
    "naive_token_logprobs_and_entropy",
    "skip_zero_variance",
]
