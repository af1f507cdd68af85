"""A memory plan for one training run: estimated bytes per component and the peak of each phase.

Closed-form, from the architecture (``Arch``) and the train params; nothing is allocated. The phases are
the two a GRPO step alternates between, and everything that stays resident counts in both:

- resident: the frozen base (nf4 linear weights at 4.125 bits with double quantisation, embeddings and
  LM head in the compute dtype; or every weight in the compute dtype), the dense copy of the 4-bit
  linear weights that ``train.dense_generation`` caches for HF ``generate``, and the LoRA parameters
  with their fp32 gradients and AdamW moments (16 bytes a parameter, grpo/model/lora.py keeps LoRA in fp32);
- generation: the KV cache of ``generation_batch_size`` sequences of prompt + response tokens, the
  last-step logits (model dtype, then fp32 for sampling) and the prompt pass (prefill: the MLP's three
  intermediates and the attention scores over the cache for every prompt token). On CUDA the static
  decoder (grpo/rollout/static_decode.py) also holds ``decoder_copy`` while it generates: the dense
  copy of the 4-bit linear weights, q/k/v concatenated, and o_proj with LoRA merged; it frees them
  before training;
- training: one micro-batch of ``train_batch_size`` sequences: with gradient checkpointing each layer's
  input is kept and one layer's activations are live at a time (without it, every layer's are);
  attention is assumed memory-efficient (no T x T scores); log-probs come from ``logprob_chunk_size``
  tokens of logits at a time: one buffer in the compute dtype with the fused Triton kernel on CUDA
  (grpo/kernels), about three fp32 ones with the PyTorch path (grpo/algo/logprobs.py).

bench/RESULTS.md compares the plan with the peaks measured at the 8 GB preset's shape on an H200.

Biases and norm weights (well under 1% of a model) are left out. It is a planning estimate, not a
measurement: allocator fragmentation and kernels' workspaces come on top (the check adds a fixed
runtime allowance on CUDA).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from grpo.config import TrainParams
from grpo.rollout.static_decode import CACHE_BUCKET

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# nf4 with double quantisation: 4 bits + an 8-bit absmax per 64 weights + an fp32 per 256 absmax blocks
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
CUDA_RUNTIME_BYTES = int(0.75 * GIB)  # CUDA context, cuBLAS workspaces, allocator slack


@dataclass(frozen=True)
class Arch:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool

    @classmethod
    def from_config(cls, cfg: dict) -> "Arch":
        """From a HF ``config.json`` mapping (missing head_dim / kv heads get the usual defaults)."""
        heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each decoder layer's projections, by the module name LoRA targets use."""
        h, q, kv, i = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim, self.intermediate_size
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    @property
    def linear_params(self) -> int:
        return self.num_hidden_layers * sum(a * b for a, b in self.linear_shapes().values())

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)


# Architectures of the presets' hub models, for planning before the weights are downloaded.
KNOWN_ARCHS: dict[str, Arch] = {
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": Arch(151936, 1536, 8960, 28, 12, 2, 128, False),
    "meta-llama/Llama-3.1-8B-Instruct": Arch(128256, 4096, 14336, 32, 32, 8, 128, False),
    "smollm2-135m-instruct": Arch(49152, 576, 1536, 30, 9, 3, 64, True),
}


def resolve_arch(source: str, base_dir: Path = Path("models/base")) -> Arch:
    """The architecture of ``model.source``: models/base/config.json when that folder was built from
    this source, else the source's own folder, else the table of known hub models."""
    info = base_dir / "MODEL_INFO.json"
    if info.is_file() and json.loads(info.read_text()).get("source") == source:
        return Arch.from_config(json.loads((base_dir / "config.json").read_text()))
    if (Path(source).expanduser() / "config.json").is_file():
        return Arch.from_config(json.loads((Path(source).expanduser() / "config.json").read_text()))
    if source in KNOWN_ARCHS:
        return KNOWN_ARCHS[source]
    raise ValueError(f"model.source={source!r}: architecture unknown here; run `dvc repro base_model` first "
                     f"(then models/base/config.json is read) or use one of: {', '.join(KNOWN_ARCHS)}")


@dataclass(frozen=True)
class MemoryPlan:
    base_weights: int
    dense_copy: int
    lora_and_optimizer: int
    decoder_copy: int
    kv_cache: int
    sampling_logits: int
    prefill: int
    activations: int
    logprob_logits: int
    runtime: int

    @property
    def generation_peak(self) -> int:
        return sum(value for _, value in self.phase_rows("generation"))

    @property
    def training_peak(self) -> int:
        return sum(value for _, value in self.phase_rows("training"))

    @property
    def peak_phase(self) -> str:
        """The phase whose peak is the plan's peak."""
        return "generation" if self.generation_peak >= self.training_peak else "training"

    @property
    def peak(self) -> int:
        return max(self.generation_peak, self.training_peak)

    def rows(self) -> list[tuple[str, int]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self)]

    def phase_rows(self, phase: str) -> list[tuple[str, int]]:
        """The components that count in ``phase`` ("generation" or "training"): everything resident
        (weights, copies, LoRA state, runtime) plus the phase's own."""
        other = TRAINING_ONLY if phase == "generation" else GENERATION_ONLY
        return [(name, value) for name, value in self.rows() if name not in other]

GENERATION_ONLY = ("decoder_copy", "kv_cache", "sampling_logits", "prefill")
TRAINING_ONLY = ("activations", "logprob_logits")


def lora_params(arch: Arch, r: int, targets: list[str]) -> int:
    shapes = arch.linear_shapes()
    return arch.num_hidden_layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in targets)


def plan_memory(arch: Arch, p: TrainParams, *, compute_dtype: str, prompt_tokens: int, cuda: bool) -> MemoryPlan:
    """Estimate each component for params ``p`` with the resolved ``compute_dtype`` (not ``auto``)."""
    dt = DTYPE_BYTES[compute_dtype]
    shapes = arch.linear_shapes()
    static = cuda and p.generation_backend in ("auto", "static")  # the static decoder, as NativeEngine picks it
    quantised = p.quantization == "nf4"
    if quantised:
        base = int(arch.linear_params * NF4_BYTES_PER_PARAM) + arch.embedding_params * dt
    else:
        base = (arch.linear_params + arch.embedding_params) * dt
    dense = arch.linear_params * dt if quantised and p.dense_generation and not static else 0
    decoder = 0
    if static:
        qkv = sum(a * b for name, (a, b) in shapes.items() if name in ("q_proj", "k_proj", "v_proj"))
        merged_o = p.generation_merge_lora and "o_proj" in p.lora.targets
        per_layer = qkv + (shapes["o_proj"][0] * shapes["o_proj"][1] if merged_o else 0)
        decoder = (arch.linear_params if quantised else 0) * dt + arch.num_hidden_layers * per_layer * dt
    lora = lora_params(arch, p.lora.r, list(p.lora.targets)) * 16
    tokens = prompt_tokens + max(p.max_response_length, p.val_max_new_tokens)
    if static:  # the static cache is allocated whole, rounded up to its bucket
        tokens = -(-tokens // CACHE_BUCKET) * CACHE_BUCKET
    kv_per_token = 2 * arch.num_hidden_layers * arch.num_key_value_heads * arch.head_dim * dt
    kv = p.generation_batch_size * tokens * kv_per_token
    sampling = p.generation_batch_size * arch.vocab_size * (dt + 4)
    prefill = p.generation_batch_size * prompt_tokens * (
        3 * arch.intermediate_size + arch.num_attention_heads * tokens) * dt
    bt = p.train_batch_size * (prompt_tokens + p.max_response_length)
    # one layer's live activations: norms' outputs, q/k/v/attention output, the MLP's gate, up and product,
    # and the fp32 inputs the LoRA branches save; in backward, twice that (the recomputed layer and its
    # gradients), which is the peak
    q_width = arch.num_attention_heads * arch.head_dim
    kv_width = arch.num_key_value_heads * arch.head_dim
    layer = bt * ((2 * arch.hidden_size + 2 * q_width + 2 * kv_width + 3 * arch.intermediate_size) * dt
                  + sum(shapes[t][0] for t in p.lora.targets) * 4)
    if p.gradient_checkpointing:
        activations = arch.num_hidden_layers * bt * arch.hidden_size * dt + 2 * layer
    else:
        activations = arch.num_hidden_layers * layer
    fused = cuda and p.logprob_backend in ("auto", "triton") and dt == 2  # the Triton kernel's dtypes
    logits = min(p.logprob_chunk_size, bt) * arch.vocab_size * (dt if fused else 3 * 4)
    return MemoryPlan(base, dense, lora, decoder, kv, sampling, prefill, activations, logits,
                      CUDA_RUNTIME_BYTES if cuda else 0)
