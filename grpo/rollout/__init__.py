"""Generation engines behind one interface (grpo/rollout/base.py, ``GenerationEngine``): native
transformers (native.py) and vLLM (vllm_engine.py), built by ``make_engine`` (engines.py).

No re-exports: importing the interface does not import the engines."""
