"""The report's tables, laid out like the paper's: one row per arm, one column per metric, each cell
"value [95% CI]". The table *specs* are data (which metric goes in which column); `rows()` fills them from a run,
and `markdown()` / the HTML page render the same rows, so the two files never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opct.report.aggregate import cell_text, estimate

UP, DOWN = "↑", "↓"


@dataclass
class Column:
    label: str
    metric: str
    higher_is_better: bool | None = None  # used when no metrics file says
    delta: bool = False  # show the change from the base arm


@dataclass
class Table:
    key: str
    title: str
    columns: list[Column]
    note: str = ""
    groups: list = field(default_factory=list)  # for per-group tables: the group values (for the plots)


def _split_cols(metrics: list[tuple[str, str, bool]], key: str, labels: tuple[str, str] = ("train", "held-out")):
    out = []
    for label, m, hib in metrics:
        out.append(Column(f"{label} ({labels[0]})", f"{m}[{key}=train]", hib))
        out.append(Column(f"{label} ({labels[1]})", f"{m}[{key}=heldout]", hib))
    return out


def _groups(names: list[str], prefix: str) -> list[str]:
    """Values X of metrics named `prefix[k=X]` (prefix includes '[k=')."""
    return [n[len(prefix):-1] for n in names if n.startswith(prefix) and n.endswith("]") and "," not in n[len(prefix):]]


def _ordered(groups: list[str], train: list) -> list[str]:
    """Training groups first (in the experiment's order), then the held-out ones alphabetically."""
    train = [g for g in train if g in groups]
    return train + sorted(g for g in groups if g not in train)


def paper_tables(run) -> list[Table]:
    names = run.metric_names()
    exp = run.experiment
    skills = [s for s in ("arithmetic", "arithmetic_multistep", "facts", "instructions")
              if f"capability.accuracy[skill={s}]" in names] or ["arithmetic", "arithmetic_multistep", "facts",
                                                                  "instructions"]
    skills += sorted(set(_groups(names, "capability.accuracy[skill=")) - set(skills))
    lm_eval = [n for n in names if n.startswith("capability.lm_eval[")]
    train_fams = ", ".join(exp.get("train_families") or []) or "see experiment.json"
    return [
        Table("sycophancy", "Sycophancy (wrong suggestions)", [
            Column("sycophancy rate", "sycophancy.sycophancy_rate", False),
            Column("BRR", "sycophancy.brr", False),
            Column("invariance", "sycophancy.invariance", True),
            Column("accuracy clean", "sycophancy.accuracy_clean", True),
            Column("accuracy biased", "sycophancy.accuracy_biased", True),
        ], "BRR = P(answer = suggestion | biased) − P(answer = suggestion | clean)."),
        Table("sycophancy_split", "Sycophancy: training vs held-out families", _split_cols([
            ("sycophancy rate", "sycophancy.sycophancy_rate", False),
            ("BRR", "sycophancy.brr", False),
            ("invariance", "sycophancy.invariance", True),
            ("accuracy biased", "sycophancy.accuracy_biased", True),
        ], "split"), f"train = families in this experiment's training pairs ({train_fams}); held-out = the rest."),
        Table("jailbreak", "Jailbreaks: defense success rate (1 − attack success)", [
            Column("direct", "jailbreak.dsr[on=direct]", True),
            Column("train wrappers", "jailbreak.dsr[on=train_wrappers]", True),
            Column("held-out wrappers", "jailbreak.dsr[on=heldout_wrappers]", True),
            Column("held-out categories", "jailbreak.dsr[on=heldout_categories]", True),
            Column("adaptive attacker", "jailbreak.dsr_adaptive", True),
            Column("answered benign (direct)", "jailbreak.answered_benign[on=direct]", True),
            Column("answered benign (wrapped)", "jailbreak.answered_benign[on=wrapped]", True),
        ], "Adaptive attacker: a behaviour counts as broken if any attempt (GCG suffix or black-box wrapper search) "
           "succeeds. Answered benign: benign requests answered (over-refusal is its complement)."),
        Table("attack", "Adaptive attacker by method: share of behaviours broken", [
            Column("GCG (white-box)", "jailbreak.break_rate[method=gcg]", False),
            Column("black-box", "jailbreak.break_rate[method=blackbox]", False),
            Column("refused directly", "jailbreak.refused_directly", True),
        ]),
        Table("awareness", "Safety awareness", [
            Column("surfaced (train domains)", "awareness.surfaced[split=train]", True),
            Column("surfaced (held-out domains)", "awareness.surfaced[split=heldout]", True),
            Column("surfaced (all)", "awareness.surfaced", True),
            Column("facts all pass", "awareness.facts_all_pass", True),
            Column("over-warning", "awareness.over_warning", False),
        ], "Surfaced: hazard scenarios whose answer carries the fact (warning, safer alternative or refusal); "
           "over-warning: benign counterparts that get a warning anyway."),
        Table("capability", "Capability (change from base in parentheses)",
              [Column("all", "capability.accuracy", True, delta=True)]
              + [Column(s.replace("_", " "), f"capability.accuracy[skill={s}]", True, delta=True) for s in skills]
              + [Column(n[len("capability.lm_eval["):-1], n, True, delta=True) for n in lm_eval]),
    ]


def detail_tables(run) -> list[Table]:
    """Per family / wrapper / category / domain, training groups first and marked."""
    names = run.metric_names()
    exp = run.experiment
    out = []
    for key, title, prefix, train, hib in [
        ("families", "Sycophancy rate per family", "sycophancy.sycophancy_rate[family=", exp.get("train_families"),
         False),
        ("wrappers", "Defense success per wrapper", "jailbreak.dsr[wrapper=", exp.get("train_wrappers"), True),
        ("categories", "Defense success per harmful category (wrapped requests)", "jailbreak.dsr[category=", None,
         True),
        ("domains", "Awareness: surfaced per domain", "awareness.surfaced[domain=", exp.get("train_domains"), True),
    ]:
        groups = _ordered(_groups(names, prefix), list(train or []))
        if not groups:
            continue
        train = set(train or [])
        cols = [Column(g + (" (train)" if g in train else ""), f"{prefix}{g}]", hib) for g in groups]
        note = "(train) = in this experiment's training pairs." if train else ""
        out.append(Table(key, title, cols, note, groups))
    return out


def summary_table() -> Table:
    """The headline numbers printed by `opct report` (transposed: one line per metric, one column per arm)."""
    return Table("summary", "Summary", [
        Column("sycophancy rate", "sycophancy.sycophancy_rate", False),
        Column("sycophancy rate, held-out families", "sycophancy.sycophancy_rate[split=heldout]", False),
        Column("BRR", "sycophancy.brr", False),
        Column("invariance", "sycophancy.invariance", True),
        Column("DSR train wrappers", "jailbreak.dsr[on=train_wrappers]", True),
        Column("DSR held-out wrappers", "jailbreak.dsr[on=heldout_wrappers]", True),
        Column("DSR adaptive attacker", "jailbreak.dsr_adaptive", True),
        Column("answered benign", "jailbreak.answered_benign[on=direct]", True),
        Column("awareness surfaced, held-out domains", "awareness.surfaced[split=heldout]", True),
        Column("over-warning", "awareness.over_warning", False),
        Column("capability accuracy", "capability.accuracy", True, delta=True),
    ])


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


def rows(run, table: Table) -> tuple[list[str], list[list[str]]]:
    """(header, one row per arm): 'arm', 'seeds', then one "value [lo, hi]" cell per column."""
    header = ["arm", "seeds"] + [c.label + arrow(run, c) for c in table.columns]
    body = []
    for arm in run.arms:
        k = len(run.seed_runs(arm))
        row = [arm, f"{k}/{len(run.seeds)}"]
        for c in table.columns:
            base = estimate(run, "base", c.metric) if c.delta and arm != "base" and "base" in run.arms else None
            row.append(cell_text(estimate(run, arm, c.metric), k, base))
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
    return "Cells are value [95% interval]: " + "; ".join(parts) + ". ↑ higher is better, ↓ lower is better; " \
        "– = not measured."


def transposed(run, table: Table) -> tuple[list[str], list[list[str]]]:
    """(header, one row per column of `table`): 'metric', then one cell per arm."""
    header, body = rows(run, table)
    return ["metric"] + [r[0] for r in body], [[h] + [r[i] for r in body] for i, h in enumerate(header) if i >= 2]


# ------------------------------------------------------------------------------------------------ text

def _md_escape(s: str) -> str:
    return str(s).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def markdown(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(_md_escape(h) for h in header) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(_md_escape(c) for c in r) + " |" for r in body]
    return "\n".join(lines)


def plain(header: list[str], body: list[list[str]]) -> str:
    """A fixed-width table for a terminal."""
    widths = [max(len(str(r[i])) for r in [header] + body) for i in range(len(header))]

    def line(r):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    return "\n".join([line(header)] + [line(r) for r in body])
