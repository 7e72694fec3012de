"""results.md: the Markdown every report writes (experiment, robustness, threats, audit), printed to a terminal and
rendered by whatever viewer a user opens it in. Text that came from a file (names, notes, failure messages) keeps
its characters, but never becomes markup: a `<` that could open raw HTML, a comment or an autolink is written
`&lt;` (a `<` before a space, digit or `=` stays as typed, so "<= 0.1" reads as itself in a terminal), a `]` that
could close a link's text or an image's (`](`, `][`, `]:`) is written `\\]` (an interval "[0.1, 0.2]" stays as
typed), an `&` that would start an entity is written `&amp;`, a backslash that would escape the next character is
doubled, a line break inside one line is a space, and a table cell's `|` is escaped. A code span
(backticks) is kept as typed: it holds no markup, and shows an entity as written; a backtick outside one is escaped,
so that two pieces of text on one line (a key and its value, two cells) cannot make a span of their own that reaches
over the escaping."""

from __future__ import annotations

import re

_OPENS_MARKUP = re.compile(r"<(?=[A-Za-z/!?])")
_ENTITY = re.compile(r"&(?=#?[A-Za-z0-9]+;)")  # `&lt;` typed in a name would be shown as `<`
_CLOSES_LINK = re.compile(r"\](?=[(\[:])")
_ESCAPING = re.compile(r"\\(?=[!-/:-@[-`{-~]|$)")  # before ASCII punctuation (or what follows the piece): an escape


def text(s) -> str:
    """`s` as inline Markdown on one line: no raw HTML, no autolink, no link or image, no line break."""
    return _inline(s, cell=False)


# A code span as CommonMark reads one: a run of backticks (not after a backtick or a backslash, which would make it
# part of a longer run or escaped) up to the next run of the same length. Its text is shown as typed (an entity in
# it would be shown as `&lt;`, not `<`), and it holds no markup; anything else is escaped.
_CODE_SPAN = re.compile(r"(?<![`\\])(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)


def _inline(s, cell: bool) -> str:
    s, out, pos = str(s), [], 0
    for m in _CODE_SPAN.finditer(s):
        out += [_escaped(s[pos:m.start()], cell), m.group(0).replace("|", "\\|") if cell else m.group(0)]
        pos = m.end()
    out.append(_escaped(s[pos:], cell))
    return "".join(out).replace("\r\n", " ").replace("\r", " ").replace("\n", " ")


def _escaped(s: str, cell: bool) -> str:
    s = _ESCAPING.sub(r"\\\\", s)  # shown as typed; every backslash before a `]` or a backtick is now even
    s = _CLOSES_LINK.sub(r"\\]", _OPENS_MARKUP.sub("&lt;", _ENTITY.sub("&amp;", s)))
    s = s.replace("`", "\\`")  # outside a code span: it opens or closes none across two pieces of one line
    return s.replace("|", "\\|") if cell else s


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
