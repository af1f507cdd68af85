"""Fast sampling for decoder-only Qwen2/Llama-layout models: a preallocated (static) KV cache, one
decode step that reads and writes only fixed buffers, and on CUDA that step captured as CUDA graphs.

Why not ``model.generate``: at the R1-Distill-1.5B shape a decode step is ~200 small kernels, and HF
launches them from Python with host syncs in between, so a step costs tens of milliseconds whatever
the batch (DESIGN.md: nf4 generate reaches 317 tok/s at batch 64, 0.3% of the bandwidth floor). Here
the whole step (28 layers, LM head, temperature / top-k / top-p, sampling, EOS bookkeeping, writing
the token) is one graph replay; the host syncs only every ``sync_every`` steps to stop early.

Weights: every linear layer runs as a dense matmul in the compute dtype. A bitsandbytes 4-bit base is
de-quantised once and cached (grpo.model.dequant, the copy ``dense_base`` also uses); LoRA layers are
either folded into a separate dense copy of that layer at each ``generate`` (``merge_lora=True``: only
the LoRA-targeted layers are copied, e.g. q/k/v/o) or applied unmerged at run time (no extra copy).

Attention is computed explicitly (grouped-query matmuls, fp32 softmax) over the cache up to a length
bucket, one graph per bucket, so early steps do not read the empty end of the cache. Sampling draws
``argmax(p / E)`` with ``E ~ Exp(1)`` (an exact sample of ``p``, graph-safe; ``multinomial`` is not).
The numbers are the model's; the random stream is not HF's, so sampled (not greedy) ids differ from
``generate`` with the same seed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from grpo.model.dequant import _dense_weight, _linear4bit_modules
from grpo.model.lora import LoRALinear

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mistral", "qwen3")


@dataclass
class _Linear:
    """One linear layer as plain tensors: ``x @ weight.T + bias (+ LoRA branch when unmerged)``."""

    module: torch.nn.Module  # the model's module (LoRALinear or the base), read again at each refresh
    weight: Tensor | None = None
    bias: Tensor | None = None
    lora: tuple[Tensor, Tensor, float] | None = None

    def __call__(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.lora is not None:
            a, b, scale = self.lora
            y = y + (F.linear(F.linear(x.float(), a), b) * scale).to(y.dtype)
        return y


def _base_dense(base: torch.nn.Module, quantised: set[int], dtype: torch.dtype) -> Tensor:
    if id(base) in quantised:
        return _dense_weight(base)
    return base.weight if base.weight.dtype == dtype else base.weight.to(dtype)


def supports(model: torch.nn.Module) -> str | None:
    """None when ``StaticDecoder`` can run ``model``, else the reason it cannot."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {cfg.model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        return "sliding-window attention"
    if getattr(cfg, "rope_scaling", None) and "dynamic" in str(cfg.rope_scaling):
        return "dynamic RoPE scaling"
    return None


class StaticDecoder:
    """Prefill plus graph-replayed decode over the modules of ``model`` (weights shared, not copied,
    except the merged LoRA layers). Call ``refresh()`` after the LoRA weights change."""

    def __init__(self, model: torch.nn.Module, *, merge_lora: bool = True, cuda_graphs: bool | None = None,
                 bucket: int = 128, sync_every: int = 32) -> None:
        reason = supports(model)
        if reason is not None:
            raise ValueError(f"StaticDecoder cannot run this model: {reason}")
        self.model = model
        self.body = model.get_decoder()
        self.device = model.get_input_embeddings().weight.device
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.bucket, self.sync_every, self.merge_lora = bucket, sync_every, merge_lora
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scaling = self.head_dim ** -0.5
        self._quantised = {id(m) for m in _linear4bit_modules(model)}
        self.dtype = self._compute_dtype()
        self.layers = [{name: _Linear(self._module(layer, name)) for name in
                        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}
                       for layer in self.body.layers]
        self.refresh()

    def _compute_dtype(self) -> torch.dtype:
        for m in self.model.modules():
            if id(m) in self._quantised:
                return m.compute_dtype or torch.bfloat16
        return self.model.get_input_embeddings().weight.dtype

    @staticmethod
    def _module(layer: torch.nn.Module, name: str) -> torch.nn.Module:
        parent = layer.self_attn if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else layer.mlp
        return getattr(parent, name)

    @torch.no_grad()
    def refresh(self) -> None:
        """Re-read LoRA weights: refold merged layers, or point unmerged layers at the live parameters."""
        for layer in self.layers:
            for lin in layer.values():
                m = lin.module
                base = m.base if isinstance(m, LoRALinear) else m
                dense = _base_dense(base, self._quantised, self.dtype)
                lin.bias = None if base.bias is None else base.bias.to(self.dtype)
                lora_on = isinstance(m, LoRALinear) and not m.disabled
                if lora_on and self.merge_lora:
                    merged = (dense.float() + m.delta_weight().to(dense.device)).to(self.dtype)
                    if lin.weight is None or lin.weight is dense or lin.weight.shape != merged.shape:
                        lin.weight = merged
                    else:
                        lin.weight.copy_(merged)  # same storage: captured graphs stay valid
                    lin.lora = None
                else:
                    lin.weight = dense
                    lin.lora = (m.lora_A, m.lora_B, m.scaling) if lora_on else None

    # --- the forward pass ------------------------------------------------------------------
    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """q [B, T, Hq, D]; k, v [B, Hkv, L, D]; mask [B, T, L] bool (True = may attend) -> [B, T, Hq*D]."""
        b, t = q.shape[:2]
        g = self.n_heads // self.n_kv
        # query head h reads kv head h // g (HF's repeat_kv): group the heads instead of copying k/v
        q = q.view(b, t, self.n_kv, g, self.head_dim).permute(0, 2, 3, 1, 4).reshape(b, self.n_kv, g * t, self.head_dim)
        scores = torch.matmul(q, k.transpose(-1, -2)).float().mul_(self.scaling)
        scores = scores.view(b, self.n_kv, g, t, -1)
        # a large finite negative, not -inf: a row with nothing to attend to (a left pad) stays finite
        scores.masked_fill_(~mask[:, None, None], torch.finfo(torch.float32).min)
        probs = scores.softmax(-1).to(v.dtype).view(b, self.n_kv, g * t, -1)
        out = torch.matmul(probs, v).view(b, self.n_kv, g, t, self.head_dim)
        return out.permute(0, 3, 1, 2, 4).reshape(b, t, self.n_heads * self.head_dim)

    def _forward(self, ids: Tensor, positions: Tensor, slots: Tensor, mask: Tensor, length: int) -> Tensor:
        """Run ``ids`` [B, T] at ``positions`` [B, T], writing K/V into cache slots ``slots`` [T] and
        attending over cache slots [0, length); returns the last position's final hidden state [B, H]."""
        x = self.body.embed_tokens(ids).to(self.dtype)
        b, t = ids.shape
        cos, sin = self.body.rotary_emb(x, positions)
        cos, sin = cos[:, :, None], sin[:, :, None]
        for i, (layer, w) in enumerate(zip(self.body.layers, self.layers)):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = w["q_proj"](h).view(b, t, self.n_heads, self.head_dim)
            k = w["k_proj"](h).view(b, t, self.n_kv, self.head_dim)
            v = w["v_proj"](h).view(b, t, self.n_kv, self.head_dim)
            if hasattr(attn, "q_norm"):  # Qwen3
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            self.k_cache[i].index_copy_(2, slots, k.transpose(1, 2))
            self.v_cache[i].index_copy_(2, slots, v.transpose(1, 2))
            a = self._attend(q, self.k_cache[i][:, :, :length], self.v_cache[i][:, :, :length], mask[:, :, :length])
            x = x + w["o_proj"](a)
            h = layer.post_attention_layernorm(x)
            mlp = layer.mlp
            x = x + w["down_proj"](mlp.act_fn(w["gate_proj"](h)) * w["up_proj"](h))
        return self.body.norm(x[:, -1])

    def _next_token(self, hidden: Tensor) -> Tensor:
        """Sample (or argmax) the next ids from final hidden states [B, H], as HF's warpers order it:
        temperature, then top-k, then top-p."""
        logits = self.model.get_output_embeddings()(hidden).float()
        if self.greedy:
            return logits.argmax(-1)
        logits = logits / self.temperature
        if self.top_k > 0:
            kth = torch.topk(logits, min(self.top_k, logits.shape[-1])).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -math.inf)
        if self.top_p < 1.0:
            sorted_logits, order = logits.sort(-1)  # ascending, as HF's TopPLogitsWarper
            cumulative = sorted_logits.softmax(-1).cumsum(-1)
            drop_sorted = cumulative <= 1 - self.top_p
            drop_sorted[:, -1] = False  # keep at least the most likely token
            logits = logits.masked_fill(drop_sorted.scatter(1, order, drop_sorted), -math.inf)
        probs = logits.softmax(-1)
        return (probs / torch.empty_like(probs).exponential_(1)).argmax(-1)

    def _decode_step(self, length: int) -> None:
        """One token for every row, reading and writing only the persistent state buffers."""
        self.valid.index_fill_(1, self.slot, True)
        hidden = self._forward(self.tokens[:, None], self.positions[:, None], self.slot,
                               self.valid[:, None, :], length)
        self._emit(self._next_token(hidden))
        self.slot += 1
        self.positions += 1

    def _emit(self, token: Tensor) -> None:
        token = torch.where(self.finished, self.pad_id, token)
        self.out.index_copy_(1, self.step, token[:, None])
        self.finished |= (token[:, None] == self.stop_ids[None]).any(-1)
        self.tokens.copy_(token)
        self.step += 1

    # --- generation ------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, input_ids: Tensor, attention_mask: Tensor, *, max_new_tokens: int, stop_ids: list[int],
                 pad_id: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0) -> Tensor:
        """Left-padded prompts [B, P] -> new ids [B, max_new_tokens] (``pad_id`` after a row's stop id).
        The caller seeds the RNG; one host sync every ``sync_every`` tokens (stop once all rows ended)."""
        self.greedy, self.temperature, self.top_p, self.top_k = temperature == 0, temperature, top_p, top_k
        b, p = input_ids.shape
        total = p + max_new_tokens
        dev = self.device
        self.k_cache = [torch.empty(b, self.n_kv, total, self.head_dim, dtype=self.dtype, device=dev)
                        for _ in self.layers]
        self.v_cache = [torch.empty_like(c) for c in self.k_cache]
        prompt_mask = attention_mask.to(dev).bool()
        self.valid = torch.zeros(b, total, dtype=torch.bool, device=dev)
        self.valid[:, :p] = prompt_mask
        self.stop_ids = torch.tensor(stop_ids, dtype=torch.long, device=dev)
        self.pad_id = torch.tensor(pad_id, device=dev)
        self.out = torch.full((b, max_new_tokens), pad_id, dtype=torch.long, device=dev)
        self.finished = torch.zeros(b, dtype=torch.bool, device=dev)
        self.tokens = torch.zeros(b, dtype=torch.long, device=dev)
        self.step = torch.zeros(1, dtype=torch.long, device=dev)
        try:
            # prefill: HF's positions for left padding (cumsum of the mask - 1, pads at 1)
            positions = (prompt_mask.long().cumsum(-1) - 1).masked_fill_(~prompt_mask, 1)
            causal = torch.ones(p, p, dtype=torch.bool, device=dev).tril_()
            mask = prompt_mask[:, None, :] & causal[None]
            hidden = self._forward(input_ids.to(dev), positions, torch.arange(p, device=dev), mask, p)
            self._emit(self._next_token(hidden))
            self.positions = positions[:, -1] + 1
            self.slot = torch.full((1,), p, dtype=torch.long, device=dev)
            steps = self._graphs(p, total) if self.cuda_graphs else None
            for t in range(1, max_new_tokens):
                if t % self.sync_every == 0 and bool(self.finished.all()):
                    break
                length = min(total, -(-(p + t) // self.bucket) * self.bucket)
                if steps is None:
                    self._decode_step(length)
                else:
                    steps[length].replay()
            return self.out
        finally:
            self.k_cache = self.v_cache = []  # the cache and graphs go with this call

    def _graphs(self, p: int, total: int) -> dict[int, torch.cuda.CUDAGraph]:
        """Capture one decode step per cache-length bucket. Capturing runs the step, so the state it
        advances is saved first and restored after (the K/V it wrote at slot p is rewritten later)."""
        state = [t.clone() for t in (self.valid, self.out, self.finished, self.tokens, self.step,
                                     self.positions, self.slot)]
        lengths = sorted({min(total, -(-(p + t) // self.bucket) * self.bucket) for t in range(1, total - p)})
        graphs: dict[int, torch.cuda.CUDAGraph] = {}
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for length in lengths:  # warm-up outside capture (cuBLAS handles, workspaces, RNG state)
                self._decode_step(length)
        torch.cuda.current_stream().wait_stream(side)
        for length in lengths:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._decode_step(length)
            graphs[length] = graph
        for live, saved in zip((self.valid, self.out, self.finished, self.tokens, self.step,
                                self.positions, self.slot), state):
            live.copy_(saved)
        return graphs


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's apply_rotary_pos_emb on [B, T, heads, D] with cos/sin [B, T, 1, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
