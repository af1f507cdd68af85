"""Data-parallel GRPO: what the step and the loop call so that N processes compute one process's update.

A step's prompts are cut into contiguous shards, one per rank (grpo.distributed.shard_bounds): a group
never crosses ranks, and rank r's prompt i is the step's prompt ``lo + i`` for the sampling keys, so
the rollouts are the single-process ones. Then:

- rewards are computed where the rollouts are, and gathered (``gather_step``): advantages (batch-scaled
  ones need the whole step's statistics), the step's metrics and the logged samples are computed from
  the whole step on every rank, exactly as one process computes them;
- the loss normaliser that spans the step (tokens for dapo/bnpo, sequences for grpo/dr_grpo) is summed
  over ranks (grpo.distributed.all_reduce_sum), as are the entropies the token mask ranks
  (``step_wide``); each rank's loss is then its share of the single-process loss, so the all-reduced
  sum of the LoRA gradients (grpo.distributed.all_reduce_gradients, before clipping and the optimiser
  step) is the single-process gradient, up to float summation order;
- every rank applies the same update to the same weights, so the ranks stay equal without a broadcast.

The step and the loop call these through hooks marked ``[data parallel]``; in one process each is an
identity.
"""
from __future__ import annotations

import torch

from grpo import distributed
from grpo.config import ConfigError, TrainParams
from grpo.verify.rewards import Rewards


def check_world(params: TrainParams) -> None:
    """Refuse what data parallelism cannot split as one process would, before anything loads."""
    world = distributed.world_size()
    if world == 1:
        return
    if params.prompts_per_step < world:
        raise ConfigError(f"train.prompts_per_step ({params.prompts_per_step}) must be at least the number of "
                          f"processes ({world}): each process trains whole groups")
    if params.skip_zero_variance_groups:
        # a rank whose groups were all skipped would have no batch while the others train: not split yet
        raise ConfigError("train.skip_zero_variance_groups is not supported with more than one process "
                          f"({world}); set it false or train.num_processes to 1")


def step_share(num_prompts: int) -> tuple[int, int]:
    """[lo, hi) of the step's prompts this rank generates and trains."""
    return distributed.shard_bounds(num_prompts)


def gather_step(samples: list[dict], completions: list, responses: list[str], scored: Rewards) -> tuple[list[dict], list, list[str], Rewards]:
    """Every rank's rollouts and rewards, in the step's prompt order (rank order is prompt order)."""
    if distributed.world_size() == 1:
        return samples, completions, responses, scored
    parts = distributed.gather((samples, completions, responses, scored))
    per_fn = {name: [v for part in parts for v in part[3].per_fn[name]] for name in scored.per_fn}
    merged = Rewards([t for part in parts for t in part[3].totals], per_fn,
                     [r for part in parts for r in part[3].reasons], sum(part[3].verify_timeouts for part in parts))
    return ([s for part in parts for s in part[0]], [c for part in parts for c in part[1]],
            [r for part in parts for r in part[2]], merged)


def step_wide(values: torch.Tensor) -> torch.Tensor:
    """A 1-D tensor's values from every rank (for statistics of the whole step, such as a quantile)."""
    if distributed.world_size() == 1:
        return values
    return torch.cat([part.to(values.device) for part in distributed.gather(values.cpu())])


def mean_over_rows(parts: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """Micro-batch metrics (rows, metrics) of every rank, averaged weighted by rows."""
    every = [part for rank_parts in distributed.gather(parts) for part in rank_parts]
    n = sum(k for k, _ in every)
    return {key: sum(k * m[key] for k, m in every) / n for key in every[0][1]}
