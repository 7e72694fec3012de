"""report.html: one self-contained file — inline CSS, plots as base64 PNG data URIs, no scripts, no links out.
Every piece of text that came from a file (names, notes, metric labels) is escaped."""

from __future__ import annotations

import base64
from html import escape

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1250px;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; } td { text-align: right; white-space: nowrap; }
td:first-child, th:first-child { text-align: left; font-weight: 600; } th { background: #f4f4f4; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 0.5em 0.8em; }
.missing { background: #fdecea; border-left: 4px solid #d93025; padding: 0.5em 0.8em; }
.small { color: #555; font-size: 12px; } img { max-width: 100%; display: block; margin: 0.5em 0; }
.scroll { overflow-x: auto; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; } dt { font-weight: 600; }
"""


def table_html(header: list[str], body: list[list[str]]) -> str:
    out = ['<div class="scroll"><table>', "<tr>" + "".join(f"<th>{escape(str(h))}</th>" for h in header) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>" for r in body]
    out.append("</table></div>")
    return "\n".join(out)


def img_html(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def page(title: str, sections: list[tuple[str, list[str]]]) -> str:
    """`sections`: (heading or "", [already-escaped HTML fragments])."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{escape(title)}</title>", f"<style>{CSS}</style></head><body>"]
    for heading, frags in sections:
        if heading:
            parts.append(f"<h2>{escape(heading)}</h2>")
        parts += frags
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def para(text: str, cls: str = "") -> str:
    return f'<p class="{cls}">{escape(text)}</p>' if cls else f"<p>{escape(text)}</p>"


def bullet_list(items: list[str], cls: str = "") -> str:
    lis = "".join(f"<li>{escape(i)}</li>" for i in items)
    return f'<ul class="{cls}">{lis}</ul>' if cls else f"<ul>{lis}</ul>"


def cells(n: int) -> str:
    """"1 cell" / "3 cells": how a report counts the cells it leaves out."""
    return f"{n} cell" + ("" if n == 1 else "s")


def left_out_html(label: str, count: str, items: list[str]) -> str:
    """What a report's numbers leave out, as report.html shows it (`opct.report.markdown.left_out` in results.md)."""
    return f'<div class="missing"><b>{label} ({count}, not in the numbers below):</b>' + bullet_list(items) + "</div>"


def meta_list(pairs: list[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in pairs) + "</dl>"


def model_text(settings: dict) -> str:
    """A study's model as its report's header shows it: 'test (/path/to/dir)', the name alone where the directory is
    the name or not recorded, '?' where neither is (never 'None (None)')."""
    name, where = settings.get("model"), settings.get("model_dir")
    if name is None:
        return str(where) if where else "?"
    return f"{name} ({where})" if where and where != name else str(name)
