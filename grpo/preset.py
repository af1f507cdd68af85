"""Switch params.yaml to a hardware preset: ``python -m grpo.preset rtx3060ti-8gb``.

A preset is a complete params file in ``presets/<name>.yaml``. It is validated (every section, as the
stages will read it) and then copied over params.yaml atomically, so ``dvc repro``, ``dvc exp run -S``
and ``python -m grpo.check`` all see it as the ordinary params file. ``git checkout params.yaml`` goes
back to the CPU default. ``--list`` prints the presets.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpo.config import SECTIONS, ConfigError, load_params
from grpo.io import atomic_write_text

PRESETS = Path(__file__).resolve().parent.parent / "presets"


def available(presets_dir: Path = PRESETS) -> list[str]:
    return sorted(p.stem for p in presets_dir.glob("*.yaml"))


def preset_path(name: str, presets_dir: Path = PRESETS) -> Path:
    """The preset's file; ValueError listing the presets when there is none called ``name``."""
    path = presets_dir / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(available(presets_dir)) or '(none)'}")
    return path


def apply_preset(name: str, params_path: Path, presets_dir: Path = PRESETS) -> Path:
    """Validate preset ``name`` and copy it over ``params_path``; raises ValueError or ConfigError."""
    path = preset_path(name, presets_dir)
    load_params(path, list(SECTIONS))
    atomic_write_text(params_path, path.read_text(encoding="utf-8"))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo.preset", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help="a preset in presets/ (without .yaml)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="file to overwrite (default: params.yaml)")
    parser.add_argument("--list", action="store_true", help="list the presets and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(available()))
        return 0
    if not args.name:
        parser.error(f"name a preset ({', '.join(available())}) or use --list")
    try:
        path = apply_preset(args.name, args.params)
    except (ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.params} <- {path.relative_to(PRESETS.parent)}; check the memory plan with: python -m grpo.check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
