"""results.md and report.html of a robustness run, from its files alone (`robustness.json`, `study.json`, the cells'
`rows.json`): per study and axis a table (rows method x condition [x], columns metric; each cell the mean over seeds
with its 95% t-interval and n) and, where x is numeric with two or more values, curves (mean and interval band
against x, one line per method and condition)."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from opct.files import read_json, write_atomic
from opct.report import markdown, page, unparsed
from opct.report.aggregate import num
from opct.robustness.runner import load_rows


def _cell(r: dict | None, seeds: int) -> str:
    if r is None:
        return "–"
    if r["mean"] is None:
        return "undefined" + (f" (in {r['n_undefined']} of {r['n_undefined']} seeds)" if r["n_undefined"] else "")
    s = num(r["mean"])
    if r["ci_low"] is not None:
        s += f" [{num(r['ci_low'])}, {num(r['ci_high'])}]"
    if r["n"] < seeds:
        s += f" (n={r['n']}" + (f", {r['n_undefined']} undefined" if r["n_undefined"] else "") + ")"
    return s + unparsed.mark(r.get("unparsed", 0), r.get("answers", 0))


def _label(metric: str, rows: list[dict]) -> str:
    hib = next((r["higher_is_better"] for r in rows if r["metric"] == metric), None)
    return metric + ("" if hib is None else (" ↑" if hib else " ↓"))


def _x(x) -> str:
    return "" if x is None else (f"{x:g}")


def tables(agg: list[dict], seeds: int) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, body) per (study, axis) and, for the wash fractions, one more per (study, axis)."""
    out = []
    keys = list(dict.fromkeys((r["study"], r["axis"]) for r in agg))
    for study, axis in keys:
        rows = [r for r in agg if r["study"] == study and r["axis"] == axis]
        for kind in ("metric", "wash"):
            mine = [r for r in rows if r["metric"].startswith("wash_fraction") == (kind == "wash")]
            if not mine:
                continue
            metrics = list(dict.fromkeys(r["metric"] for r in mine))
            lines = list(dict.fromkeys((r["method"], r["condition"], r["x"]) for r in mine))
            index = {(r["method"], r["condition"], r["x"], r["metric"]): r for r in mine}
            header = ["method", "condition", "x"] + [_label(m, mine) for m in metrics]
            body = [[m, c, _x(x)] + [_cell(index.get((m, c, x, met)), seeds) for met in metrics]
                    for m, c, x in lines]
            title = f"{study}: {axis}" + (" — wash fraction f = (M - M_trained) / (M_base - M_trained)"
                                           if kind == "wash" else "")
            out.append((title, header, body))
    return out


def curves_png(agg: list[dict], study: str, axis: str) -> bytes | None:
    """One panel per metric with a numeric x taking two or more values: mean and 95% band per method/condition."""
    from opct.report.plots import _figure, _png, arm_colors

    base = {r["metric"]: r["mean"] for r in agg if r["study"] == study and r["axis"] == axis and r["method"] == "base"
            and r["mean"] is not None}
    rows = [r for r in agg if r["study"] == study and r["axis"] == axis and r["x"] is not None]
    lines: dict = {}
    for r in rows:
        lines.setdefault((r["metric"], r["method"], r["condition"]), []).append(r)
    metrics = [m for m in dict.fromkeys(r["metric"] for r in rows)
               if any(len({p["x"] for p in v}) >= 2 for (mm, _, _), v in lines.items() if mm == m)]
    if not metrics:
        return None
    ncol = min(3, len(metrics))
    nrow = -(-len(metrics) // ncol)
    fig = _figure(4.2 * ncol, 3.0 * nrow, bottom=0.6, top=0.45)
    names = list(dict.fromkeys(f"{m} {c}" if c not in ("dose",) else m for (_, m, c) in lines))
    colors = arm_colors(names)
    for i, metric in enumerate(metrics):
        ax = fig.add_subplot(nrow, ncol, i + 1)
        for (mm, method, cond), pts in lines.items():
            if mm != metric or len({p["x"] for p in pts}) < 2:
                continue
            pts = sorted((p for p in pts if p["mean"] is not None), key=lambda p: p["x"])
            if not pts:
                continue
            label = f"{method} {cond}" if cond not in ("dose",) else method
            xs = [p["x"] for p in pts]
            ax.plot(xs, [p["mean"] for p in pts], "-o", ms=3, color=colors[label], label=label)
            band = [(p["x"], p["ci_low"], p["ci_high"]) for p in pts if p["ci_low"] is not None]
            if band:
                ax.fill_between([b[0] for b in band], [b[1] for b in band], [b[2] for b in band],
                                color=colors[label], alpha=0.15, lw=0)
        if metric in base:  # the starting model, for reference
            ax.axhline(base[metric], color="0.4", ls="--", lw=1, label="base")
        if metric.startswith("wash_fraction"):  # 0: intact, 1: back at the base model
            for y in (0.0, 1.0):
                ax.axhline(y, color="0.6", ls=":", lw=1)
        if not ax.lines:
            ax.text(0.5, 0.5, "undefined in every seed", ha="center", va="center", transform=ax.transAxes,
                    fontsize=8, color="0.4")
        ax.set_title(_label(metric, rows), fontsize=8)
        ax.set_xlabel("x (wash: benign SFT examples)" if study == "washout" else "x", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7)
    return _png(fig)


def _times(settings: dict, seconds: dict) -> list[list[str]]:
    """Each cell's seconds (`load_rows`'s); "–" for a cell not finished or not timed."""
    body = []
    for name in settings.get("studies", {}):
        for seed in settings.get("seeds", []):
            sec = seconds.get((name, seed))
            body.append([name, str(seed), "–" if sec is None else f"{sec:.0f}"])
    return body


NOTE = ("Each cell: the mean over seeds with a 95% Student-t interval over seeds (mean ± t(0.975, k-1) s / √k); "
        "(n=k) marks a cell with fewer seeds than the run; 'undefined' = the value is not defined in any seed (a "
        "wash fraction where training moved M by less than min_gap). ↑ / ↓: higher / lower is better (for a wash "
        "fraction lower = the trained behaviour survives). '(u/N unparsed)': u of the N answers behind the cell could "
        "not be parsed, summed over seeds (N counts every answer the metric read, parsed or not).")


def build(root, out=None) -> tuple[Path, Path]:
    """Reads the run `root` and the aggregate in `out` (default `root`), and writes the report into `out`."""
    root = Path(root)
    out = Path(out or root)
    data = read_json(out / "robustness.json", "robustness results")
    settings, rows, seconds = load_rows(root)  # each finished cell's rows.json, read once and checked
    agg, seeds = data["rows"], len(settings.get("seeds", []))
    md = [f"# Robustness: {markdown.text(settings.get('name', root.name))}", "", *markdown.facts([
          ("model", page.model_text(settings)),
          ("seeds", ", ".join(map(str, settings.get("seeds", [])))),
          ("studies", ", ".join(settings.get("studies", {})) + (" (quick sizes)" if settings.get("quick") else ""))]),
          ""]
    if settings.get("note"):
        md += [*markdown.quote(settings["note"]), ""]
    missing = [f"{name} seed {seed}: not finished (no rows.json)" for name in settings.get("studies", {})
               for seed in settings.get("seeds", []) if seed not in rows.get(name, {})]
    if missing:  # a killed or running run
        md += [*markdown.left_out("Missing", page.cells(len(missing)), missing), ""]
    md += [NOTE, ""]
    html_secs = [("", [f"<h1>{page.escape('Robustness: ' + str(settings.get('name', root.name)))}</h1>",
                       page.para("written " + _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                                 "small"),
                       page.meta_list([("run", str(root)), ("model", page.model_text(settings)),
                                       ("seeds", ", ".join(map(str, settings.get("seeds", []))))])]
                  + ([page.left_out_html("Missing", str(len(missing)), missing)] if missing else [])
                  + [page.para(NOTE, "small")])]
    for i, (title, header, body) in enumerate(tables(agg, seeds), 1):
        md += [f"## {i}. {markdown.text(title)}", "", markdown.table(header, body), ""]
        html_secs.append((title, [page.table_html(header, body)]))
    for study, axis in dict.fromkeys((r["study"], r["axis"]) for r in agg):
        png = curves_png(agg, study, axis)
        if png is not None:
            html_secs.append((f"{study}: {axis} — curves", [page.img_html(png, f"{study} {axis} curves")]))
    times = _times(settings, seconds)
    md += ["## Cells", "", markdown.table(["study", "seed", "seconds"], times), ""]
    html_secs.append(("Cells", [page.table_html(["study", "seed", "seconds"], times)]))
    md_path, html_path = out / "results.md", out / "report.html"
    write_atomic(md_path, "\n".join(md).rstrip() + "\n")
    write_atomic(html_path, page.page(f"opct robustness: {settings.get('name')}", html_secs))
    return html_path, md_path
