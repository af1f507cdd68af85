"""Generation engines behind one interface (``GenerationEngine``): native transformers and vLLM.

vLLM is imported only when a VLLMEngine is built, so this package imports without it."""
from grpo.rollout.base import Completion, GenerationEngine, SamplingParams, make_engine

__all__ = ["Completion", "GenerationEngine", "SamplingParams", "make_engine"]
