"""docs/ARCHITECTURE.md's traced step against the tree: at most five files beyond stages/train.py,
each present and under 400 lines, with the line count the document states."""
from __future__ import annotations

import re

from tests.conftest import ROOT


def test_the_traced_step_is_five_files_of_under_400_lines():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    rows = re.findall(r"^\| \d \| `([^`]+)` \| (\d+) \|", text, re.M)
    assert 1 <= len(rows) <= 5, rows
    for path, stated in rows:
        lines = len((ROOT / path).read_text().splitlines())
        assert lines < 400, f"{path}: {lines} lines"
        assert int(stated) == lines, f"docs/ARCHITECTURE.md says {path} has {stated} lines; it has {lines}"
    assert len(text.splitlines()) <= 150
