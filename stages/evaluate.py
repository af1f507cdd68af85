"""DVC stage evaluate: one model (base, final or best) on one benchmark, so dvc.yaml can fan it out
with ``matrix`` and rerun only the pairs whose inputs changed.

Reads models/base/, the adapter folder models/final/ or models/best/ (none for base) and
data/prepared/eval/<benchmark>.jsonl; writes eval/<model>/<benchmark>.jsonl (per-sample outputs) and
metrics/eval/<model>/<benchmark>.json. The protocol is params evaluate.benchmarks.<benchmark>.
With evaluate.num_processes (and nnodes) above 1 the stage runs under torchrun: the questions are
sharded (grpo/eval/run.py) and rank 0 writes the same files one process writes.
Run from the project root: python -m stages.evaluate --model best --benchmark gsm8k [--params params.yaml]
"""
from grpo.cli import run_stage, seed_everything
from grpo.eval.run import run_evaluation
from grpo.eval.summary import MODELS
from grpo.prompts import PromptStyle


def add_args(parser) -> None:
    parser.add_argument("--model", required=True, choices=MODELS, help="base, or base + models/<final|best>")
    parser.add_argument("--benchmark", required=True, help="a file name under data/prepared/eval/ (no .jsonl)")


def main(params, args) -> None:
    p, pr = params["evaluate"], params["prompt"]
    seed_everything(p.seed)
    run_evaluation(args.model, args.benchmark, p, PromptStyle.from_params(pr))


if __name__ == "__main__":
    run_stage("evaluate", ["evaluate", "prompt"], main, add_args)
