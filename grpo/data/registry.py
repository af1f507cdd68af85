"""The dataset registry: where each dataset lives (hub and bundled copy), which fields hold the question
and the gold answer, how to parse that answer, and what the dataset is used for.

Field paths use dots for nested objects and ``[i]`` for list items (``prompt[0].content``). The bundled
copies in ``data/bundled/`` share their field names with the hub versions named here, so one spec
reads both. Provenance, sha256 and licenses of the bundled files: ``data/bundled/README.md``.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from grpo.data.answers import (
    INTEGER, LATEX, NONE, NUMBER, AnswerParser, parse_gsm8k, parse_gsm_plus, parse_math, parse_numeric,
)
from grpo.data.errors import DataError
from grpo.data.synthetic import generate_split

TRAIN, EVAL = "train", "eval"


@dataclass(frozen=True)
class SplitSource:
    """Where one role's rows come from: a hub split, and the bundled files (relative to data/bundled,
    concatenated in order; the format follows the suffix: .jsonl, .json array, .parquet). No files:
    the dataset is hub-only."""

    hub_split: str
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    hub_id: str
    hub_config: str | None
    splits: Mapping[str, SplitSource]  # role (train/eval) → its source; the keys are the dataset's roles
    question_field: str
    answer_field: str
    parse_answer: AnswerParser
    answer_types: tuple[str, ...]  # the types the parser gives this dataset's rows
    license: str
    id_field: str | None = None  # the dataset's own unique id; None: the row's index in its split
    meta_fields: Mapping[str, str] = field(default_factory=dict)  # meta key → field path, kept when present
    clean_question: Callable[[str], str] | None = None
    # a generated dataset: (hub_split, seed[, levels]) → its records; no files, no hub, whatever
    # prepare.source says (levels: prepare.arith_levels, the difficulty levels the rows cycle through)
    generate: Callable[..., list[dict]] | None = None

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(self.splits)


# Official DAPO prompts wrap each problem in an instruction (see data/bundled/dapo_math_17k/SOURCE.md).
# The bundled copy is already bare; the hub copy is not. Prompt templates belong to grpo/prompts.py.
DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the "
               "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def strip_dapo_wrapper(text: str) -> str:
    return text.removeprefix(DAPO_PREFIX).removesuffix(DAPO_SUFFIX)


_NUMERIC = (INTEGER, NUMBER)
_MATH = (INTEGER, NUMBER, LATEX)

REGISTRY: dict[str, DatasetSpec] = {spec.name: spec for spec in [
    DatasetSpec(
        name="gsm8k", hub_id="openai/gsm8k", hub_config="main",
        splits={TRAIN: SplitSource("train", ("gsm8k/train.jsonl",)), EVAL: SplitSource("test", ("gsm8k/test.jsonl",))},
        question_field="question", answer_field="answer", parse_answer=parse_gsm8k, answer_types=_NUMERIC,
        license="MIT", meta_fields={"solution": "answer"},
    ),
    DatasetSpec(
        name="gsm_plus", hub_id="qintongli/GSM-Plus", hub_config=None,
        splits={EVAL: SplitSource("testmini", ("gsm_plus/testmini.jsonl",))},
        question_field="question", answer_field="answer", parse_answer=parse_gsm_plus,
        answer_types=(INTEGER, NUMBER, LATEX, NONE), license="CC-BY-SA-4.0",
        meta_fields={"perturbation_type": "perturbation_type", "solution": "solution",
                     "seed_question": "seed_question", "seed_answer": "seed_answer"},
    ),
    DatasetSpec(
        name="math500", hub_id="HuggingFaceH4/MATH-500", hub_config=None,
        splits={EVAL: SplitSource("test", ("math500/test.jsonl",))},
        question_field="problem", answer_field="answer", parse_answer=parse_math, answer_types=_MATH,
        license="MIT", id_field="unique_id",
        meta_fields={"subject": "subject", "level": "level", "solution": "solution"},
    ),
    DatasetSpec(
        name="aime24", hub_id="HuggingFaceH4/aime_2024", hub_config=None,
        splits={EVAL: SplitSource("train", ("aime24/test.jsonl",))},
        question_field="problem", answer_field="answer", parse_answer=parse_numeric, answer_types=(INTEGER,),
        license="MIT", meta_fields={"url": "url", "solution": "solution"},
    ),
    DatasetSpec(
        name="aime25", hub_id="math-ai/aime25", hub_config=None,
        splits={EVAL: SplitSource("test", ("aime25/test.jsonl",))},
        question_field="problem", answer_field="answer", parse_answer=parse_numeric, answer_types=(INTEGER,),
        license="Apache-2.0",
    ),
    DatasetSpec(
        name="amc23", hub_id="math-ai/amc23", hub_config=None,
        splits={EVAL: SplitSource("test", ("amc23/test.jsonl",))},
        # "question": the bundled copy has it (= "problem") and so does the hub copy.
        question_field="question", answer_field="answer", parse_answer=parse_numeric, answer_types=_NUMERIC,
        license="MIT", meta_fields={"url": "url"},
    ),
    DatasetSpec(
        # grpo/data/synthetic.py: integer word problems from prepare.seed at prepare.arith_levels (0 to 3)
        name="arith", hub_id="", hub_config=None,
        splits={TRAIN: SplitSource("train"), EVAL: SplitSource("test")},
        question_field="question", answer_field="answer", parse_answer=parse_numeric, answer_types=(INTEGER,),
        license="generated (this project)", meta_fields={"level": "level"}, generate=generate_split,
    ),
    DatasetSpec(
        name="dapo_math_17k", hub_id="BytedTsinghua-SIA/DAPO-Math-17k", hub_config=None,
        splits={TRAIN: SplitSource("train", ("dapo_math_17k/train.parquet",))},
        # The hub copy repeats each problem 100×; prepare's question dedupe keeps one of each.
        question_field="prompt[0].content", answer_field="reward_model.ground_truth", parse_answer=parse_numeric,
        answer_types=_NUMERIC, license="Apache-2.0", meta_fields={"index": "extra_info.index"},
        clean_question=strip_dapo_wrapper,
    ),
    DatasetSpec(
        name="deepscaler", hub_id="agentica-org/DeepScaleR-Preview-Dataset", hub_config=None,
        # Bundled: only 2 of its 5 component files (AIME 1983-2023, MATH train); see its SOURCE.md.
        splits={TRAIN: SplitSource("train", ("deepscaler_partial/aime.json", "deepscaler_partial/math.json"))},
        question_field="problem", answer_field="answer", parse_answer=parse_math, answer_types=_MATH,
        license="MIT",
        meta_fields={"solution": "solution", "difficulty": "difficulty", "subject": "type", "year": "year",
                     "problem_number": "problem_number"},
    ),
    DatasetSpec(
        name="open_rs", hub_id="knoveleng/open-rs", hub_config=None,
        splits={TRAIN: SplitSource("train")},  # published on the hub only: no bundled copy exists
        question_field="problem", answer_field="answer", parse_answer=parse_math, answer_types=_MATH,
        license="MIT", meta_fields={"solution": "solution", "level": "level"},
    ),
]}


def get_spec(name: str) -> DatasetSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise DataError(f"unknown dataset {name!r}; known: {', '.join(REGISTRY)}") from None

