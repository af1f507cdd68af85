"""One GRPO step: rollouts → rewards → advantages → (scoring pass) → μ clipped policy updates.

Read top to bottom, this file is the algorithm, ending in ``grpo_step`` which calls the phases in
order; its maths is grpo/algo/objective.py. It chooses nothing: the engine, the reward functions and
the log-prob backend are parts built once from the params (grpo/train/parts.py). Memory-heavy phases
loop over adaptive micro-batches (grpo/microbatch.py); the loss is normalised over the whole step so
that the split into micro-batches never changes the gradient. docs/ARCHITECTURE.md traces one step.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from grpo import distributed
from grpo.algo.objective import (METRIC_NAMES, compute_advantages, entropy_threshold, grpo_loss,
                                 keep_mask_from_threshold, loss_normaliser, skip_zero_variance)
from grpo.config import TrainParams
from grpo.microbatch import micro_batches, phase_peak_memory
from grpo.model.lora import lora_disabled
from grpo.prompts import PromptStyle, build_prompt, full_response
from grpo.rollout.base import Completion, SamplingParams
from grpo.train import data_parallel
from grpo.train.parts import TrainerParts
from grpo.verify.rewards import compute_rewards


@dataclass
class StepContext:
    """What every step needs: the params and the parts ``build_parts`` (grpo/train/parts.py) chose."""

    params: TrainParams
    style: PromptStyle
    parts: TrainerParts


@dataclass
class Rollouts:
    samples: list[dict]  # one dataset row per completion (each prompt repeated G times)
    completions: list[Completion]
    responses: list[str]  # prefill + generated text, what rewards saw


def generate_groups(ctx: StepContext, prompts: list[dict], step: int, first_prompt: int = 0) -> Rollouts:
    """G completions per prompt from the current policy, in one engine call: the engine adapts its
    batch to out-of-memory errors itself (``ctx.parts.sizes["generate"]``), redrawing nothing. ``prompts``
    start at the step's prompt ``first_prompt`` (a data-parallel rank's share), which keys their samples."""
    p = ctx.params
    texts = [build_prompt(ctx.parts.tokenizer, row["question"], ctx.style) for row in prompts]
    sampling = SamplingParams(n=p.group_size, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                              max_new_tokens=p.max_response_length, seed=p.seed * 1_000_003 + step,
                              first_prompt=first_prompt)
    groups = ctx.parts.engine.generate(texts, sampling)
    samples = [row for row in prompts for _ in range(p.group_size)]
    completions = [c for group in groups for c in group]
    responses = [full_response(ctx.style, c.text) for c in completions]
    return Rollouts(samples, completions, responses)


# --- training tensors ------------------------------------------------------------------------------
# Turn rollouts into training tensors without re-tokenising anything.
#
# Layout of one row: ``[prompt ids][sampled response ids, EOS included][pads]``, padded on the right only.
# So the decoder runs with a causal mask and no attention mask at all: a real token's past is all real
# (pads come after every real token of their row), position ids are 0, 1, 2, ... as in generation, and
# PyTorch's SDPA may run its flash/cuDNN kernels. A padding mask sent it to the memory-efficient kernel over
# every position pair: 25% of an H100's training kernels at the 8 GB preset's shape; without it the training
# phase took 1.55 -> 1.27 s (bench/RESULTS.md, thirteenth and fourteenth sessions).
# The loss reads each row's response states at its own offset (``response_index``).
@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # [B, W] prompt, response, then pads
    response_ids: torch.Tensor  # [B, response_width] the sampled ids, pad after EOS
    response_mask: torch.Tensor  # [B, response_width] float, 1 on sampled tokens
    # [B, response_width] the column whose state predicts each response token (its row's last prompt
    # column + j), clamped into the row where the response has ended
    response_index: torch.Tensor
    truncated: torch.Tensor  # [B] bool, finish_reason == "length"
    # [B] tokens a row: kept on the CPU by ``to``, so a micro-batch's widths need no wait for the GPU
    prompt_lengths: torch.Tensor
    response_lengths: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: slice | torch.Tensor) -> TrainBatch:
        """A micro-batch; trailing pad columns are cut so short rows cost nothing."""
        prompts, responses = self.prompt_lengths[rows], self.response_lengths[rows]
        if not len(responses):
            raise ValueError("TrainBatch.select: no rows")
        width = max(1, int(responses.max()))
        end = int((prompts + responses).max())
        return TrainBatch(
            input_ids=self.input_ids[rows, :end],
            response_ids=self.response_ids[rows, :width],
            response_mask=self.response_mask[rows, :width],
            response_index=self.response_index[rows, :width].clamp(max=end - 1),
            truncated=self.truncated[rows],
            prompt_lengths=prompts,
            response_lengths=responses,
        )

    def to(self, device: torch.device) -> TrainBatch:
        return TrainBatch(
            *(t.to(device) for t in (self.input_ids, self.response_ids, self.response_mask, self.response_index,
                                     self.truncated)),
            prompt_lengths=self.prompt_lengths,
            response_lengths=self.response_lengths,
        )


def build_batch(completions: list[Completion], pad_id: int) -> TrainBatch:
    """Stack completions (each with its own prompt ids) into one right-padded batch."""
    if not completions:
        raise ValueError("build_batch: no completions")
    if any(not c.prompt_ids for c in completions):
        raise ValueError("build_batch: a completion has no prompt ids (its first token has no state to come from)")
    width = max(len(c.prompt_ids) + len(c.token_ids) for c in completions)
    response_width = max(1, max(len(c.token_ids) for c in completions))
    rows, responses, response_masks, index = [], [], [], []
    for c in completions:
        rows.append(list(c.prompt_ids) + list(c.token_ids) + [pad_id] * (width - len(c.prompt_ids) - len(c.token_ids)))
        right = response_width - len(c.token_ids)
        responses.append(list(c.token_ids) + [pad_id] * right)
        response_masks.append([1.0] * len(c.token_ids) + [0.0] * right)
        index.append([min(len(c.prompt_ids) - 1 + j, width - 1) for j in range(response_width)])
    return TrainBatch(
        input_ids=torch.tensor(rows, dtype=torch.long),
        response_ids=torch.tensor(responses, dtype=torch.long),
        response_mask=torch.tensor(response_masks, dtype=torch.float32),
        response_index=torch.tensor(index, dtype=torch.long),
        truncated=torch.tensor([c.finish_reason == "length" for c in completions]),
        prompt_lengths=torch.tensor([len(c.prompt_ids) for c in completions], dtype=torch.long),
        response_lengths=torch.tensor([len(c.token_ids) for c in completions], dtype=torch.long),
    )


def response_hidden_states(model, batch: TrainBatch) -> torch.Tensor:
    """Final hidden states at the positions that predict each response token: [B, response_width, H].

    The decoder body runs without the LM head and without an attention mask (causal only: see the
    layout above); log-probs are then computed in chunks from these states (grpo.algo.logprobs), so
    full-vocabulary logits for the batch never exist at once.
    """
    hidden = model.get_decoder()(input_ids=batch.input_ids, use_cache=False).last_hidden_state
    index = batch.response_index[..., None].expand(-1, -1, hidden.shape[-1])
    return hidden.gather(1, index)


# --- the scoring pass and the updates -------------------------------------------------------------
def token_logprobs(ctx: StepContext, batch: TrainBatch, *, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the sampled response tokens, in chunks from the final hidden states,
    by the backend chosen at set-up (``choose_logprobs``)."""
    return ctx.parts.token_logprobs(response_hidden_states(ctx.parts.model, batch), batch.response_ids, entropy)


def scoring_pass(ctx: StepContext, batch: TrainBatch, step: int) -> dict[str, torch.Tensor]:
    """No-grad pass before the updates: old log-probs (μ > 1), entropies (ρ < 1), reference (β > 0).

    With μ = 1 and ρ = 1 and β = 0 nothing is needed: the ratio's denominator is the detached current
    log-prob, so there is no extra forward at all.
    """
    p = ctx.params
    need_old = p.num_iterations > 1
    need_entropy = p.entropy_keep_fraction < 1.0
    out: dict[str, list[torch.Tensor]] = {"old": [], "entropy": [], "ref": []}
    if not (need_old or need_entropy or p.beta > 0):
        return {}
    was_training = ctx.parts.model.training
    ctx.parts.model.eval()  # no dropout: these are the policy's own probabilities
    on_device = batch.to(ctx.parts.device)  # once, as policy_updates does

    for chunk in micro_batches(len(batch), ctx.parts.sizes["score"], ctx.parts.hook, step=step):
        with chunk, torch.no_grad():
            mb = on_device.select(chunk.slice)
            if need_old or need_entropy:
                lp, ent = token_logprobs(ctx, mb, entropy=need_entropy)
                out["old"].append(_pad_to(lp, batch))
                if ent is not None:
                    out["entropy"].append(_pad_to(ent, batch))
            if p.beta > 0:
                with lora_disabled(ctx.parts.model):
                    ref, _ = token_logprobs(ctx, mb, entropy=False)
                out["ref"].append(_pad_to(ref, batch))
    ctx.parts.model.train(was_training)
    return {k: torch.cat(v).cpu() for k, v in out.items() if v}


def _pad_to(values: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
    """Micro-batches are cut to their own response width; pad back to the full batch width."""
    width = batch.response_ids.shape[1]
    return torch.nn.functional.pad(values.float().cpu(), (0, width - values.shape[1]))


def policy_updates(ctx: StepContext, batch: TrainBatch, advantages: torch.Tensor,
                   pre: dict[str, torch.Tensor], step: int) -> dict[str, float]:
    """μ optimiser updates on one rollout batch; returns the last update's metrics.

    Nothing in the micro-batch loop waits for the GPU: the batch and every per-token tensor go to the
    device once, widths come from the CPU's response lengths, and the metrics stay on the device until
    the optimiser step; so the host queues the next micro-batch while the GPU still runs the last."""
    p = ctx.params
    loss_mask = batch.response_mask.clone()
    if p.mask_truncated_completions:
        loss_mask *= batch.truncated.logical_not().float().unsqueeze(1)
    keep = None
    if "entropy" in pre:
        # [data parallel] the quantile is the whole step's
        response_entropies = data_parallel.step_wide(pre["entropy"][loss_mask.bool()])
        threshold = entropy_threshold(response_entropies, p.entropy_keep_fraction)
        keep = keep_mask_from_threshold(pre["entropy"], loss_mask, threshold, p.entropy_min_per_sequence)
    # One step-wide normaliser, so the micro-batch split (which OOM recovery changes) never changes
    # the gradient; see grpo.algo.objective on gradient accumulation.
    # [data parallel] summed over ranks: each rank's loss is its share of the step's loss
    denominator = distributed.all_reduce_sum(loss_normaliser(p.loss_type, loss_mask, p.max_response_length))
    device = ctx.parts.device
    on_device = batch.to(device)
    per_token = {name: t.to(device) for name, t in {**pre, "loss_mask": loss_mask, "keep": keep}.items()
                 if name != "entropy" and t is not None}
    advantages = advantages.to(device)
    totals: dict[str, float] = {}
    for _ in range(p.num_iterations):
        ctx.parts.optimizer.zero_grad(set_to_none=True)
        metrics_parts: list[tuple[int, torch.Tensor]] = []

        for chunk in micro_batches(len(batch), ctx.parts.sizes["train"], ctx.parts.hook, step=step,
                                   params_with_grad=ctx.parts.lora_params):
            with chunk:
                sl = chunk.slice
                mb = on_device.select(sl)
                width = mb.response_ids.shape[1]
                cut = {name: t[sl, :width] for name, t in per_token.items()}
                lp, entropy = token_logprobs(ctx, mb, entropy=True)
                out = grpo_loss(
                    lp, cut.get("old"), advantages[sl], cut["loss_mask"],
                    loss_type=p.loss_type,
                    epsilon_low=p.epsilon_low, epsilon_high=p.epsilon_high, delta=p.delta, beta=p.beta,
                    ref_logprobs=cut.get("ref"),
                    max_completion_length=p.max_response_length,
                    num_items_in_batch=denominator,
                    entropy_keep_mask=cut.get("keep"),
                )
                out.loss.backward()
                entropy_mean = masked_mean(entropy.detach(), mb.response_mask)
                metrics_parts.append((len(chunk.rows), torch.cat([out.metric_values, entropy_mean[None]])))
        distributed.all_reduce_gradients(ctx.parts.lora_params)  # [data parallel] the step's gradient
        with torch.profiler.record_function("grpo/optimizer"):
            grad_norm = torch.nn.utils.clip_grad_norm_(ctx.parts.lora_params, p.grad_clip)
            ctx.parts.optimizer.step()
            ctx.parts.scheduler.step()
        values = torch.stack([v for _, v in metrics_parts]).tolist()  # the loop's one wait for the GPU
        names = (*METRIC_NAMES, "entropy_mean")
        parts = [(rows, dict(zip(names, v))) for (rows, _), v in zip(metrics_parts, values)]
        totals = data_parallel.mean_over_rows(parts)  # [data parallel] every rank's rows
        totals["grad_norm"] = float(grad_norm)
    return totals


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` where ``mask`` is 1, as a device scalar (0 where there is none)."""
    count = mask.sum()
    total = torch.where(mask.bool(), values.float(), 0.0).sum()
    return torch.where(count > 0, total / count.clamp(min=1), 0.0)


def grpo_step(ctx: StepContext, prompts: list[dict], step: int) -> tuple[dict[str, float], Rollouts, list[dict]]:
    """The whole step; returns (metrics, rollouts, per-sample reward reasons)."""
    p = ctx.params
    peaks: dict[str, float] = {}
    t0 = time.perf_counter()
    lo, hi = data_parallel.step_share(len(prompts))  # [data parallel] this rank's groups
    with phase_peak_memory(peaks, "generate", ctx.parts.device):
        ro = generate_groups(ctx, prompts[lo:hi], step, first_prompt=lo)
    t_gen = time.perf_counter() - t0
    n_tokens = [len(c.token_ids) for c in ro.completions]
    finish = [c.finish_reason for c in ro.completions]
    scored = compute_rewards(ro.responses, ro.samples, dict(p.rewards), finish, n_tokens, p.max_response_length,
                             ctx.parts.rewards)
    # [data parallel] the whole step's rollouts and rewards on every rank; this rank trains rows `mine`
    samples, completions, responses, scored = data_parallel.gather_step(ro.samples, ro.completions, ro.responses, scored)
    ro = Rollouts(samples, completions, responses)
    mine = slice(lo * p.group_size, hi * p.group_size)
    n_tokens = [len(c.token_ids) for c in ro.completions]
    finish = [c.finish_reason for c in ro.completions]
    per_fn, reasons = scored.per_fn, scored.reasons
    rewards = torch.tensor(scored.totals, dtype=torch.float32)
    adv = compute_advantages(rewards, p.group_size, p.advantage_scale)
    keep_rows = torch.ones(len(rewards), dtype=torch.bool)
    if p.skip_zero_variance_groups:
        keep_rows = skip_zero_variance(rewards, p.group_size).repeat_interleave(p.group_size)
    metrics: dict[str, float] = {
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "frac_reward_zero_std": float(adv.frac_reward_zero_std),
        "response_length_mean": sum(n_tokens) / len(n_tokens), "response_length_max": float(max(n_tokens)),
        "truncated_frac": finish.count("length") / len(finish),
        "rollout_tokens_per_s": sum(n_tokens) / max(t_gen, 1e-9), "time_generate_s": t_gen, **peaks,
        "verify_timeouts": float(scored.verify_timeouts),
    }
    metrics.update({f"reward/{name}": sum(v) / len(v) for name, v in per_fn.items()})
    if "correctness" in per_fn:
        metrics["accuracy"] = metrics["reward/correctness"]
    if not keep_rows.any():
        metrics.update(skipped_step=1.0)
        return metrics, ro, reasons
    kept = [c for c, k in zip(ro.completions[mine], keep_rows[mine].tolist()) if k]
    batch = build_batch(kept, ctx.parts.tokenizer.pad_token_id)
    t1 = time.perf_counter()
    with ctx.parts.training_base():
        with phase_peak_memory(metrics, "score", ctx.parts.device):
            pre = scoring_pass(ctx, batch, step)
        with phase_peak_memory(metrics, "train", ctx.parts.device):
            metrics.update(policy_updates(ctx, batch, adv.advantages[mine][keep_rows[mine]], pre, step))
    t_train = time.perf_counter() - t1
    metrics.update(time_train_s=t_train, train_tokens_per_s=float(batch.response_mask.sum()) / max(t_train, 1e-9),
                   lr=ctx.parts.scheduler.get_last_lr()[0], skipped_step=0.0)
    for name, size in ctx.parts.sizes.items():
        metrics[f"micro_batch/{name}"] = float(size.current)
        metrics[f"oom_events/{name}"] = float(size.oom_events)
    if not math.isfinite(metrics.get("grad_norm", 0.0)):
        raise FloatingPointError(f"step {step}: non-finite gradient norm; metrics {metrics}")
    return metrics, ro, reasons
