"""The report's tables, laid out like the paper's: one row per arm, one column per metric, each cell
"value [95% CI]". The table *specs* are data (`opct.report.spec`), declared by each axis next to its metrics
(`opct.axes`); this module loops over the axes, `rows()` fills a table from a run, and `opct.report.markdown.table`
and the HTML page render the same rows, so the two files never disagree.
"""

from __future__ import annotations

from opct.report import unparsed
from opct.report.aggregate import cell_text, estimate
from opct.report.spec import Column, Table  # noqa: F401  (the table spec, re-exported)

UP, DOWN = "↑", "↓"


def trained_of(exp: dict) -> dict[str, list]:
    """What the experiment trained on, per axis: `trained`, or in an experiment.json written before it existed, the
    per-axis lists each axis names in its `legacy_keys`."""
    from opct.axes import AXES

    if isinstance(exp.get("trained"), dict):
        return exp["trained"]
    out = {}
    for name, a in AXES.items():
        for key in a.legacy_keys:
            if isinstance(exp.get(key), list):
                out[name] = exp[key]
                break
    return out


def paper_tables(run) -> list[Table]:
    """Each axis's tables, in registry order."""
    from opct.axes import AXES

    names, trained = run.metric_names(), trained_of(run.experiment)
    return [t for name, a in AXES.items() for t in a.tables(names, trained.get(name))]


def detail_tables(run) -> list[Table]:
    """Per family / wrapper / category / domain, training groups first and marked."""
    from opct.axes import AXES

    names, trained = run.metric_names(), trained_of(run.experiment)
    return [t for name, a in AXES.items() for t in a.detail_tables(names, trained.get(name))]


def summary_table() -> Table:
    """The headline numbers printed by `opct report` (transposed: one line per metric, one column per arm)."""
    from opct.axes import AXES

    return Table("summary", "Summary", [c for a in AXES.values() for c in a.summary])


# ------------------------------------------------------------------------------------------------ filling

def direction(run, col: Column) -> bool | None:
    """Which way is better: what the metrics files say, else the spec."""
    for cell in run.cells.values():
        m = cell.metrics.get(col.metric)
        if m is not None and isinstance(m.get("higher_is_better"), bool):
            return m["higher_is_better"]
    return col.higher_is_better


def arrow(run, col: Column) -> str:
    d = direction(run, col)
    return "" if d is None else (" " + (UP if d else DOWN))


def base_arm(run) -> str | None:
    """The arm deltas are taken against: the first arm whose method is `base` (the arm named "base" in an
    experiment.json without arm_specs), or None."""
    specs = run.experiment.get("arm_specs") or {}
    for arm in run.arms:
        if (specs.get(arm) or {}).get("method", arm) == "base":
            return arm
    return None


def rows(run, table: Table) -> tuple[list[str], list[list[str]]]:
    """(header, one row per arm): 'arm', 'seeds', then one "value [lo, hi]" cell per column."""
    header = ["arm", "seeds"] + [c.label + arrow(run, c) for c in table.columns]
    ref = base_arm(run)
    specs = run.experiment.get("arm_specs") or {}
    body = []
    for arm in run.arms:
        k = len(run.seed_runs(arm))
        mark = table.arm_marks.get((specs.get(arm) or {}).get("method", arm))
        row = [f"{arm} ({mark})" if mark else arm, f"{k}/{len(run.seeds)}"]
        for c in table.columns:
            base = estimate(run, ref, c.metric) if c.delta and ref is not None and arm != ref else None
            row.append(cell_text(estimate(run, arm, c.metric), k, base)
                       + unparsed.mark(*unparsed.counts(run.seed_runs(arm), c.metric)))
        body.append(row)
    return header, body


def interval_note(run) -> str:
    ks = {len(run.seed_runs(a)) for a in run.arms if run.seed_runs(a)}
    parts = []
    if 1 in ks:
        parts.append("with one seed, the value is that seed's and the interval its 95% bootstrap interval over "
                     "eval items")
    if any(k >= 2 for k in ks):
        parts.append("with two or more seeds, the value is the mean over seeds and the interval a 95% Student-t "
                     "interval over seeds (mean ± t·s/√k, clipped to the metric's range); '(n=k)' marks a cell "
                     "with fewer seeds than its row")
    if not parts:
        return "No cell is complete yet."
    note = "Cells are value [95% interval]: " + "; ".join(parts) + ". ↑ higher is better, ↓ lower is better; " \
        "– = not measured."
    if any(unparsed.counts(run.seed_runs(a), m)[0] for a in run.arms for m in run.metric_names()):
        note += " " + unparsed.NOTE
    return note


def transposed(run, table: Table) -> tuple[list[str], list[list[str]]]:
    """(header, one row per column of `table`): 'metric', then one cell per arm."""
    header, body = rows(run, table)
    return ["metric"] + [r[0] for r in body], [[h] + [r[i] for r in body] for i, h in enumerate(header) if i >= 2]


# ------------------------------------------------------------------------------------------------ text

def plain(header: list[str], body: list[list[str]]) -> str:
    """A fixed-width table for a terminal."""
    widths = [max(len(str(r[i])) for r in [header] + body) for i in range(len(header))]

    def line(r):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    return "\n".join([line(header)] + [line(r) for r in body])
