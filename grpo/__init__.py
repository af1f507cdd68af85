"""GRPO fine-tuning of small reasoning models, one DVC stage at a time."""
from grpo.hardware import separate_compile_cache

separate_compile_cache()  # before anything compiles: an imitated AVX2 host must not share compiled code
