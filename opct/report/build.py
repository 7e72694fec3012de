"""`build_report(run_dir)`: read a run directory (see `opct.report.rundir`) and write `results.md` and the
self-contained `report.html` beside it (or into `out_dir`). Both are written to a temporary file first and renamed,
so a reader never sees half a report."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from opct.axes import AXES
from opct.errors import OpctError
from opct.files import write_atomic as _write_atomic
from opct.report import markdown as md
from opct.report import mechanism, page, paper, plots, tables
from opct.report.rundir import Run, load_run


def _header(run: Run) -> list[tuple[str, str]]:
    exp = run.experiment
    done = len(run.cells)
    rows = [("run", str(run.dir)), ("experiment", str(exp.get("name", run.dir.name))),
            ("model", str(exp.get("model", "?")) + (f" ({exp['model_dir']})" if exp.get("model_dir")
                                                      and exp.get("model_dir") != exp.get("model") else "")),
            ("arms", ", ".join(run.arms)),
            ("seeds", ", ".join(map(str, run.seeds))),
            ("complete cells", f"{done} of {len(run.arms) * len(run.seeds)}")]
    for key in ("train", "eval"):  # the budgets, flat: scalar settings only
        if isinstance(exp.get(key), dict):
            flat = [f"{k}={v}" for k, v in exp[key].items() if isinstance(v, (str, int, float, bool)) or v is None]
            if flat:
                rows.append((f"{key} settings", ", ".join(flat)))
    specs = exp.get("arm_specs") or {}
    variants = [f"{a} = {', '.join(f'{k}={v}' for k, v in s.items())}" for a, s in specs.items()
                if a in run.arms and s != {"method": a}]
    if variants:
        rows.append(("arm settings", "; ".join(variants)))
    for axis, fams in tables.trained_of(exp).items():
        if fams:
            noun = AXES[axis].family_noun if axis in AXES else "family"
            rows.append((f"trained {axis} {'families' if noun == 'family' else noun + 's'}", ", ".join(map(str, fams))))
    return rows


def _missing(run: Run) -> list[str]:
    return [f"{arm} seed {seed}: {why}" for arm, seed, why in run.missing]


def _failed(run: Run) -> list[str]:
    return [f"{arm} seed {seed}: {why}" for arm, seed, why in run.failed]


def _cells_table(run: Run) -> tuple[list[str], list[list[str]]]:
    header = ["arm", "seed", "pairs s", "train s", "eval s", "finished"]
    body = []
    for (arm, seed), c in sorted(run.cells.items(), key=lambda kv: (run.arms.index(kv[0][0]), kv[0][1])):
        sec = c.done.get("seconds") if isinstance(c.done.get("seconds"), dict) else {}
        secs = [f"{sec[k]:.0f}" if isinstance(sec.get(k), (int, float)) else "–" for k in ("pairs", "train", "eval")]
        body.append([arm, str(seed), *secs, str(c.done.get("finished", "–"))])
    return header, body


def summary_text(run) -> str:
    """The headline table for a terminal: one line per metric, one column per arm. `run`: a Run or its directory."""
    if not isinstance(run, Run):
        run = load_run(run)
    header, body = tables.transposed(run, tables.summary_table())
    out = [tables.plain(header, body)]
    if run.missing:
        out.append(f"missing ({len(run.missing)}): " + "; ".join(_missing(run)))
    if run.failed:
        out.append(f"failed, not in the numbers ({len(run.failed)}): " + "; ".join(_failed(run)))
    return "\n".join(out)


def results_markdown(run: Run) -> str:
    exp = run.experiment
    lines = [f"# Results: {md.text(exp.get('name', run.dir.name))}", "", *md.facts(_header(run))]
    if exp.get("note"):
        lines += ["", "> **Note:**", *md.quote(exp["note"])]
    if run.missing:
        lines += ["", *md.left_out("Missing", page.cells(len(run.missing)), _missing(run))]
    if run.failed:
        lines += ["", *md.left_out("Failed", str(len(run.failed)), _failed(run))]
    lines += ["", tables.interval_note(run), ""]
    for i, t in enumerate(tables.paper_tables(run), 1):
        lines += [f"## {i}. {md.text(t.title)}", "", md.table(*tables.rows(run, t)), ""]
        if t.note:
            lines += [t.note, ""]
    lines += ["## Per group", ""]
    for t in tables.detail_tables(run):
        lines += [f"### {md.text(t.title)}", "", md.table(*tables.rows(run, t)), ""]
        if t.note:
            lines += [t.note, ""]
    lines += ["## Paper vs opct", "", "### The OPCT paper's headline claims", "",
              md.table(*paper.claims_table(run)), "", "### Published numbers beside this run's", "",
              md.table(*paper.published_table(run)), "", paper.NOTE, ""]
    header, body = paper.ablations_table(run)
    if body:
        lines += ["### Ablations", "", md.table(header, body), "", paper.ABLATION_NOTE, ""]
    probe = mechanism.load(run.dir)
    if probe is not None:
        lines += ["## Mechanism", "", *(f"**{md.text(t)}**" if t.startswith("Out of date") else md.text(t)
                                        for t in mechanism.coverage(probe, run)), "", mechanism.markdown(probe)]
    return "\n".join(lines).rstrip() + "\n"


def report_html(run: Run) -> str:
    exp = run.experiment
    name = str(exp.get("name", run.dir.name))
    written = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    top = [f"<h1>{page.escape(name)}</h1>", page.para(f"opct report, written {written}", "small"),
           page.meta_list(_header(run))]
    if exp.get("note"):
        top.append(page.para("Note: " + str(exp["note"]).strip(), "note"))
    if run.missing:
        top.append(page.left_out_html("Missing", page.cells(len(run.missing)), _missing(run)))
    if run.failed:
        top.append(page.left_out_html("Failed", str(len(run.failed)), _failed(run)))
    top.append(page.para(tables.interval_note(run), "small"))
    sections = [("", top), ("Summary", [page.table_html(*tables.transposed(run, tables.summary_table()))])]

    for t in tables.paper_tables(run):
        frags = [page.table_html(*tables.rows(run, t))]
        if t.note:
            frags.append(page.para(t.note, "small"))
        directions = {c.metric: tables.direction(run, c) for c in t.columns}
        alt = f"{t.title}: each arm with its 95% interval"
        frags.append(page.img_html(plots.metric_grid(run, t, directions), alt))
        sections.append((t.title, frags))

    frags = []
    for t in tables.detail_tables(run):
        frags.append(f"<h3>{page.escape(t.title)}</h3>")
        frags.append(page.img_html(plots.grouped(run, t, t.train_groups, t.ylabel), t.title))
        frags.append(page.table_html(*tables.rows(run, t)))
        if t.note:
            frags.append(page.para(t.note, "small"))
    if frags:
        sections.append(("Training vs held-out groups", frags))

    sections.append(("Paper vs opct", [
        "<h3>The OPCT paper's headline claims</h3>", page.table_html(*paper.claims_table(run)),
        "<h3>Published numbers beside this run's</h3>", page.table_html(*paper.published_table(run)),
        page.para(paper.NOTE, "small")]
        + (["<h3>Ablations</h3>", page.table_html(*paper.ablations_table(run)), page.para(paper.ABLATION_NOTE, "small")]
           if paper.ablations_table(run)[1] else [])))

    probe = mechanism.load(run.dir)
    if probe is not None:
        frags = [page.para(t, "missing" if t.startswith("Out of date") else "small")
                 for t in mechanism.coverage(probe, run)]
        for title, header, rows in mechanism.tables(probe):
            frags += [f"<h3>{page.escape(title)}</h3>", page.table_html(header, rows)]
        if probe.get("skipped"):
            frags.append(page.para("Not probed: " + "; ".join(probe["skipped"]), "small"))
        frags.append(page.para(mechanism.NOTE, "small"))
        sections.append(("Mechanism", frags))

    png = plots.curves(run)
    if png is not None:
        sections.append(("Training curves", [
            page.para("Per optimizer step, one line per arm and seed (faint: every step; solid: moving average).",
                      "small"),
            page.img_html(png, "training curves per arm and seed")]))
    if run.cells:
        sections.append(("Cells", [page.table_html(*_cells_table(run))]))
    return page.page(f"opct report: {name}", sections)


def build_report(run_dir, out_dir=None) -> tuple[Path, Path]:
    """Write `report.html` and `results.md` for the run at `run_dir` (a Run or its directory) into `out_dir` (default:
    the run directory). Returns (html_path, md_path). Raises OpctError for a missing run or a malformed file (naming
    it)."""
    run = run_dir if isinstance(run_dir, Run) else load_run(run_dir)
    out = Path(out_dir) if out_dir else run.dir
    md_path, html_path = out / "results.md", out / "report.html"
    text = results_markdown(run)
    html = report_html(run)
    try:
        out.mkdir(parents=True, exist_ok=True)
        _write_atomic(md_path, text)
        _write_atomic(html_path, html)
    except OSError as e:
        from opct.errors import blocking_file, not_a_dir, os_problem

        file = blocking_file(str(out))  # "File exists" said nothing of it
        problem = f"{file} is {not_a_dir(file)}, not a directory" if file is not None else os_problem(e)
        raise OpctError(f"{out}: cannot write the report: {problem}") from None
    return html_path, md_path
