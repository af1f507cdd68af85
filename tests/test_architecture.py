"""docs/ARCHITECTURE.md's traced step against the tree: at most five files beyond stages/train.py,
each present and under 400 lines, with the line count the document states; so are the other files it
gives a count for (the set-up, the data-parallel hooks)."""
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


def test_every_line_count_the_document_states_is_current():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    stated = re.findall(r"`([^`]+\.py)`, (\d+) lines", text)
    assert stated
    for path, count in stated:
        lines = len((ROOT / path).read_text().splitlines())
        assert int(count) == lines, f"docs/ARCHITECTURE.md says {path} has {count} lines; it has {lines}"
