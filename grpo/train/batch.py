"""Turn rollouts into training tensors without re-tokenising anything.

Layout of one row: ``[left pads][prompt ids][sampled response ids, EOS included][right pads]``.
Every response starts in the same column (``prompt_width``), so the loss reads one contiguous slice of
hidden states; no pad ever sits between a prompt and its response, and position ids count real tokens
only (``cumsum(attention_mask) - 1``), so each row sees the positions it had during generation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.rollout.base import Completion


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # [B, prompt_width + response_width]
    attention_mask: torch.Tensor  # [B, W] 1 for real tokens
    position_ids: torch.Tensor  # [B, W]
    response_ids: torch.Tensor  # [B, response_width] the sampled ids, pad after EOS
    response_mask: torch.Tensor  # [B, response_width] float, 1 on sampled tokens
    truncated: torch.Tensor  # [B] bool, finish_reason == "length"
    prompt_width: int

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: slice | torch.Tensor) -> "TrainBatch":
        """A micro-batch; trailing all-pad response columns are cut so short rows cost nothing."""
        mask = self.response_mask[rows]
        width = int(mask.sum(0).nonzero().max().item()) + 1 if mask.any() else 1
        end = self.prompt_width + width
        return TrainBatch(
            input_ids=self.input_ids[rows, :end],
            attention_mask=self.attention_mask[rows, :end],
            position_ids=self.position_ids[rows, :end],
            response_ids=self.response_ids[rows, :width],
            response_mask=mask[:, :width],
            truncated=self.truncated[rows],
            prompt_width=self.prompt_width,
        )

    def to(self, device: torch.device) -> "TrainBatch":
        return TrainBatch(
            *(t.to(device) for t in (self.input_ids, self.attention_mask, self.position_ids,
                                     self.response_ids, self.response_mask, self.truncated)),
            prompt_width=self.prompt_width,
        )


def build_batch(completions: list[Completion], pad_id: int) -> TrainBatch:
    """Stack completions (each with its own prompt ids) into one left/right padded batch."""
    if not completions:
        raise ValueError("build_batch: no completions")
    prompt_width = max(len(c.prompt_ids) for c in completions)
    response_width = max(1, max(len(c.token_ids) for c in completions))
    rows, masks, responses, response_masks = [], [], [], []
    for c in completions:
        left = prompt_width - len(c.prompt_ids)
        right = response_width - len(c.token_ids)
        rows.append([pad_id] * left + list(c.prompt_ids) + list(c.token_ids) + [pad_id] * right)
        masks.append([0] * left + [1] * (len(c.prompt_ids) + len(c.token_ids)) + [0] * right)
        responses.append(list(c.token_ids) + [pad_id] * right)
        response_masks.append([1.0] * len(c.token_ids) + [0.0] * right)
    attention_mask = torch.tensor(masks, dtype=torch.long)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return TrainBatch(
        input_ids=torch.tensor(rows, dtype=torch.long),
        attention_mask=attention_mask,
        position_ids=position_ids,
        response_ids=torch.tensor(responses, dtype=torch.long),
        response_mask=torch.tensor(response_masks, dtype=torch.float32),
        truncated=torch.tensor([c.finish_reason == "length" for c in completions]),
        prompt_width=prompt_width,
    )


def response_hidden_states(model, batch: TrainBatch) -> torch.Tensor:
    """Final hidden states at the positions that predict each response token: [B, response_width, H].

    The decoder body runs without the LM head; log-probs are then computed in chunks from these
    states (grpo.algo.logprobs), so full-vocabulary logits for the batch never exist at once.
    """
    out = model.get_decoder()(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    hidden = out.last_hidden_state
    start = batch.prompt_width - 1  # the state at the last prompt token predicts response token 0
    return hidden[:, start : start + batch.response_ids.shape[1]]
