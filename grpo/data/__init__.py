"""Datasets: the registry (where each lives, how its gold answer reads), loading into one row schema,
and preparing the train/val/eval files of the prepare stage."""
from grpo.data.answers import ANSWER_TYPES, Gold
from grpo.data.errors import DataError
from grpo.data.loading import BUNDLED_DIR, LoadedRows, load_dataset_rows
from grpo.data.prepare import PreparedData, prepare_datasets, write_prepared
from grpo.data.registry import REGISTRY, DatasetSpec, SplitSource, get_spec
from grpo.data.splitting import normalize_question

__all__ = [
    "ANSWER_TYPES", "BUNDLED_DIR", "DataError", "DatasetSpec", "Gold", "LoadedRows", "PreparedData", "REGISTRY",
    "SplitSource", "get_spec", "load_dataset_rows", "normalize_question", "prepare_datasets", "write_prepared",
]
