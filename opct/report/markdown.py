"""results.md: the Markdown every report writes (experiment, robustness, threats, audit), printed to a terminal and
rendered by whatever viewer a user opens it in. Text that came from a file (names, notes, failure messages) keeps
its characters, but never becomes markup: a `<` that could open raw HTML, a comment or an autolink is written
`&lt;` (a `<` before a space, digit or `=` stays as typed, so "<= 0.1" reads as itself in a terminal), a `]` that
could close a link's text or an image's (`](`, `][`, `]:`) is written `\\]` (an interval "[0.1, 0.2]" stays as
typed), a line break inside one line is a space, and a table cell's `|` and `\\` are escaped."""

from __future__ import annotations

import re

_OPENS_MARKUP = re.compile(r"<(?=[A-Za-z/!?])")
_CLOSES_LINK = re.compile(r"(\\*)\](?=[(\[:])")  # with the backslashes before it, which would escape the escape


def text(s) -> str:
    """`s` as inline Markdown on one line: no raw HTML, no autolink, no link or image, no line break."""
    return _inline(s, cell=False)


def _inline(s, cell: bool) -> str:
    s = str(s)
    if cell:  # every backslash doubled, so a run of them before a `]` is already even
        s = s.replace("\\", "\\\\").replace("|", "\\|")
    s = _CLOSES_LINK.sub(lambda m: m.group(1) * (1 if cell else 2) + "\\]", _OPENS_MARKUP.sub("&lt;", s))
    return s.replace("\r\n", " ").replace("\r", " ").replace("\n", " ")


def quote(s) -> list[str]:
    """A block quote of `s` (a note), every one of its lines quoted; raw HTML escaped as in `text`."""
    return ["> " + text(line) if line.strip() else ">" for line in str(s).strip().splitlines()] or [">"]


def table(header: list, body: list[list]) -> str:
    """A Markdown table: the first column left-aligned (names), the others right-aligned (numbers)."""
    lines = ["| " + " | ".join(_inline(h, cell=True) for h in header) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(_inline(c, cell=True) for c in r) + " |" for r in body]
    return "\n".join(lines)


def left_out(label: str, count: str, items: list) -> list[str]:
    """Lines naming what a report's numbers leave out (`label`: Missing, Failed; `count`: "3 cells")."""
    return [f"**{label} ({count}, not in the numbers below):**", "", *[f"- {text(m)}" for m in items]]


def facts(pairs) -> list[str]:
    """A report's header: one `- **key**: value` line per (key, value)."""
    return [f"- **{text(k)}**: {text(v)}" for k, v in pairs]
