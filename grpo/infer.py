"""Generate with a trained adapter: ``python -m grpo.infer --adapter models/best --prompt "What is 15 + 27?"``.

The base is the one the adapter records (``base_model_name_or_path`` in adapter_config.json): models/base/
when that folder was built from it (the pipeline's case), else that folder or hub id; ``--base`` overrides.
The prompt goes through the base's chat template and the project's prompt style (``prompt`` in
``--params``, so the model sees exactly what training showed it, prefill included), then the native engine
decodes greedily unless ``--temperature`` is above 0. Prints the response: prefill + generated text.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grpo.config import ConfigError, load_params
from grpo.model.adapter import read_adapter_config
from grpo.model.base_model import BUNDLED_SMOLLM2
from grpo.prompts import PromptStyle, build_prompt, full_response
from grpo.rollout.base import SamplingParams
from grpo.rollout.native import NativeEngine

BASE_DIR = Path("models/base")
DEFAULT_MAX_NEW_TOKENS = 512  # also what grpo.check plans infer with


def resolve_base(adapter_dir: Path, base: str | None = None, base_dir: Path = BASE_DIR) -> str:
    """The base model folder or hub id to load ``adapter_dir`` on."""
    if base is not None:
        return base
    recorded = read_adapter_config(adapter_dir).get("base_model_name_or_path")
    if not recorded:
        raise ValueError(f"{adapter_dir}: adapter_config.json records no base_model_name_or_path; pass --base")
    info = base_dir / "MODEL_INFO.json"
    if info.is_file() and json.loads(info.read_text(encoding="utf-8")).get("source") == recorded:
        return str(base_dir)
    if (Path(recorded).expanduser() / "config.json").is_file():
        return str(Path(recorded).expanduser())
    if recorded == BUNDLED_SMOLLM2:
        raise FileNotFoundError(f"{adapter_dir} was trained on the bundled {recorded!r}, which lives in {base_dir}/: "
                                f"run `dvc pull models/base` or `dvc repro base_model`, or pass --base")
    return recorded  # a hub id


def prompt_style(params: Path) -> PromptStyle:
    if not params.is_file():
        return PromptStyle()
    p = load_params(params, ["prompt"])["prompt"]
    return PromptStyle.from_params(p)


def generate(adapter: Path, prompt: str, *, base: str | None = None, style: PromptStyle = PromptStyle(),
             sampling: SamplingParams = SamplingParams(temperature=0.0), quantization: str = "none",
             compute_dtype: str = "auto", device: str = "auto") -> str:
    """The response (prefill + generated text) of base + ``adapter`` to one ``prompt``."""
    model_dir = resolve_base(adapter, base)
    engine = NativeEngine.from_pretrained(model_dir, batch_size=1, quantization=quantization,
                                          compute_dtype=compute_dtype, device=device, adapter_dir=str(adapter))
    try:
        # the adapter is named per call too: generate(adapter_dir=None) would switch back to the bare base
        (completion,), = engine.generate([build_prompt(engine.tokenizer, prompt, style)], sampling,
                                         adapter_dir=str(adapter))
    finally:
        engine.close()
    return full_response(style, completion.text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo.infer", description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", type=Path, required=True, help="a PEFT-format LoRA folder (models/best, ...)")
    parser.add_argument("--prompt", required=True, help="the question")
    parser.add_argument("--base", help="base model folder or hub id (default: the adapter's recorded base)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="for the prompt style")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quantization", choices=["none", "nf4"], default="none")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    try:
        sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                                  seed=args.seed)
        text = generate(args.adapter, args.prompt, base=args.base, style=prompt_style(args.params),
                        sampling=sampling, quantization=args.quantization, device=args.device)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
