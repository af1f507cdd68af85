"""The report's document structure and its two renderers.

A report is a list of blocks (headings, paragraphs, tables, figures, code, bullet lists); ``to_markdown``
and ``to_html`` each render exactly that structure, so reports/report.md and reports/report.html cannot
disagree and no general Markdown parser is needed. Inline text supports only what the report writes:
``code`` spans and **bold**. The HTML is self-contained: inline CSS, images as base64 data URIs, no
external URL anywhere, so it opens offline and survives being mailed around.
"""
from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Union


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Image:
    src: str  # relative to the reports folder
    caption: str


@dataclass(frozen=True)
class Code:
    text: str
    lang: str = ""


@dataclass(frozen=True)
class Bullets:
    items: list[str]


Block = Union[Heading, Para, Table, Image, Code, Bullets]


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[Block]) -> str:
    parts = []
    for b in blocks:
        if isinstance(b, Heading):
            parts.append(f"{'#' * b.level} {b.text}")
        elif isinstance(b, Para):
            parts.append(b.text)
        elif isinstance(b, Table):
            lines = ["| " + " | ".join(map(_md_cell, b.header)) + " |", "|" + " --- |" * len(b.header)]
            lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in b.rows]
            parts.append("\n".join(lines))
        elif isinstance(b, Image):
            parts.append(f"![{b.caption}]({b.src})\n\n*{b.caption}*")
        elif isinstance(b, Code):
            parts.append(f"```{b.lang}\n{b.text.rstrip()}\n```")
        elif isinstance(b, Bullets):
            parts.append("\n".join(f"- {item}" for item in b.items))
    return "\n\n".join(parts) + "\n"


def _inline_html(text: str) -> str:
    """Escape, then turn the two inline marks the report uses into tags (code first: no bold inside)."""
    pieces = re.split(r"(`[^`]*`)", text)
    out = []
    for piece in pieces:
        if len(piece) >= 2 and piece.startswith("`") and piece.endswith("`"):
            out.append(f"<code>{html.escape(piece[1:-1])}</code>")
        else:
            out.append(re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(piece)))
    return "".join(out)


CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;margin:0;background:#fafafa}
main{max-width:980px;margin:0 auto;padding:24px 32px;background:#fff}
h1{border-bottom:2px solid #ddd;padding-bottom:6px}h2{border-bottom:1px solid #eee;margin-top:2em}
table{border-collapse:collapse;margin:12px 0;font-size:14px}
th,td{border:1px solid #ddd;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fcfcfc}
code{background:#f3f3f3;padding:1px 4px;border-radius:3px;font-size:13px}
pre{background:#f6f8fa;padding:12px;overflow-x:auto;border-radius:4px}pre code{background:none;padding:0}
figure{margin:16px 0}img{max-width:100%;height:auto}figcaption{color:#666;font-size:13px}
"""


def to_html(blocks: list[Block], base_dir: Path, title: str) -> str:
    """A single self-contained HTML page; images are read from ``base_dir`` and embedded."""
    body = []
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{_inline_html(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            body.append(f"<p>{_inline_html(b.text)}</p>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{_inline_html(h)}</th>" for h in b.header)
            rows = "".join("<tr>" + "".join(f"<td>{_inline_html(c)}</td>" for c in row) + "</tr>" for row in b.rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif isinstance(b, Image):
            data = base64.b64encode((base_dir / b.src).read_bytes()).decode("ascii")
            body.append(f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(b.caption)}">'
                        f"<figcaption>{_inline_html(b.caption)}</figcaption></figure>")
        elif isinstance(b, Code):
            body.append(f"<pre><code>{html.escape(b.text.rstrip())}</code></pre>")
        elif isinstance(b, Bullets):
            body.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in b.items) + "</ul>")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{CSS}</style>\n</head>\n<body>\n<main>\n" + "\n".join(body) + "\n</main>\n</body>\n</html>\n")
