"""Write chosen settings into params.yaml in place: comments, key order and layout kept (ruamel.yaml's
round trip), so a tuned file still reads as the user wrote it."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from grpo.io import atomic_write_text


def update_params(path: Path, settings: dict[str, Any]) -> list[str]:
    """Set each dotted ``section.key`` of ``settings`` in the YAML file; returns 'key: old -> new' for each
    value that changed. A key the file does not have is added at the end of its section."""
    yaml = YAML()  # round-trip mode
    yaml.width = 4096  # never re-wrap the user's long lines
    yaml.preserve_quotes = True
    yaml.representer.add_representer(  # keep `null` written out (ruamel's default writes nothing)
        type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null"))
    doc = yaml.load(path.read_text(encoding="utf-8"))
    changes = []
    for key, value in settings.items():
        section, name = key.split(".")
        if section not in doc:
            raise KeyError(f"{path}: no section {section!r} for {key}")
        old = doc[section].get(name)
        if old != value:
            doc[section][name] = value
            changes.append(f"{key}: {old} -> {value}")
    if changes:
        out = io.StringIO()
        yaml.dump(doc, out)
        atomic_write_text(path, out.getvalue())
    return changes
