"""Memory formulas: estimated bytes of each component of a GPU phase, from the architecture (``Arch``).

Closed-form; nothing is allocated. A phase's peak is the sum of its rows: what stays resident (the
base weights, LoRA and its optimiser state or a loaded adapter, cached weight copies, a runtime
allowance on CUDA) plus the phase's own. Two kinds of phase exist, and grpo/stage_plans.py maps each
stage's params onto them:

- generation (``plan_generation``, shared by sent, the train rollouts and validation, evaluate and
  ``grpo.infer``): on CUDA the static decoder (grpo/rollout/static_decode.py) holds ``decoder_copy`` while it
  generates: a dense copy of 4-bit linear weights (once: q/k/v and the MLP's gate/up are de-quantised into their
  concatenations; with ``train.generation_mlp_4bit`` the MLP is read in 4 bits and not copied; with
  ``train.dense_training`` the layers without an adapter are read from the copy kept for the run, counted resident
  as ``dense_copy``), or of an unquantised base the concatenated q/k/v and the layers whose LoRA it merges. Each
  of the ``sequences`` concurrent sequences (the decoder's slots) has a KV cache of prompt + new tokens, rounded
  up to the cache bucket; ``decode_step`` is one decode step's logits and sampling buffers (attention scores over
  the cache only where the Triton decode-attention kernel cannot take the head layout: it keeps them in registers,
  and leaves only the fp32 outputs of a long cache's shares); ``prefill`` is the prompt pass (the MLP's three
  intermediates and fp32 attention scores over the prompt, for every prompt token of the ``prefill_rows`` prompts
  it admits at once). HF ``generate`` (off CUDA, or ``generation_backend: hf``) has no decoder copy, an
  exact-length cache and memory-efficient attention.
- training (``plan_training``): one micro-batch of ``train_batch_size`` sequences: with gradient
  checkpointing each layer's input is kept and one layer's activations are live at a time (without
  it, every layer's saved set, ``saved_per_token``, is kept until backward); log-probs come from
  ``logprob_chunk_size`` tokens of logits at a time: one buffer in the compute dtype with the fused
  Triton kernel on CUDA (grpo/kernels), about three fp32 ones with the PyTorch path
  (grpo/algo/logprobs.py).

Biases and norm weights (well under 1% of a model) are left out. It is a planning estimate: allocator
fragmentation and kernels' workspaces come on top (``CUDA_RUNTIME_BYTES``). tests/test_check.py holds the
plan against the peaks measured on an H200 (bench/results/), never below them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo.config import TrainParams
from grpo.kernels.decode_attention import layout_supported, shares_bytes
from grpo.kernels.matmul_4bit import partial_bytes
from grpo.rollout.static_decode import CACHE_BUCKET

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# nf4 with double quantisation: 4 bits + an 8-bit absmax per 64 weights + an fp32 per 256 absmax blocks
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
BLOCKSIZE_4BIT = 64  # values an absmax (the loader's bitsandbytes default)
CUDA_RUNTIME_BYTES = int(0.75 * GIB)  # CUDA context, cuBLAS workspaces, allocator slack
# what GPU generation leaves unplanned when it sizes its rows in flight: cuBLAS workspaces, CUDA graph
# pools, fragmentation (grpo/rollout/budget.py), and the split-K decode projections' fp32 partial sums
# (grpo/kernels/decode_linear.partial_bytes: at most 16 KiB a program, 3 MiB on 192 multiprocessors, one
# call's at a time; not a row per sequence: it grows with the multiprocessors, not the rows), and above 16
# sequences the down projection's parts' fp32 sums (decode_linear.PARTS x hidden x 4 bytes a sequence: 24 KiB at
# hidden 1536, a thousandth of its KV cache)
GENERATION_MARGIN = int(0.5 * GIB)
LORA_TRAIN_BYTES = 16  # per LoRA parameter in training: fp32 value, gradient, AdamW's two moments
LORA_LOADED_BYTES = 4  # per LoRA parameter of a loaded adapter: the fp32 value (grpo/model/lora.py)
MERGEABLE = ("q_proj", "k_proj", "v_proj", "o_proj")  # the LoRA layers the static decoder folds into its copy
# a checkpointed decoder layer's live set in backward, in eager layers' "one layer" (``plan_training``): eager keeps
# the recomputed layer and its gradients (2); compiled on CUDA (train.compile_layers), inductor frees each fused
# intermediate at its last use: 1.06 and 0.94 measured on an H100 (the 8 GB preset, micro-batches of 16, two
# builds; bench/RESULTS.md seventeenth session), planned with a margin
COMPILED_LAYER_LIVE = 1.25


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

    @property
    def kv_values_per_token(self) -> int:
        """Cached values per token: K and V of every layer."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim


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
class Phase:
    """One phase of one stage: every component that is in memory at its peak, and what scales it."""

    stage: str          # "sent", "train", "evaluate base/gsm8k", ...
    name: str           # "generation" or "training"
    rows: tuple[tuple[str, int], ...]
    knob: str           # the batch param that scales the phase, e.g. "evaluate.batch_size"
    tokens_knob: str    # the length param, e.g. "evaluate.benchmarks.aime24.max_new_tokens"
    sequences: int      # concurrent sequences (generation) or micro-batch rows (training)
    tokens: int         # new tokens (generation) or prompt + response tokens (training)
    requested: int = 0  # generation: the knob's sequences when the memory left caps them lower (else 0)

    @property
    def peak(self) -> int:
        return sum(value for _, value in self.rows)

    def row(self, name: str) -> int:
        return dict(self.rows).get(name, 0)

    def largest(self, k: int = 3) -> list[tuple[str, int]]:
        return sorted(self.rows, key=lambda kv: -kv[1])[:k]


def weight_bytes(arch: Arch, dtype: str, quantised: bool) -> int:
    """The base: nf4 linear weights with embeddings and LM head in ``dtype``, or everything in ``dtype``."""
    dt = DTYPE_BYTES[dtype]
    if quantised:
        return int(arch.linear_params * NF4_BYTES_PER_PARAM) + arch.embedding_params * dt
    return (arch.linear_params + arch.embedding_params) * dt


def lora_params(arch: Arch, r: int, targets: list[str] | tuple[str, ...]) -> int:
    shapes = arch.linear_shapes()
    return arch.num_hidden_layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in targets)


def sampling_bytes_per_logit(dtype: str, *, greedy: bool, top_p: float, top_k: int) -> int:
    """Bytes per vocabulary entry of one sequence's next-token choice in the static decoder: the LM
    head's output and its fp32 copy; sampling adds the tempered logits, probabilities, exponential
    noise and quotient; top-k a masked copy; top-p the sorted logits with int64 order, their
    probabilities and cumulative sum, two masks and a masked copy."""
    dt = DTYPE_BYTES[dtype]
    if greedy:
        return dt + 4
    return dt + 4 + 4 * 4 + (4 if top_k > 0 else 0) + (4 + 8 + 4 + 4 + 2 + 4 if top_p < 1 else 0)


def plan_generation(arch: Arch, *, dtype: str, quantised: bool, sequences: int, prompt_tokens: int,
                    new_tokens: int, static_decoder: bool, lora_targets: tuple[str, ...] = (),
                    merge_lora: bool = True, read_4bit_mlp: bool = False, kept_base: bool = False,
                    greedy: bool = False, top_p: float = 1.0, top_k: int = 0,
                    prefill_rows: int | None = None) -> dict[str, int]:
    """The generation phase's own components (bytes): decoder_copy, kv_cache, decode_step, prefill.

    ``sequences`` decode concurrently (the static decoder's slots), each with a cache of the longest
    prompt (``prompt_tokens``) + ``new_tokens``; ``prefill_rows`` prompts are prefilled at once
    (default: all ``sequences``). ``lora_targets`` are the LoRA layers on the model (merged into the
    decoder's copy when ``merge_lora``, for the layers it merges). ``read_4bit_mlp``: the decoder reads a
    4-bit MLP without LoRA in 4 bits (grpo/kernels/matmul_4bit.py): no copy of it, an fp32 absmax a block
    of 64 instead, and one layer's MLP de-quantised at a time while a prompt is prefilled; an unquantised
    base is copied as without it. ``kept_base`` (``train.dense_training``): the 4-bit layers without an
    adapter are read from the copy kept for the run (resident, not counted here; ``read_4bit_mlp`` is then
    ignored, as the decoder ignores it), the decoder copies q/k/v (concatenated) and the adapter layers."""
    dt = DTYPE_BYTES[dtype]
    shapes = arch.linear_shapes()
    prefill_rows = sequences if prefill_rows is None else prefill_rows
    tokens = prompt_tokens + new_tokens
    decoder = prefill_copy = 0
    if static_decoder:
        tokens = -(-tokens // CACHE_BUCKET) * CACHE_BUCKET  # the static cache is allocated whole, in buckets
        def size(*names: str) -> int:
            return sum(shapes[n][0] * shapes[n][1] for n in names)

        mlp = ("gate_proj", "up_proj", "down_proj")
        four_bit_mlp = (read_4bit_mlp and quantised and not kept_base  # as the decoder reads
                        and not set(mlp) & set(lora_targets))
        # a 4-bit MLP read in 4 bits is de-quantised one layer at a time while a prompt is prefilled
        prefill_copy = size(*mlp) * dt if four_bit_mlp else 0
        if quantised and not kept_base:  # every layer de-quantised once, LoRA merged into those copies
            per_layer = size(*shapes)
            if four_bit_mlp:  # no copy of the MLP: its fp32 absmax, one a block, once undone from 8 bits
                per_layer -= size(*mlp)
                decoder = arch.num_hidden_layers * size(*mlp) // BLOCKSIZE_4BIT * 4
        else:  # grpo/rollout/static_layers.py: q/k/v concatenated; MLP adapters always merged, gate with up;
            # a kept 4-bit base's adapter layers de-quantised for the decoder, merged or not
            merged_o = (merge_lora or quantised) and "o_proj" in lora_targets
            per_layer = size("q_proj", "k_proj", "v_proj") + (size("o_proj") if merged_o else 0)
            per_layer += size("gate_proj", "up_proj") if {"gate_proj", "up_proj"} & set(lora_targets) else 0
            per_layer += size("down_proj") if "down_proj" in lora_targets else 0
        decoder += arch.num_hidden_layers * per_layer * dt
    kv = sequences * tokens * arch.kv_values_per_token * dt
    logits = sequences * arch.vocab_size * sampling_bytes_per_logit(dtype, greedy=greedy, top_p=top_p, top_k=top_k)
    # explicit attention (static decoder's prefill, and its decode step where the Triton kernel cannot
    # run): scores [heads x length] go bf16 -> fp32 -> scaled -> masked -> softmax -> cast, about 10 bytes
    # a score at a time; HF generate uses memory-efficient SDPA
    attention = arch.num_attention_heads * (2 * 4 + dt) if static_decoder else 0
    fused = layout_supported(arch.head_dim, arch.num_attention_heads // arch.num_key_value_heads)
    # the Triton kernel keeps scores in registers; a long cache read in shares leaves their partial outputs
    shares = shares_bytes(sequences, arch.num_attention_heads, tokens, arch.head_dim) if static_decoder else 0
    step = logits + (shares if fused else sequences * tokens * attention)
    if static_decoder and four_bit_mlp:  # the 4-bit kernels' fp32 partial sums, one call's at a time
        step += max(partial_bytes(sequences, shapes[name][1], shapes[name][0], BLOCKSIZE_4BIT, name == "gate_proj",
                                  getattr(torch, dtype)) for name in ("gate_proj", "down_proj"))
    prefill = prefill_rows * prompt_tokens * (3 * arch.intermediate_size * dt + prompt_tokens * attention)
    prefill += prefill_copy
    return {"decoder_copy": decoder, "kv_cache": kv, "decode_step": step, "prefill": prefill}


def max_slots(arch: Arch, budget: int, **shape) -> int:
    """The most concurrent sequences whose cache, decode step and prefill fit in ``budget`` bytes
    (the memory left once the weights and the decoder's copies are in place). ``shape``: the
    keyword arguments of ``plan_generation`` other than ``sequences``; 0 when not even one fits.
    With ``prefill_rows`` given, the prefill is a fixed cost; by default it grows with the slots."""
    def cost(n: int) -> int:
        rows = plan_generation(arch, sequences=n, **shape)
        return rows["kv_cache"] + rows["decode_step"] + rows["prefill"]

    fixed, per_slot = cost(0), cost(1) - cost(0)  # every term is affine in the slots
    return max(0, (budget - fixed) // per_slot) if per_slot > 0 else 0


def generation_slots(arch: Arch, left: int, **shape) -> int:
    """The rows a GPU generate call may decode at once when ``left`` bytes remain once the weights and
    the decoder's copies are in place: ``max_slots`` less ``GENERATION_MARGIN`` (grpo/rollout/budget.py
    at run time, grpo/stage_plans.py in the plan). The engine runs min(its batch size, max(1, this))."""
    return max_slots(arch, left - GENERATION_MARGIN, **shape)


def fitted_generation(arch: Arch, requested: int, budget: int | None, resident: int,
                      **shape) -> tuple[int, dict[str, int]]:
    """(rows in flight, ``plan_generation``'s components at them) of a generate call asked for
    ``requested`` rows with ``resident`` bytes already in place; with a ``budget`` the rows are capped as
    the engine caps them (``generation_slots`` of what the budget leaves), else they are ``requested``."""
    rows = plan_generation(arch, sequences=requested, **shape)
    if budget is None:
        return requested, rows
    left = budget - resident - rows["decoder_copy"]
    in_flight = min(requested, max(1, generation_slots(arch, left, **shape)))
    return in_flight, plan_generation(arch, sequences=in_flight, **shape)


def capped_from(requested: int, in_flight: int) -> int:
    """``Phase.requested``: the knob's rows when the budget capped them, else 0."""
    return requested if in_flight < requested else 0


def saved_per_token(arch: Arch, p: TrainParams, *, dt: int, length: int) -> int:
    """Bytes one decoder layer's training forward keeps for backward, per token, as counted at the R1-1.5B
    width (bench/saved_activations.py: 103.7 KB at 256 tokens, where "one layer's live set" planned 81.4 KB
    and a micro-batch the plan passed ran out of memory on an H100): the frozen linear layers keep nothing."""
    shapes = arch.linear_shapes()
    q_width = arch.num_attention_heads * arch.head_dim
    return (3 * arch.intermediate_size * dt  # SwiGLU: the gate (SiLU's input), up, and the product down reads
            + sum(shapes[t][0] for t in p.lora.targets) * 4  # each LoRA target's fp32 input
            + len(p.lora.targets) * p.lora.r * 4  # and its rank-r intermediate
            + 2 * arch.hidden_size * 4  # both RMS norms' fp32 inputs
            + 4 * q_width * dt  # SDPA's q, k and v (widened to the query heads) and its output
            + arch.num_attention_heads * 4  # SDPA's log-sum-exp
            + length * dt)  # a row of the padding mask, at the sequence's length


def plan_training(arch: Arch, p: TrainParams, *, dtype: str, prompt_tokens: int, cuda: bool) -> dict[str, int]:
    """The training phase's own components (bytes) for one micro-batch: activations, logprob_logits."""
    dt = DTYPE_BYTES[dtype]
    shapes = arch.linear_shapes()
    bt = p.train_batch_size * (prompt_tokens + p.max_response_length)
    # one layer's live activations: norms' outputs, q/k/v/attention output, the MLP's gate, up and product,
    # and the fp32 inputs the LoRA branches save; in backward, eager, twice that (the recomputed layer and its
    # gradients), which is the peak (compiled: COMPILED_LAYER_LIVE)
    q_width = arch.num_attention_heads * arch.head_dim
    kv_width = arch.num_key_value_heads * arch.head_dim
    layer = bt * ((2 * arch.hidden_size + 2 * q_width + 2 * kv_width + 3 * arch.intermediate_size) * dt
                  + sum(shapes[t][0] for t in p.lora.targets) * 4)
    if p.gradient_checkpointing:
        live = COMPILED_LAYER_LIVE if p.compile_layers and cuda else 2
        activations = arch.num_hidden_layers * bt * arch.hidden_size * dt + int(live * layer)
    else:  # every layer's saved set until backward reaches it, and one layer's gradients
        length = prompt_tokens + p.max_response_length
        activations = arch.num_hidden_layers * bt * saved_per_token(arch, p, dt=dt, length=length) + layer
    fused = cuda and p.logprob_backend in ("auto", "triton") and dt == 2  # the Triton kernel's dtypes
    logits = min(p.logprob_chunk_size, bt) * arch.vocab_size * (dt if fused else 3 * 4)
    return {"activations": activations, "logprob_logits": logits}


def uses_static_decoder(backend: str, cuda: bool) -> bool:
    """NativeEngine's choice: the static decoder on CUDA unless the backend is ``hf``."""
    return cuda and backend in ("auto", "static")


def plan_memory(arch: Arch, p: TrainParams, *, compute_dtype: str, prompt_tokens: int, cuda: bool,
                budget: int | None = None) -> tuple[Phase, Phase]:
    """The train stage's generation (rollouts and validation) and training phases for params ``p``
    with the resolved ``compute_dtype`` (not ``auto``). With a GPU ``budget`` (bytes), the rollouts
    decode the rows that fit it, as the engine does (``generation_slots``)."""
    static = uses_static_decoder(p.generation_backend, cuda)
    quantised = p.quantization == "nf4"
    dense_bytes = arch.linear_params * DTYPE_BYTES[compute_dtype]
    # generate's cached dense copy of the 4-bit base (train.dense_generation); the static decoder frees its own
    generation_copy = quantised and p.dense_generation and not static
    # train.dense_training: the copy of the 4-bit layers without an adapter, kept for the run (grpo/model/dequant.py)
    kept_base = quantised and p.dense_training and not generation_copy
    kept_bytes = arch.num_hidden_layers * DTYPE_BYTES[compute_dtype] * sum(
        a * b for name, (a, b) in arch.linear_shapes().items() if name not in p.lora.targets)
    resident = [
        ("base_weights", weight_bytes(arch, compute_dtype, quantised)),
        ("dense_copy", dense_bytes if generation_copy else kept_bytes if kept_base else 0),
        ("lora_and_optimizer", lora_params(arch, p.lora.r, p.lora.targets) * LORA_TRAIN_BYTES),
        ("runtime", CUDA_RUNTIME_BYTES if cuda else 0),
    ]
    new_tokens = max(p.max_response_length, p.val_max_new_tokens)
    in_flight, generation = fitted_generation(
        arch, p.generation_batch_size, budget if cuda else None, sum(v for _, v in resident), dtype=compute_dtype,
        quantised=quantised, prompt_tokens=prompt_tokens, new_tokens=new_tokens, static_decoder=static,
        lora_targets=tuple(p.lora.targets), merge_lora=p.generation_merge_lora,
        read_4bit_mlp=p.generation_mlp_4bit, kept_base=kept_base,
        top_p=p.top_p, top_k=p.top_k)
    training = plan_training(arch, p, dtype=compute_dtype, prompt_tokens=prompt_tokens, cuda=cuda)
    return (
        Phase("train", "generation", tuple(resident + list(generation.items())), "train.generation_batch_size",
              "train.max_response_length", in_flight, new_tokens, capped_from(p.generation_batch_size, in_flight)),
        Phase("train", "training", tuple(resident + list(training.items())), "train.train_batch_size",
              "train.max_response_length", p.train_batch_size, prompt_tokens + p.max_response_length),
    )
