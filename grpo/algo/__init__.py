"""The GRPO algorithm as pure tensor functions: advantages, token log-probs and entropies, the
entropy keep-mask and the clipped policy loss. No model, tokenizer or device knowledge."""
