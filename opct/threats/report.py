"""results.md and report.html of a threats run, from `cross_threat.json` alone: one table (rows trained threat x
method, columns every evaluated metric; each cell the change against the benign-SFT control, "+0.12 [0.03, 0.21]")
and a heatmap of the same cells (green: better than the control in the metric's direction, red: worse, deeper with
the size of the change; muted where the interval contains 0 or there is none; the own-threat cells outlined)."""

from __future__ import annotations

import datetime as _dt
import html
from pathlib import Path

from opct.files import read_json, write_atomic
from opct.report import markdown, page
from opct.report.aggregate import num
from opct.report.unparsed import THRESHOLD, mark, share

NOTE = ("Each cell: the change against the sample-matched benign-SFT control of the same seed (method − control; "
        "the control is SFT for the same steps × rows on benign prompts with the starting model's greedy answers), "
        "its mean over seeds and 95% Student-t interval over seeds; (n=k): k seeds, fewer than the run's (n=1: no "
        "interval), in every table. ↑ / ↓: higher / "
        "lower is better. ◆ / outlined: the column belongs to the threat trained on. 'no signal by construction': "
        "the threat's pairs give this method no gradient, so it was not trained. '(u/N unparsed)' in the raw means: u "
        f"of the N answers behind a mean could not be parsed; a change where more than {THRESHOLD:.0%} of one side's "
        "answers went unparsed reads 'inconclusive'.")


def _signed(x: float) -> str:
    """+0.12 / -0.05; a value that rounds to zero is 0.00, never -0.00 (a delta of -1e-4 is no decrease)."""
    s = num(x, 2, plus=True)
    return "0.00" if s == "+0.00" else s


def cell_text(c: dict | None, seeds: int = 0) -> str:
    """'+0.12 [0.03, 0.21]'; ' (n=k)' where the change is over fewer seeds than the run's `seeds` (or one seed)."""
    if c is None:
        return "–"
    if c.get("skipped"):
        return c["skipped"]
    if c["value"] is None:
        return "n/a"
    s = _signed(c["value"])
    if c["lo"] is not None:
        s += f" [{_signed(c['lo'])}, {_signed(c['hi'])}]"
    return s + (f" (n={c['n']})" if c["lo"] is None or c["n"] < seeds else "") + _doubt(c)


def _doubt(c: dict) -> str:
    """' (inconclusive: 100% unparsed in method)' where more than unparsed.THRESHOLD of one side's answers could not
    be parsed (a change read off unreadable answers was shown as any other until 2026-12-07)."""
    for side in ("method", "control", "base"):
        if (part := share(*(c.get(f"{side}_unparsed") or (0, 0)))) > THRESHOLD:
            return f" (inconclusive: {part:.0%} unparsed in {side})"
    return ""


def _seeds(m: dict) -> int:
    return len((m.get("settings") or {}).get("seeds") or [])


def _mean(x, n, seeds: int) -> str:
    """A raw mean, with ' (n=k)' where it holds fewer seeds than the run has (a row of seed 0 alone beside rows of
    seeds 0 and 1 read 0.46 against 0.04 with no mark, found 2026-12-07)."""
    if x is None:
        return "–"
    return f"{x:.2f}" + (f" (n={n})" if isinstance(n, int) and n < seeds else "")


def _header(cols: list[dict]) -> list[str]:
    return ["threat", "method"] + [f"{c['axis']}: {c['label']} {'↑' if c['higher_is_better'] else '↓'}" for c in cols]


def _index(m: dict) -> dict:
    return {(c["threat"], c["method"], c["metric"]): c for c in m["cells"]}


def table(m: dict, marker: str = " ◆") -> tuple[list[str], list[list[str]]]:
    idx = _index(m)
    body = []
    for r in m["rows"]:
        body.append([r["threat"], r["method"]] + [
            cell_text(idx.get((r["threat"], r["method"], c["metric"])), _seeds(m))
            + (marker if c["axis"] == r["threat"] and not r["skipped"] else "")
            for c in m["columns"]])
    return _header(m["columns"]), body


def means_table(m: dict) -> tuple[list[str], list[list[str]]]:
    """The raw means behind the deltas: base and control once, then each row's method mean."""
    idx = _index(m)
    cols, seeds = m["columns"], _seeds(m)
    ctl = {c["metric"]: c for c in m.get("control_vs_base", [])}

    def f(c, key):
        shown = _mean((c or {}).get(f"{key}_mean"), (c or {}).get(f"{key}_n"), seeds)
        return shown + mark(*((c or {}).get(f"{key}_unparsed") or (0, 0)))

    body = [["(base)", ""] + [f(ctl.get(c["metric"]), "base") for c in cols],
            ["(control)", "benign_sft"] + [f(ctl.get(c["metric"]), "control") for c in cols]]
    for r in m["rows"]:
        if not r["skipped"]:
            body.append([r["threat"], r["method"]] + [f(idx.get((r["threat"], r["method"], c["metric"])), "method")
                                                      for c in cols])
    return _header(cols), body


def control_row(m: dict) -> tuple[list[str], list[list[str]]]:
    cells = {c["metric"]: c for c in m.get("control_vs_base", [])}
    return _header(m["columns"]), [["(none)", "control − base"] + [cell_text(cells.get(c["metric"]), _seeds(m))
                                                                  for c in m["columns"]]]


def _f(x) -> str:
    return "–" if x is None else num(x)


def _colour(c: dict | None, scale: float) -> tuple[str, bool]:
    """(CSS background, muted) of a heatmap cell: hue by direction-adjusted sign, alpha by magnitude."""
    if c is None or c.get("skipped") or c["value"] is None:
        return "#eeeeee", True
    adj = c["value"] if c["higher_is_better"] else -c["value"]
    muted = c["lo"] is None or (c["lo"] <= 0.0 <= c["hi"]) or bool(_doubt(c))
    alpha = min(1.0, abs(adj) / scale) * (0.35 if muted else 0.9)
    rgb = "26,150,65" if adj > 0 else "215,48,39"
    return f"rgba({rgb},{alpha:.2f})", muted


def heatmap_html(m: dict) -> str:
    idx = _index(m)
    cols = m["columns"]
    vals = [abs(c["value"]) for c in m["cells"] if c.get("value") is not None]
    scale = max(0.05, max(vals, default=0.0))
    head = "".join(f"<th>{html.escape(h)}</th>" for h in _header(cols))
    trs = []
    for r in m["rows"]:
        tds = [f"<td>{html.escape(r['threat'])}</td>", f"<td>{html.escape(r['method'])}</td>"]
        for col in cols:
            c = idx.get((r["threat"], r["method"], col["metric"]))
            bg, muted = _colour(c, scale)
            own = col["axis"] == r["threat"]
            style = f"background:{bg};" + ("color:#777;" if muted else "font-weight:600;") + (
                "outline:2px solid #333;outline-offset:-2px;" if own else "")
            tip = html.escape(f"{r['method']} on {r['threat']}, {col['metric']}: {cell_text(c, _seeds(m))}"
                              + ("" if c is None or c.get("skipped") else
                                 "; " + ", ".join(f"{k} {_f(c.get(k + '_mean'))}" for k in ("method", "control",
                                                                                             "base"))))
            tds.append(f'<td style="{style}" title="{tip}">{html.escape(cell_text(c, _seeds(m)))}</td>')
        trs.append("<tr>" + "".join(tds) + "</tr>")
    legend = page.para(f"Colour: green = better than the control in the metric's direction, red = worse; full "
                       f"colour at |change| ≥ {scale:.2f}; muted (pale, grey text) where the 95% interval contains 0 "
                       f"or there is only one seed; outlined: the threat's own metrics.", "small")
    return (f'<table class="heatmap" style="border-collapse:collapse;font-size:12px"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(trs)}</tbody></table>' + legend)


def build(root, out=None) -> tuple[Path, Path]:
    """Reads the run `root` and the aggregate in `out` (default `root`), and writes the report into `out`."""
    root = Path(root)
    out = Path(out or root)
    m = read_json(out / "cross_threat.json", "cross-threat matrix")
    s = m.get("settings", {})
    name = str(s.get("name", root.name))
    seeds = ", ".join(map(str, s.get("seeds", [])))
    train = s.get("train") or {}
    facts = [("run", str(root)), ("model", page.model_text(s)), ("seeds", seeds),
             ("trained threats", ", ".join(s.get("threats", []))), ("methods", ", ".join(s.get("methods", [])))]
    if any(train.get(k) is not None for k in ("max_steps", "batch_size", "lr")):  # "None steps x None rows" was shown
        facts.append(("training", f"{train.get('max_steps', '?')} steps x {train.get('batch_size', '?')} rows, lr "
                                  f"{train.get('lr', '?')}" + (" (quick sizes)" if s.get("quick") else "")))
    md = [f"# Cross-threat matrix: {markdown.text(name)}", "", *markdown.facts(facts), ""]
    if s.get("note"):
        md += [*markdown.quote(s["note"]), ""]
    missing = m.get("missing") or []
    if missing:
        md += [*markdown.left_out("Missing", page.cells(len(missing)), missing), ""]
    md += [NOTE, ""]
    header, body = table(m)
    md += ["## Change against the benign-SFT control", "", markdown.table(header, body), ""]
    ch, cb = control_row(m)
    md += ["## The control against the base model", "", markdown.table(ch, cb), ""]
    mh, mb = means_table(m)
    md += ["## Raw means over seeds", "", markdown.table(mh, mb), ""]
    secs = m.get("seconds") or {}
    times = [[k, f"{sum((v or {}).values()):.0f}"] for k, v in secs.items()]
    md += ["## Cells (seconds)", "", markdown.table(["cell", "seconds"], times), ""]
    sections = [("", [f"<h1>{page.escape('Cross-threat matrix: ' + name)}</h1>",
                      page.para("written " + _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                                "small"), page.meta_list(facts)] + ([page.para(s["note"])] if s.get("note") else [])
                 + ([page.left_out_html("Missing", str(len(missing)), missing)] if missing else [])
                 + [page.para(NOTE, "small")]),
                ("Heatmap: change against the control", [heatmap_html(m)]),
                ("Table", [page.table_html(header, body)]),
                ("The control against the base model", [page.table_html(ch, cb)]),
                ("Raw means over seeds", [page.table_html(mh, mb)]),
                ("Cells (seconds)", [page.table_html(["cell", "seconds"], times)])]
    md_path, html_path = out / "results.md", out / "report.html"
    write_atomic(md_path, "\n".join(md).rstrip() + "\n")
    write_atomic(html_path, page.page(f"opct cross-threat matrix: {name}", sections))
    return html_path, md_path
