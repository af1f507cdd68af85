"""Fast sampling for decoder-only Qwen2/Llama-layout models: a preallocated (static) KV cache, one
decode step that reads and writes only fixed buffers, and on CUDA that step captured as CUDA graphs.

Why not ``model.generate``: at the R1-Distill-1.5B shape HF launches well over a thousand small
kernels a decode step from Python, so a step costs tens of milliseconds whatever the batch
(DESIGN.md: nf4 generate reaches 317 tok/s at batch 64, 0.3% of the bandwidth floor). Here the whole
step (28 layers, LM head, temperature / top-k / top-p, sampling, EOS bookkeeping, writing the token)
is one graph replay; the host syncs only every ``sync_every`` steps to stop early. Inside the graph
the kernels still run one after another, so on CUDA each layer's two halves are torch.compile'd to
fuse the norm / RoPE / softmax / SwiGLU elementwise work (the first call compiles, ~a minute).

Weights: every linear layer runs as a dense matmul in the compute dtype. A bitsandbytes 4-bit base is
de-quantised once and cached (grpo.model.dequant, the copy ``dense_base`` also uses); q/k/v run as one
concatenated matmul. LoRA layers are either folded into that concatenated copy at each ``generate``
(``merge_lora=True``: the copy exists anyway, so merging costs no memory beyond the LoRA-targeted
layers) or applied unmerged as two extra small matmuls per projection group.

Attention is computed explicitly (grouped-query matmuls, fp32 softmax) over the cache up to a length
bucket, one graph per bucket, so early steps do not read the empty end of the cache. Sampling draws
``argmax(p / E)`` with ``E ~ Exp(1)`` (an exact sample of ``p``, graph-safe; ``multinomial`` is not).
The numbers are the model's; the random stream is not HF's, so sampled (not greedy) ids differ from
``generate`` with the same seed.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from grpo.model.dequant import dense_weight, drop_dense_copies, linear4bit_modules
from grpo.model.lora import LoRALinear

CACHE_BUCKET = 128  # KV cache lengths are multiples of this: one captured graph (and compile) per bucket

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mistral", "qwen3")


def _dense(module: torch.nn.Module, quantised: set[int], dtype: torch.dtype) -> Tensor:
    """The frozen base weight of a linear layer in the compute dtype (4-bit: the cached dense copy)."""
    base = module.base if isinstance(module, LoRALinear) else module
    if id(base) in quantised:
        return dense_weight(base)
    return base.weight if base.weight.dtype == dtype else base.weight.to(dtype)


def _bias(module: torch.nn.Module, dtype: torch.dtype) -> Tensor | None:
    base = module.base if isinstance(module, LoRALinear) else module
    return None if base.bias is None else base.bias.to(dtype)


def _lora_on(module: torch.nn.Module) -> bool:
    return isinstance(module, LoRALinear) and not module.disabled


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """HF's Qwen2/Llama RMSNorm, op for op (fp32 statistics, cast back, then scale)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _project_qkv(x: Tensor, cos: Tensor, sin: Tensor, w: tuple, cfg: tuple) -> tuple[Tensor, Tensor, Tensor]:
    """Layer part 1: norm, fused q/k/v projection (+ LoRA), q/k norms (Qwen3), RoPE.
    Returns q [B, T, Hq, D] and k, v transposed for the cache [B, Hkv, T, D]."""
    ln1, qkv_w, qkv_b, lora_a, lora_b, q_norm, k_norm = w
    n_heads, n_kv, d, eps = cfg
    b, t, _ = x.shape
    h = _rms(x, ln1, eps)
    qkv = F.linear(h, qkv_w, qkv_b)
    if lora_a is not None:  # q/k/v adapters as one A (stacked) and one block-diagonal B, scale folded in
        qkv = qkv + F.linear(F.linear(h.float(), lora_a), lora_b).to(qkv.dtype)
    q, k, v = qkv.split([n_heads * d, n_kv * d, n_kv * d], dim=-1)
    q, k, v = q.view(b, t, n_heads, d), k.view(b, t, n_kv, d), v.view(b, t, n_kv, d)
    if q_norm is not None:
        q, k = _rms(q, q_norm, eps), _rms(k, k_norm, eps)
    return _rope(q, cos, sin), _rope(k, cos, sin).transpose(1, 2), v.transpose(1, 2)


def _attend_and_mlp(x: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, w: tuple, cfg: tuple) -> Tensor:
    """Layer part 2: grouped-query attention over the cache k, v [B, Hkv, L, D] where ``mask`` [B, T, L]
    allows, output projection (+ LoRA), residual, norm, SwiGLU MLP, residual."""
    o_w, o_b, lora_a, lora_b, ln2, gate_w, up_w, down_w = w
    n_heads, n_kv, d, eps = cfg
    b, t = q.shape[:2]
    g = n_heads // n_kv
    # query head h reads kv head h // g (HF's repeat_kv): group the heads instead of copying k/v
    q = q.view(b, t, n_kv, g, d).permute(0, 2, 3, 1, 4).reshape(b, n_kv, g * t, d)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * (d ** -0.5)
    scores = scores.view(b, n_kv, g, t, -1)
    # a large finite negative, not -inf: a row with nothing to attend to (a left pad) stays finite
    scores = scores.masked_fill(~mask[:, None, None], torch.finfo(torch.float32).min)
    probs = scores.softmax(-1).to(v.dtype).view(b, n_kv, g * t, -1)
    a = torch.matmul(probs, v).view(b, n_kv, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, n_heads * d)
    o = F.linear(a, o_w, o_b)
    if lora_a is not None:
        o = o + F.linear(F.linear(a.float(), lora_a), lora_b).to(o.dtype)
    x = x + o
    h = _rms(x, ln2, eps)
    return x + F.linear(F.silu(F.linear(h, gate_w)) * F.linear(h, up_w), down_w)


def supports(model: torch.nn.Module) -> str | None:
    """None when ``StaticDecoder`` can run ``model``, else the reason it cannot."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {cfg.model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        return "sliding-window attention"
    if getattr(cfg, "rope_scaling", None) and "dynamic" in str(cfg.rope_scaling):
        return "dynamic RoPE scaling"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (SwiGLU with silu only)"
    return None


class StaticDecoder:
    """Prefill plus graph-replayed decode over the weights of ``model`` (dense copies where the base is
    4-bit, merged copies of LoRA layers when ``merge_lora``). Call ``refresh()`` after LoRA changes.

    On CUDA each layer's two halves are compiled by torch.compile (``compile``) so that the norm, RoPE,
    softmax and SwiGLU elementwise work fuses into a few kernels: with ~45 small kernels a layer a
    decode step is launch-bound even inside a CUDA graph."""

    def __init__(self, model: torch.nn.Module, *, merge_lora: bool = True, cuda_graphs: bool | None = None,
                 compile: bool | None = None, bucket: int = CACHE_BUCKET, sync_every: int = 32) -> None:
        reason = supports(model)
        if reason is not None:
            raise ValueError(f"StaticDecoder cannot run this model: {reason}")
        self.model = model
        self.body = model.get_decoder()
        self.device = model.get_input_embeddings().weight.device
        on_gpu = self.device.type == "cuda"
        self.cuda_graphs = on_gpu if cuda_graphs is None else cuda_graphs
        self.bucket, self.sync_every, self.merge_lora = bucket, sync_every, merge_lora
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.cfg = (self.n_heads, self.n_kv, self.head_dim, float(cfg.rms_norm_eps))
        self._quantised = {id(m) for m in linear4bit_modules(model)}
        self.dtype = self._compute_dtype()
        use_compile = on_gpu if compile is None else compile
        if use_compile:
            # each new (batch, cache size) recompiles the layer halves once; past dynamo's default limit
            # of 8 it would silently fall back to eager (seen in bench/gpu_bench.py's many shapes)
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self._part1 = torch.compile(_project_qkv) if use_compile else _project_qkv
        self._part2 = torch.compile(_attend_and_mlp) if use_compile else _attend_and_mlp
        self.weights: list[tuple[tuple, tuple]] = []
        self.refresh()

    def _compute_dtype(self) -> torch.dtype:
        for m in self.model.modules():
            if id(m) in self._quantised:
                return m.compute_dtype or torch.bfloat16
        return self.model.get_input_embeddings().weight.dtype

    @torch.no_grad()
    def refresh(self) -> None:
        """(Re)build each layer's weight tuples from the live modules: refolds merged LoRA, re-reads
        unmerged LoRA. Tensors are rebuilt, so graphs captured before are stale (generate recaptures)."""
        dt, merged = self.dtype, self.merge_lora
        weights = []
        for layer in self.body.layers:
            at, mlp = layer.self_attn, layer.mlp
            qkv = [at.q_proj, at.k_proj, at.v_proj]

            def dense(m):
                w = _dense(m, self._quantised, dt)
                return (w.float() + m.delta_weight().to(w.device)).to(dt) if merged and _lora_on(m) else w

            qkv_w = torch.cat([dense(m) for m in qkv])
            biases = [_bias(m, dt) for m in qkv]
            qkv_b = None if all(b is None for b in biases) else torch.cat(
                [torch.zeros(m.out_features, dtype=dt, device=qkv_w.device) if b is None else b
                 for m, b in zip(qkv, biases)])
            qkv_lora = (None, None) if merged else _stacked_lora(qkv)
            o_lora = (None, None) if merged else _stacked_lora([at.o_proj])
            q_norm = getattr(at, "q_norm", None)
            k_norm = getattr(at, "k_norm", None)
            part1 = (layer.input_layernorm.weight, qkv_w, qkv_b, *qkv_lora,
                     None if q_norm is None else q_norm.weight, None if k_norm is None else k_norm.weight)
            part2 = (dense(at.o_proj), _bias(at.o_proj, dt), *o_lora, layer.post_attention_layernorm.weight,
                     _dense(mlp.gate_proj, self._quantised, dt), _dense(mlp.up_proj, self._quantised, dt),
                     _dense(mlp.down_proj, self._quantised, dt))
            weights.append((part1, part2))
        self.weights = weights

    def release(self) -> None:
        """Free the dense and merged weight copies until the next ``refresh`` (re-de-quantising a
        4-bit base costs milliseconds; keeping the copy costs its memory during training)."""
        self.weights = []
        drop_dense_copies(self.model)

    # --- the forward pass ------------------------------------------------------------------
    def _forward(self, ids: Tensor, positions: Tensor, slots: Tensor, mask: Tensor, length: int,
                 eager: bool = False) -> Tensor:
        """Run ``ids`` [B, T] at ``positions`` [B, T], writing K/V into cache slots ``slots`` [T] and
        attending over cache slots [0, length) where ``mask`` [B, T, >=length] allows; returns the last
        position's final hidden state [B, H]. ``eager`` skips the compiled parts (prefill's shapes)."""
        part1, part2 = (_project_qkv, _attend_and_mlp) if eager else (self._part1, self._part2)
        x = self.body.embed_tokens(ids).to(self.dtype)
        cos, sin = self.body.rotary_emb(x, positions)
        cos, sin = cos[:, :, None], sin[:, :, None]
        mask = mask[:, :, :length]
        for i, (w1, w2) in enumerate(self.weights):
            q, k, v = part1(x, cos, sin, w1, self.cfg)
            self.k_cache[i].index_copy_(2, slots, k)
            self.v_cache[i].index_copy_(2, slots, v)
            x = part2(x, q, self.k_cache[i][:, :, :length], self.v_cache[i][:, :, :length], mask, w2, self.cfg)
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
        if not self.weights:  # released since the last call
            self.refresh()
        b, p = input_ids.shape
        # cache size rounded up to the bucket: fewer distinct shapes, so fewer recompiles
        total = -(-(p + max_new_tokens) // self.bucket) * self.bucket
        dev = self.device
        # zeros, not empty: masked slots get probability 0, and 0 * NaN garbage would still be NaN
        self.k_cache = [torch.zeros(b, self.n_kv, total, self.head_dim, dtype=self.dtype, device=dev)
                        for _ in self.weights]
        self.v_cache = [torch.zeros_like(c) for c in self.k_cache]
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
            hidden = self._forward(input_ids.to(dev), positions, torch.arange(p, device=dev), mask, p, eager=True)
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
        lengths = sorted({min(total, -(-(p + t) // self.bucket) * self.bucket) for t in range(1, self.out.shape[1])})
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


def _stacked_lora(modules: list[torch.nn.Module]) -> tuple[Tensor | None, Tensor | None]:
    """Unmerged LoRA of several projections that share an input and whose outputs are concatenated:
    A stacked [sum r, in] and B block-diagonal [sum out, sum r] with each scaling folded in, so the
    adapters of q, k and v cost two small matmuls, not six. (None, None) when none is active."""
    if not any(_lora_on(m) for m in modules):
        return None, None
    first = next(m for m in modules if _lora_on(m))
    device = first.lora_A.device
    a_parts, b_blocks = [], []
    for m in modules:
        if _lora_on(m):
            a_parts.append(m.lora_A.float())
            b_blocks.append(m.lora_B.float() * m.scaling)
        else:
            b_blocks.append(torch.zeros(m.out_features, 0, device=device))
    return torch.cat(a_parts), torch.block_diag(*b_blocks)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's apply_rotary_pos_emb on [B, T, heads, D] with cos/sin [B, T, 1, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
