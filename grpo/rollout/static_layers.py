"""The layer maths of the static decoder (grpo/rollout/static_decode.py): one Qwen2/Llama-layout layer
as plain functions over weight tuples, so that they compile (torch.compile) and the whole decode step
can be captured as a CUDA graph.

A layer is split where the attention goes:
- ``qkv_projection``: the previous layer's MLP output added to the residual stream, the norm and the
  fused q/k/v projection (one kernel around one matmul once compiled);
- attention: on a GPU one Triton kernel per layer for a decode step (grpo/kernels/decode_attention.py),
  else ``torch_decode_attention`` (``heads``: RoPE and norms; the cache write; ``attend``: explicit
  attention), whose ``heads`` and ``attend`` prefill always runs;
- ``output_and_mlp``: output projection, residual, norm, SwiGLU MLP; its output is added by the next
  layer's ``qkv_projection``, so that residual add and norm are one kernel. With a 4-bit MLP read
  directly (``Mlp4bit``), ``output_projection`` stops at the norm and the MLP is two Triton kernels; with
  the fused dense gate/up (``DenseMlp``, where Triton runs) it stops there too, and a decode step's gate,
  up and SwiGLU are one Triton kernel before the down projection.
Where Triton runs, a decode step's q/k/v, output and down projections go through ``decode_linear``
(grpo/kernels/decode_linear.py: a split-K kernel at up to 16 rows, cuBLAS above; above 16 rows the down
projection's K in parts whose sums the next ``residual`` adds); a prompt's pass takes
cuBLAS's (``F.linear``).

Weights: every linear layer runs as a dense matmul in the compute dtype, except a 4-bit MLP read in 4
bits (``read_4bit_mlp``: a decode step reads 3.5x fewer bytes of it, and no copy is made). A
bitsandbytes 4-bit base is otherwise de-quantised into copies held by the decoder alone (freed by
``StaticDecoder.release``), or, with ``keep`` (``train.dense_training``), the layers no adapter wraps are read
from the copies kept on the model for the run, which training reads too (grpo/model/dequant.py); q/k/v run
as one concatenated matmul, and the MLP's gate and up as one wherever a copy is made anyway (a kept pair as
one copy, ``joined_dense``). LoRA layers are either folded into those copies (``merge=True``: the copy
exists anyway, so merging costs no memory beyond the LoRA-targeted layers) or applied unmerged as two
extra small matmuls per projection group; an MLP with LoRA is always copied and merged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from grpo.kernels.decode_linear import down_projection
from grpo.kernels.matmul_4bit import Weight4bit, matmul_4bit, reference_mlp, swiglu_4bit
from grpo.kernels.swiglu_dense import block_k_divides, swiglu_dense
from grpo.model.dequant import dense_weight, dequantized, joined_dense
from grpo.model.lora import LoRALinear


def _base(module: torch.nn.Module) -> torch.nn.Module:
    return module.base if isinstance(module, LoRALinear) else module


def _kept(module: torch.nn.Module, quantised: set[int], keep: bool) -> bool:
    """Is the layer read from the dense copy kept on it (``keep``: a 4-bit layer no adapter wraps)?"""
    return keep and id(_base(module)) in quantised and not _lora_on(module)


def _dense(module: torch.nn.Module, quantised: set[int], dtype: torch.dtype, keep: bool = False) -> Tensor:
    """The frozen base weight of a linear layer in the compute dtype (4-bit: a new de-quantised copy, or the
    copy kept on it, ``_kept``)."""
    base = _base(module)
    if _kept(module, quantised, keep):
        return dense_weight(base)
    if id(base) in quantised:
        return dequantized(base)
    return base.weight if base.weight.dtype == dtype else base.weight.to(dtype)


def _bias(module: torch.nn.Module, dtype: torch.dtype) -> Tensor | None:
    base = _base(module)
    return None if base.bias is None else base.bias.to(dtype)


def _lora_on(module: torch.nn.Module) -> bool:
    return isinstance(module, LoRALinear) and not module.disabled


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """HF's Qwen2/Llama RMSNorm, op for op (fp32 statistics, cast back, then scale)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


Linear = Callable[[Tensor, Tensor, Tensor | None], Tensor]  # F.linear, or a decode step's kernel for it


def residual(x: Tensor, delta: Tensor) -> Tensor:
    """``x + delta``, the residual stream after an MLP; a ``delta`` with one more dimension holds the down
    projection's fp32 partial sums over parts of K (``DenseMlp`` at a decode step's many rows), added here,
    where the next kernel reads the stream anyway, and rounded once to the stream's dtype as a matmul's output."""
    if delta.dim() == x.dim() + 1:
        delta = delta.sum(0).to(x.dtype)
    return x + delta


def qkv_projection(x: Tensor, delta: Tensor | None, w: tuple, eps: float, linear: Linear = F.linear
                   ) -> tuple[Tensor, Tensor]:
    """Layer part 1: ``x + delta`` (the previous layer's MLP output; None for the first layer), norm,
    fused q/k/v projection (+ LoRA). Returns the residual stream and qkv [B, T, (Hq + 2 Hkv) D]."""
    ln1, qkv_w, qkv_b, lora_a, lora_b = w[:5]
    if delta is not None:
        x = residual(x, delta)
    h = _rms(x, ln1, eps)
    qkv = linear(h, qkv_w, qkv_b)
    if lora_a is not None:  # q/k/v adapters as one A (stacked) and one block-diagonal B, scale folded in
        qkv = qkv + F.linear(F.linear(h.float(), lora_a), lora_b).to(qkv.dtype)
    return x, qkv


def heads(qkv: Tensor, cos: Tensor, sin: Tensor, w: tuple, cfg: tuple) -> tuple[Tensor, Tensor, Tensor]:
    """q [B, T, Hq, D] and k, v transposed for the cache [B, Hkv, T, D] from the fused projection, with
    Qwen3's q/k norms and RoPE (``cos``/``sin`` [B, T, 1, D])."""
    q_norm, k_norm = w[5:]
    n_heads, n_kv, d, eps = cfg
    b, t, _ = qkv.shape
    q, k, v = qkv.split([n_heads * d, n_kv * d, n_kv * d], dim=-1)
    q, k, v = q.view(b, t, n_heads, d), k.view(b, t, n_kv, d), v.view(b, t, n_kv, d)
    if q_norm is not None:
        q, k = _rms(q, q_norm, eps), _rms(k, k_norm, eps)
    return _rope(q, cos, sin), _rope(k, cos, sin).transpose(1, 2), v.transpose(1, 2)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, cfg: tuple) -> Tensor:
    """Grouped-query attention of q [B, T, Hq, D] over k, v [B, Hkv, L, D] where ``mask`` [B, T, L]
    allows: [B, T, Hq * D]."""
    n_heads, n_kv, d, _ = cfg
    b, t = q.shape[:2]
    g = n_heads // n_kv
    # query head h reads kv head h // g (HF's repeat_kv): group the heads instead of copying k/v
    q = q.view(b, t, n_kv, g, d).permute(0, 2, 3, 1, 4).reshape(b, n_kv, g * t, d)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * (d ** -0.5)
    scores = scores.view(b, n_kv, g, t, -1)
    # a large finite negative, not -inf: a row with nothing to attend to (a left pad) stays finite
    scores = scores.masked_fill(~mask[:, None, None], torch.finfo(torch.float32).min)
    probs = scores.softmax(-1).to(v.dtype).view(b, n_kv, g * t, -1)
    return torch.matmul(probs, v).view(b, n_kv, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, n_heads * d)


def torch_decode_attention(qkv: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor, valid: Tensor,
                           cursor: Tensor, length: int, w: tuple, cfg: tuple) -> Tensor:
    """One decode step's attention in PyTorch, the reference of grpo.kernels.decode_attention: each
    slot's new key and value go into the cache at its ``cursor``, then it attends over the cache up to
    ``length`` where ``valid`` [S, L] allows. ``cos``/``sin`` [S, 1, D]."""
    q, k, v = heads(qkv, cos[:, :, None], sin[:, :, None], w, cfg)
    at = cursor[:, None, None, None].expand(-1, k.shape[1], 1, k.shape[-1])
    k_cache.scatter_(2, at, k)
    v_cache.scatter_(2, at, v)
    return attend(q, k_cache[:, :, :length], v_cache[:, :, :length], valid[:, None, :length], cfg)


def output_projection(x: Tensor, a: Tensor, w: tuple, eps: float, linear: Linear = F.linear
                      ) -> tuple[Tensor, Tensor]:
    """Layer part 2 up to the MLP: output projection of the attention ``a`` (+ LoRA), residual, norm.
    Returns the residual stream and the MLP's input."""
    o_w, o_b, lora_a, lora_b, ln2 = w[:5]
    o = linear(a, o_w, o_b)
    if lora_a is not None:
        o = o + F.linear(F.linear(a.float(), lora_a), lora_b).to(o.dtype)
    x = x + o
    return x, _rms(x, ln2, eps)


def output_and_mlp(x: Tensor, a: Tensor, w: tuple, eps: float, linear: Linear = F.linear) -> tuple[Tensor, Tensor]:
    """Layer part 2 with a dense MLP: ``output_projection`` and the SwiGLU MLP. Returns the residual stream
    and the MLP's output, which the next ``qkv_projection`` adds."""
    x, h = output_projection(x, a, w, eps, linear)
    return x, swiglu_mlp(h, *w[5:])


def swiglu_mlp(h: Tensor, gate_up: tuple[Tensor, ...], down: Tensor) -> Tensor:
    """The dense SwiGLU MLP: ``gate_up`` is (gate and up concatenated,) or (gate, up)."""
    if len(gate_up) == 1:  # gate and up concatenated: one matmul
        gate, up = F.linear(h, gate_up[0]).chunk(2, dim=-1)
    else:
        gate, up = F.linear(h, gate_up[0]), F.linear(h, gate_up[1])
    return F.linear(F.silu(gate) * up, down)


@dataclass(frozen=True)
class Mlp4bit:
    """A SwiGLU MLP read from its 4-bit weights (grpo/kernels/matmul_4bit.py): a decode step's few rows
    in two kernels, a prompt's pass from de-quantised copies one layer at a time."""

    gate: Weight4bit
    up: Weight4bit
    down: Weight4bit

    def __call__(self, h: Tensor) -> Tensor:
        if h.shape[1] == 1:  # [B, 1, H]: a decode step
            return matmul_4bit(swiglu_4bit(h, self.gate, self.up), self.down)
        return reference_mlp(h, self.gate, self.up, self.down)


@dataclass(frozen=True)
class DenseMlp:
    """A SwiGLU MLP from the decoder's dense copies, gate and up concatenated [2I, H]: a decode step's gate,
    up and SwiGLU in one Triton kernel (grpo/kernels/swiglu_dense.py) and its down projection
    ``decode_linear.down_projection`` (the split-K kernel at up to 16 rows; above, partial sums that the next
    ``residual`` adds), a prompt's pass as cuBLAS matmuls."""

    gate_up: Tensor
    down: Tensor

    def __call__(self, h: Tensor) -> Tensor:
        if h.shape[1] == 1:  # [B, 1, H]: a decode step
            return down_projection(swiglu_dense(h, self.gate_up), self.down)
        return swiglu_mlp(h, (self.gate_up,), self.down)


MLP_KERNELS = (Mlp4bit, DenseMlp)  # MLPs that run outside the compiled layer part (they launch Triton kernels)


def mlp_4bit(mlp: torch.nn.Module, quantised: set[int]) -> Mlp4bit | None:
    """The layer's MLP as ``Mlp4bit`` when its three projections are 4-bit layers the kernels read
    (a row a whole number of blocks) and carry no active LoRA (which the dense path merges); else None."""
    projections = (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    if any(id(_base(m)) not in quantised or _lora_on(m) for m in projections):
        return None
    try:
        return Mlp4bit(*(Weight4bit.of(_base(m)) for m in projections))
    except ValueError:
        return None


@torch.no_grad()
def layer_weights(layer: torch.nn.Module, quantised: set[int], dt: torch.dtype, merge: bool,
                  read_4bit_mlp: bool = False, triton_kernels: bool = False, keep: bool = False) -> tuple[tuple, tuple]:
    """The weight tuples of ``qkv_projection`` (with ``heads``' norms) and of ``output_and_mlp`` (or of
    ``output_projection`` followed by an MLP object: an ``Mlp4bit`` with ``read_4bit_mlp`` where ``mlp_4bit``
    can read it, else a ``DenseMlp`` with ``triton_kernels`` where gate and up are one copy) for one decoder layer,
    built from its live modules (``quantised``: ids of the 4-bit linear layers; ``merge``: fold LoRA in;
    ``keep``: read the 4-bit layers no adapter wraps from the copies kept on them, ``_dense``)."""
    at, mlp = layer.self_attn, layer.mlp
    qkv = [at.q_proj, at.k_proj, at.v_proj]

    def merged(m):  # LoRA folded into a copy of the layer's dense weight
        w = _dense(m, quantised, dt, keep)
        return (w.float() + m.delta_weight().to(w.device)).to(dt) if _lora_on(m) else w

    def dense(m):
        return merged(m) if merge else _dense(m, quantised, dt, keep)

    qkv_w = torch.cat([dense(m) for m in qkv])
    biases = [_bias(m, dt) for m in qkv]
    qkv_b = None if all(b is None for b in biases) else torch.cat(
        [torch.zeros(m.out_features, dtype=dt, device=qkv_w.device) if b is None else b
         for m, b in zip(qkv, biases)])
    qkv_lora = (None, None) if merge else _stacked_lora(qkv)
    o_lora = (None, None) if merge else _stacked_lora([at.o_proj])
    q_norm = getattr(at, "q_norm", None)
    k_norm = getattr(at, "k_norm", None)
    part1 = (layer.input_layernorm.weight, qkv_w, qkv_b, *qkv_lora,
             None if q_norm is None else q_norm.weight, None if k_norm is None else k_norm.weight)
    attention_out = (dense(at.o_proj), _bias(at.o_proj, dt), *o_lora, layer.post_attention_layernorm.weight)
    four_bit = mlp_4bit(mlp, quantised) if read_4bit_mlp else None
    if four_bit is not None:
        return part1, (*attention_out, four_bit)
    # the MLP has no unmerged LoRA path: its adapters are always folded in
    gate_up = (mlp.gate_proj, mlp.up_proj)
    copied = any(id(_base(m)) in quantised or _lora_on(m) for m in gate_up)
    kept = all(_kept(m, quantised, keep) for m in gate_up)
    gate_up_w = ((joined_dense([_base(m) for m in gate_up]),) if kept else
                 (torch.cat([merged(m) for m in gate_up]),) if copied else tuple(merged(m) for m in gate_up))
    if triton_kernels and copied and block_k_divides(gate_up_w[0].shape[1]):
        return part1, (*attention_out, DenseMlp(gate_up_w[0], merged(mlp.down_proj)))
    return part1, (*attention_out, gate_up_w, merged(mlp.down_proj))


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
