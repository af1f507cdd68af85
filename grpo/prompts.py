"""Chat-template prompts, shared by SENT, training, validation and evaluation so all score the same text.

Two styles:
- ``r1``: DeepSeek-R1 distill style. No system prompt (the R1 model card advises against one); the
  instruction goes in the user turn and the response is prefilled with ``<think>\\n``.
- ``tagged``: the GSM8K GRPO recipe's ``<reasoning>``/``<answer>`` format, taught by a system prompt.
  The response is prefilled with ``<reasoning>\\n``: small models (SmolLM2-135M) almost never start the
  format on their own, and with the prefill about half of the groups get reward variance
  (docs/ARCHITECTURE.md, "Facts measured").

The prefill is part of the prompt ids (the model is conditioned on it, never trained on it), and it is
prepended to the completion text before rewards see it, so a format reward checks the whole response.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo.config import PromptParams

R1_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TAGGED_SYSTEM_PROMPT = (
    "Respond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>"
)
STYLES = ("r1", "tagged")
DEFAULT_PREFILL = {"r1": "<think>\n", "tagged": "<reasoning>\n"}


@dataclass(frozen=True)
class PromptStyle:
    """How a question becomes a prompt. ``system_prompt``/``prefill`` None means the style's default."""

    style: str = "tagged"
    system_prompt: str | None = None
    prefill: str | None = None

    @classmethod
    def from_params(cls, params: PromptParams) -> PromptStyle:
        """The style params.yaml's ``prompt`` section names (every stage builds it this way)."""
        return cls(params.style, params.system_prompt, params.prefill)

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"prompt.style: unknown style {self.style!r}; allowed: {', '.join(STYLES)}")

    @property
    def resolved_prefill(self) -> str:
        return DEFAULT_PREFILL[self.style] if self.prefill is None else self.prefill

    @property
    def resolved_system_prompt(self) -> str | None:
        if self.system_prompt is not None:
            return self.system_prompt or None  # "" switches the system turn off
        return TAGGED_SYSTEM_PROMPT if self.style == "tagged" else None


def build_messages(question: str, style: PromptStyle) -> list[dict[str, str]]:
    user = f"{question}\n{R1_INSTRUCTION}" if style.style == "r1" else question
    system = style.resolved_system_prompt
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": user}]


def build_prompt(tokenizer, question: str, style: PromptStyle) -> str:
    """The exact text the model continues: chat template with the generation prompt, then the prefill."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
            "the base_model stage must write one into models/base/"
        )
    text = tokenizer.apply_chat_template(
        build_messages(question, style), tokenize=False, add_generation_prompt=True
    )
    return text + style.resolved_prefill


def full_response(style: PromptStyle, completion: str) -> str:
    """The response as rewards and answer extraction see it: prefill + generated text."""
    return style.resolved_prefill + completion
