"""Fast sampling for decoder-only Qwen2/Llama-layout models: a preallocated (static) KV cache with a
fixed number of slots, continuous batching over them, one decode step that reads and writes only
fixed buffers, and on CUDA that step captured as CUDA graphs.

Why not ``model.generate``: at the R1-Distill-1.5B shape HF launches well over a thousand small
kernels a decode step from Python, so a step costs tens of milliseconds whatever the batch
(nf4 generate reaches 317 tok/s at batch 64, 0.3% of the bandwidth floor: docs/ARCHITECTURE.md,
"Facts measured"). Here the whole step (28 layers, LM head, temperature / top-k / top-p, sampling, stop
bookkeeping) is one graph replay; the host syncs only every ``sync_every`` steps, or when a row reaches its
length limit.
Inside the graph the kernels still run one after another, and at small batches their count, not the
weights they read, bounds a step: so on CUDA each layer's attention (RoPE, the cache write, the
softmax over the slot's cache) is one Triton kernel (grpo/kernels/decode_attention.py), the parts
around it are torch.compile'd to fuse the residual / norm / SwiGLU elementwise work into the matmuls'
neighbours, and so are the step's edges (embedding and RoPE tables; final norm, LM head and sampler; the
bookkeeping). The layer maths and weights are grpo/rollout/static_layers.py, the step's edges
grpo/rollout/static_step.py.

Continuous batching (grpo/rollout/slots.py schedules it): each slot is one row of the cache with its
own cursor (where its next key/value goes), RoPE position, token count, limit and sampling key. When
a slot's row ends, the next waiting prompt is prefilled into that slot's cache row, so a request is
never held by its longest row and needs only ``slots`` rows of cache. With the Triton kernel each slot
attends over its own cache up to its cursor, so one captured graph serves the whole call; the PyTorch
attention (CPU) attends over the cache up to a length bucket (the maximum over live slots, rounded up),
one graph per bucket. Admissions only write into the buffers the graphs read.

Sampling is grpo/rollout/sampling.py: each row's noise is keyed by (seed, prompt, sample, position),
so a row draws the same tokens whatever its slot, its neighbours or the number of slots, and the
same tokens as the HF ``generate`` path of grpo.rollout.native for equal logits.
"""
from __future__ import annotations

import logging
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from grpo.kernels.decode_attention import decode_attention, fused_supported, triton_runs
from grpo.kernels.decode_linear import decode_linear_op
from grpo.model.dequant import drop_dense_copies, linear4bit_modules
from grpo.rollout.sampling import row_keys, vocab_offsets
from grpo.rollout.slots import SlotSchedule, Wave
from grpo.rollout.static_layers import (MLP_KERNELS, attend, heads, layer_weights, output_and_mlp, output_projection,
                                        qkv_projection, torch_decode_attention)
from grpo.rollout.static_step import advance, next_token, step_inputs, stops

log = logging.getLogger(__name__)

CACHE_BUCKET = 128  # KV cache lengths are multiples of this (and, without the Triton kernel, one graph per bucket)

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mistral", "qwen3")


def compile_options() -> dict[str, bool]:
    """Inductor's options for the decoder's compiled parts: programmatic dependent launch where this torch
    has it. Each generated kernel then waits for the one before it only where it reads what that one wrote,
    and lets the next one launch once its own loads are issued, so a launch's latency hides behind the kernel
    before it, inside the captured graph too. Inductor emits it on Hopper and newer only (an RTX card's
    kernels are unchanged); cuBLAS's and our Triton kernels launch as before. A decode step on an H100:
    2.430 -> 2.334 ms at 64 sequences, 2.061 -> 2.002 at 16 (bench/RESULTS.md, seventeenth session)."""
    import torch._inductor.config as inductor

    return {"triton.enable_pdl": True} if hasattr(inductor.triton, "enable_pdl") else {}


def compiled(fn: Callable, enabled: bool) -> Callable:
    """``fn`` compiled for static shapes (a decoder sees few slot counts, and each gets kernels specialised
    to it) with ``compile_options``; ``fn`` itself when not ``enabled``."""
    return torch.compile(fn, dynamic=False, options=compile_options()) if enabled else fn


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
    4-bit, merged copies of LoRA layers when ``merge_lora``; with ``read_4bit_mlp``, where Triton runs, a
    4-bit MLP without LoRA is read in 4 bits instead of copied; with ``keep_dense``, the 4-bit layers no adapter
    wraps are read from dense copies kept on the model, which ``release`` leaves for training to read,
    ``train.dense_training``). Call ``refresh()`` after LoRA changes.

    On CUDA (``compile``) the parts of each layer around its attention, and the sampler, are compiled
    by torch.compile so that the elementwise work fuses into a few kernels, and (``fused_attention``,
    where Triton runs) the attention is one Triton kernel: with ~20 small kernels a layer a decode step
    was launch-bound even inside a CUDA graph. Where Triton runs (``triton_kernels``) a decode step's gate, up
    and SwiGLU over a dense gate/up copy are one Triton kernel too (grpo/kernels/swiglu_dense.py), at up to 16
    sequences its q/k/v, output and down projections a split-K one (grpo/kernels/decode_linear.py), and its
    temperature sample another (grpo/kernels/keyed_sample.py)."""

    def __init__(self, model: torch.nn.Module, *, merge_lora: bool = True, read_4bit_mlp: bool = False,
                 keep_dense: bool = False,
                 cuda_graphs: bool | None = None, compile: bool | None = None, fused_attention: bool | None = None,
                 triton_kernels: bool | None = None, bucket: int = CACHE_BUCKET, sync_every: int = 32) -> None:
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
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.cfg = (cfg.num_attention_heads, self.n_kv, self.head_dim, float(cfg.rms_norm_eps))
        self._quantised = {id(m) for m in linear4bit_modules(model)}
        self.dtype = self._compute_dtype()
        self.compile = on_gpu if compile is None else compile
        group = cfg.num_attention_heads // self.n_kv
        self.fused = fused_supported(self.device, self.head_dim, group) if fused_attention is None else fused_attention
        self.triton_kernels = triton_runs(self.device) if triton_kernels is None else triton_kernels
        linear = decode_linear_op if self.triton_kernels else F.linear
        self._part1, self._part2, self._project = (compiled(partial(f, linear=linear), self.compile) for f in
                                                   (qkv_projection, output_and_mlp, output_projection))
        self.keep_dense = keep_dense and bool(self._quantised)
        self.read_4bit_mlp = (read_4bit_mlp and bool(self._quantised) and triton_runs(self.device)
                              and not self.keep_dense)
        if read_4bit_mlp and not self.read_4bit_mlp:
            log.warning("generation_mlp_4bit: the 4-bit MLP kernels need a 4-bit base, Triton on an Ampere or "
                        "newer GPU and no kept dense copy (train.dense_training); decoding from a dense copy instead")
        # a step's edges, compiled too: in eager they were ~40 one-off kernels a step (embedding, RoPE
        # tables, the final norm, the sampler's bookkeeping), each a launch slot inside the graph (on an
        # H100: 271 -> 250 kernels, 2.51 -> 2.46 ms a step at 64 sequences, bench/RESULTS.md)
        self._inputs, self._pick, self._advance = (compiled(f, self.compile) for f in (
            step_inputs, partial(next_token, kernel=self.triton_kernels), advance))
        self._offsets = vocab_offsets(model.get_output_embeddings().out_features, self.device)
        self.weights: list[tuple[tuple, tuple]] = []
        # the graphs' warm-up stream, one for the decoder's life: cuBLAS gives every new stream a workspace
        # of its own (32 MiB on Hopper) that is never freed, and a stream per capture held 29 of them
        # (0.9 GiB, growing each step until PyTorch's pool of 32 streams came round) in an 8 GiB run
        self._side: torch.cuda.Stream | None = None
        self._warmed: set[tuple] = set()  # (shapes, graph key) whose decode step has run once (``_graph``)
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
        with torch.profiler.record_function("grpo/decoder.refresh"):  # a sub-phase in a `grpo.profile` trace
            self.weights = [layer_weights(layer, self._quantised, self.dtype, self.merge_lora, self.read_4bit_mlp,
                                          self.triton_kernels, self.keep_dense) for layer in self.body.layers]

    def release(self) -> None:
        """Free the dense and merged weight copies until the next ``refresh`` (re-de-quantising a
        4-bit base costs milliseconds; keeping the copy costs its memory during training), except the
        copies kept on the model with ``keep_dense``."""
        self.weights = []
        if not self.keep_dense:
            drop_dense_copies(self.model)

    # --- the forward pass ------------------------------------------------------------------
    def _forward(self, ids: Tensor, positions: Tensor, attention: Callable[..., Tensor], eager: bool = False
                 ) -> tuple[Tensor, Tensor]:
        """Run ``ids`` [B, T] at ``positions`` [B, T]. ``attention(layer, qkv, cos, sin, w1)`` writes the
        new keys and values into the cache and returns the attention output [B, T, Hq * D]. Returns the
        residual stream and the last layer's output, which ``_sample`` adds. ``eager``: prefill's varying
        shapes skip the compiled parts."""
        part1, part2, project, inputs = ((qkv_projection, output_and_mlp, output_projection, step_inputs) if eager
                                         else (self._part1, self._part2, self._project, self._inputs))
        eps = self.cfg[3]
        x, cos, sin = inputs(self.body, ids, positions, self.dtype)
        delta = None
        for i, (w1, w2) in enumerate(self.weights):
            x, qkv = part1(x, delta, w1, eps)
            a = attention(i, qkv, cos, sin, w1)
            if isinstance(w2[-1], MLP_KERNELS):  # the MLP's kernels run outside the compiled part, which sees
                x, h = project(x, a, w2[:5], eps)  # only tensors (no guard on each layer's MLP object)
                delta = w2[-1](h)
            else:
                x, delta = part2(x, a, w2, eps)
        return x, delta

    def _sample(self, x: Tensor, delta: Tensor, keys: Tensor, positions: Tensor, eager: bool = False) -> Tensor:
        """The next ids after the last layer (``_forward``'s outputs)."""
        return (next_token if eager else self._pick)(
            self.body.norm, self.model.get_output_embeddings(), x, delta, keys, positions, self._offsets,
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    # --- per-slot state ----------------------------------------------------------------------
    def _allocate(self, slots: int, cache_len: int, max_new: int, stop_ids: list[int], pad_id: int) -> None:
        """The buffers every decode step reads and writes; allocated once per call, never replaced, so
        the captured graphs stay valid while admissions rewrite their contents."""
        dev = self.device
        # zeros, not empty: masked entries get probability 0, and 0 * NaN garbage would still be NaN
        self.k_cache = [torch.zeros(slots, self.n_kv, cache_len, self.head_dim, dtype=self.dtype, device=dev)
                        for _ in self.weights]
        self.v_cache = [torch.zeros_like(c) for c in self.k_cache]
        self.valid = torch.zeros(slots, cache_len, dtype=torch.bool, device=dev)  # which cache entries count
        self.tokens, self.positions, self.cursor, self.count, self.limit, self.keys = (
            torch.zeros(slots, dtype=torch.long, device=dev) for _ in range(6))
        self.finished = torch.ones(slots, dtype=torch.bool, device=dev)  # an empty slot has ended
        # one spare last column: where an ended slot writes its pad, never over its tokens
        self.out = torch.full((slots, max_new + 1), pad_id, dtype=torch.long, device=dev)
        self.stop_ids = torch.tensor(stop_ids, dtype=torch.long, device=dev)
        self.pad, self.pad_id = pad_id, torch.tensor(pad_id, device=dev)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        # what a compiled step specialises on, besides the weights' shapes (fixed for the decoder's life)
        self._shapes = (slots, cache_len, len(stop_ids), self.temperature, self.top_k, self.top_p)

    def _state(self) -> list[Tensor]:
        """What a decode step advances (the caches aside): saved around a graph's warm-up run."""
        return [self.valid, self.out, self.finished, self.tokens, self.count, self.cursor, self.positions]

    def _free(self) -> None:
        self.k_cache = self.v_cache = []
        self._graphs, self._pool = {}, None

    @torch.no_grad()
    def _prefill(self, wave: Wave, prompts: list[list[int]], keys: Tensor, limits: list[int]) -> None:
        """Prefill the wave's prompts, left-padded to its width, into their slots' cache rows, reset
        those slots' state and emit each row's first token."""
        dev, width = self.device, wave.width
        rows, pad = [prompts[r] for r in wave.rows], self.pad
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows], device=dev)
        mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in rows], device=dev)
        slots = torch.tensor(wave.slots, device=dev)
        # HF's positions for left padding: cumsum of the mask - 1, pads at 1
        positions = (mask.long().cumsum(-1) - 1).masked_fill_(~mask, 1)
        attend_mask = mask[:, None, :] & torch.ones(width, width, dtype=torch.bool, device=dev).tril_()[None]

        def attention(i: int, qkv: Tensor, cos: Tensor, sin: Tensor, w1: tuple) -> Tensor:
            q, k, v = heads(qkv, cos[:, :, None], sin[:, :, None], w1, self.cfg)
            self.k_cache[i][slots, :, :width] = k
            self.v_cache[i][slots, :, :width] = v
            return attend(q, k, v, attend_mask, self.cfg)  # a new row attends over its own prompt only

        x, delta = self._forward(ids, positions, attention, eager=True)
        self.valid.index_fill_(0, slots, False)
        self.valid[slots, :width] = mask
        self.keys[slots] = keys[torch.tensor(wave.rows, device=keys.device)].to(dev)
        self.limit[slots] = torch.tensor([limits[r] for r in wave.rows], device=dev)
        self.cursor[slots] = width
        self.positions[slots] = mask.sum(-1)
        first = self._sample(x, delta, self.keys[slots], torch.zeros_like(slots), eager=True)
        self.out.index_fill_(0, slots, pad)
        self.out[slots, 0] = first
        self.tokens[slots] = first
        self.count[slots] = 1
        self.finished[slots] = stops(first, self.stop_ids) | (self.limit[slots] <= 1)

    def _decode_step(self, length: int) -> None:
        """One token for every slot, reading and writing only the persistent buffers (graph-safe): each
        slot writes its key/value at its own cursor and attends over its cache (the PyTorch attention:
        over the cache up to ``length``)."""
        n_heads, _, _, eps = self.cfg

        def attention(i: int, qkv: Tensor, cos: Tensor, sin: Tensor, w1: tuple) -> Tensor:
            if self.fused:
                return decode_attention(qkv, cos, sin, self.k_cache[i], self.v_cache[i], self.valid, self.cursor,
                                        n_heads=n_heads, q_norm=w1[5], k_norm=w1[6], eps=eps)[:, None]
            return torch_decode_attention(qkv, cos, sin, self.k_cache[i], self.v_cache[i], self.valid,
                                          self.cursor, length, w1, self.cfg)

        self.valid.scatter_(1, self.cursor[:, None], True)
        x, delta = self._forward(self.tokens[:, None], self.positions[:, None], attention)
        self._advance(self._sample(x, delta, self.keys, self.count), self.finished, self.out, self.count, self.limit,
                      self.tokens, self.cursor, self.positions, self.stop_ids, self.pad_id)

    def graph_key(self, length: int) -> int:
        """Which captured graph runs the decode step at ``length``: the fused attention reads no length,
        so one graph serves every length."""
        return 0 if self.fused else length

    def _graph(self, length: int) -> torch.cuda.CUDAGraph:
        """The decode step at ``length`` as a CUDA graph, captured on first use, after a warm-up run the first
        time this decoder captures at these shapes and settings (``_warmed``): a later call's capture, after a
        refresh, records the same compiled code and kernels without one (a capture with it took 36-77 ms of a
        64-sequence call on an H100, bench/decode_speed.py). Should that capture fail (something at these shapes not yet compiled or fitted),
        the warm-up runs and it is captured again. Capture itself only records."""
        graph = self._graphs.get(self.graph_key(length))
        if graph is not None:
            return graph
        warm = (self._shapes, self.graph_key(length))
        with torch.profiler.record_function("grpo/decoder.capture"):
            if self._side is None:
                self._side = torch.cuda.Stream()
            graph = None
            if warm in self._warmed:
                try:
                    graph = self._capture(length)
                except RuntimeError as err:  # left no state behind: a capture only records
                    log.warning("decode step capture without a warm-up failed (%s); warming up", err)
            if graph is None:
                self._warm_up(length)
                graph = self._capture(length)
            self._warmed.add(warm)
            self._graphs[self.graph_key(length)] = graph
        return graph

    def _warm_up(self, length: int) -> None:
        """One decode step run on the capture stream (compilation, cuBLAS handles, the kernels' launch options,
        the allocator), the state it advances saved and restored around it; the keys/values it wrote sit where
        the replayed step writes them again."""
        saved = [t.clone() for t in self._state()]
        side = self._side
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._decode_step(length)
        torch.cuda.current_stream().wait_stream(side)
        for live, before in zip(self._state(), saved):
            live.copy_(before)

    def _capture(self, length: int) -> torch.cuda.CUDAGraph:
        # captured on the warm-up's stream directly: torch.cuda.graph would first synchronise and empty the
        # device and host caches (cudaFree, cudaFreeHost: a 40 ms idle gap in an 8 GiB step's profile on an
        # H100; the blocks freed are allocated again after); the private pool takes what the step allocates
        graph = torch.cuda.CUDAGraph()
        side = self._side
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            graph.capture_begin(pool=self._pool)
            try:
                self._decode_step(length)
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        return graph

    def _collect(self, schedule: SlotSchedule, results: list, on_done) -> None:
        """The host sync: retire every slot whose row has ended, keeping its tokens."""
        ended_flags, counts = torch.stack([self.finished.long(), self.count]).tolist()
        ended = [s for s in schedule.busy() if ended_flags[s]]
        if not ended:
            return
        for slot, ids in zip(ended, self.out[ended].tolist()):
            row = schedule.retire(slot)
            results[row] = ids[: counts[slot]]
            if on_done is not None:
                on_done(row, results[row])

    # --- generation ------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int | list[int], stop_ids: list[int],
                 pad_id: int, keys: Tensor | None = None, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, slots: int | None = None, refill: bool = True,
                 on_done: Callable[[int, list[int]], None] | None = None,
                 before_prefill: Callable[[int], None] | None = None) -> list[list[int]]:
        """The new ids of each prompt (a list of token ids): they end with a stop id when the row
        stopped and hold no pads. ``max_new_tokens`` is one limit or one per prompt.

        ``slots`` rows decode at once (default: all prompts); a row that ends hands its slot to the
        next waiting prompt, or, with ``refill`` off, the next prompts wait until every slot is free
        (static batching). ``keys`` [R] are the rows' sampling keys (grpo.rollout.sampling.row_keys;
        default: seed 0, row i as prompt i). ``on_done(row, ids)`` runs as each row ends, so a caller
        keeps finished rows when a later step fails; ``before_prefill(slots)`` runs before each
        prefill (the out-of-memory fault hook)."""
        if not prompts:
            return []
        limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if keys is None:
            keys = row_keys(0, torch.arange(len(prompts)), torch.zeros(len(prompts), dtype=torch.long))
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        if not self.weights:  # released since the last call
            self.refresh()
        n_slots = min(slots or len(prompts), len(prompts))
        cache_len = -(-(max(map(len, prompts)) + max(limits)) // self.bucket) * self.bucket
        if self.compile:
            # each new slot count recompiles the layer parts and the sampler once; past dynamo's default
            # limit of 8 it would silently fall back to eager (seen in bench/gpu_bench.py's many shapes)
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        schedule = SlotSchedule([len(p) for p in prompts], limits, n_slots, refill=refill,
                                sync_every=self.sync_every, bucket=self.bucket, cache_len=cache_len)
        results: list[list[int] | None] = [None] * len(prompts)
        self._allocate(n_slots, cache_len, max(limits), stop_ids, pad_id)
        try:
            while not schedule.done():
                wave = schedule.admit()
                if wave is not None:
                    if before_prefill is not None:
                        before_prefill(n_slots)
                    with torch.profiler.record_function("grpo/decoder.prefill"):  # sub-phases in a profile
                        self._prefill(wave, prompts, keys, limits)
                stop = schedule.next_sync()
                while schedule.step < stop:
                    length = schedule.length()
                    if self.cuda_graphs:
                        self._graph(length).replay()
                    else:
                        self._decode_step(length)
                    schedule.step += 1
                self._collect(schedule, results, on_done)
            return results
        finally:
            self._free()  # the cache and graphs go with this call
