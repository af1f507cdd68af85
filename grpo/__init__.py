"""GRPO fine-tuning of small reasoning models, one DVC stage at a time."""
