"""The cross-threat matrix from a run's files alone: per seed the deltas against the control, then over seeds.

    rows      every (trained threat, method) of the run, in run order; a cell the threat gives no signal to by
              construction is a row with `skipped` set and no values
    columns   every axis's summary metrics (`Axis.summary`, registry order: capability's accuracy among them) that
              some evaluation of the run computed (the attacker's are off), each with its direction
    cells     per row and column: per seed delta = metric(method) - metric(control) (same seed), their mean with
              the 95% t-interval over seeds (`t_interval`; none from one seed), n seeds, and the raw means of the
              method, the control and the base model over the same seeds with how many seeds each mean holds
              (method_n, control_n, base_n); intervals clipped by
              `opct.report.aggregate.difference_range`, as every report's paired differences are
    control   the control against the base model, the same way (what benign SFT alone moves)
"""

from __future__ import annotations

import math
from pathlib import Path

from opct.files import dir_there, write_json_atomic
from opct.shapes import INT, NAME, NUM, OBJECT, STR, read_checked, read_done

MATRIX = "cross_threat.json"
# What the matrix and its report read of threats.json and of a cell's done.json (opct/shapes.py); a threat or method
# names a folder of the run
# (`opct run` writes every one of them; a report of `{}` read "model: None (None)", "None steps x None rows", rc 0)
SETTINGS_SHAPE = {"seeds": [INT], "threats": [NAME], "methods": [NAME], "name?": STR, "model?": (None, STR),
                  "model_dir?": (None, STR), "no_signal?": {"*": [STR]}, "note?": (None, STR),
                  "train?": (None, {"max_steps?": (None, INT), "batch_size?": (None, INT), "lr?": (None, NUM)}),
                  "eval?": (None, OBJECT)}


def done_metrics(path: Path, kind: str, folder: str = "", **cell) -> dict | None:
    """The metrics the done.json of a cell of `kind` holds (`opct.shapes.read_done`: an error naming the file and
    field when malformed, or of another cell), or None when they were removed or emptied since: the cell is then no
    cell measured, and its runner runs it again."""
    return read_done(path, kind, folder, **cell).get("metrics") or None


def value_of(metrics: dict | None, name: str) -> float | None:
    m = (metrics or {}).get(name)
    v = m.get("value") if isinstance(m, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def columns(evaluated: list[dict]) -> list[dict]:
    """Every registered axis's summary metrics that some evaluation computed, in registry order."""
    from opct.axes import AXES

    seen = set().union(*[set(m) for m in evaluated]) if evaluated else set()
    out = []
    for axis, a in AXES.items():
        for c in a.summary:
            if c.metric in seen and all(c.metric != o["metric"] for o in out):
                out.append({"metric": c.metric, "axis": axis, "label": c.label,
                            "higher_is_better": bool(c.higher_is_better)})
    return out


def load_cells(root: Path) -> tuple[dict, dict]:
    """(threats.json, {(seed, threat, method): done.json}) of every finished cell."""
    from opct.threats.runner import BASE, CONTROL, SETTINGS, cell_dir

    settings = read_checked(root / SETTINGS, "threats run", SETTINGS_SHAPE)
    done = {}
    for seed in settings.get("seeds", []):
        keys = [("", BASE), ("", CONTROL)] + [(t, m) for t in settings.get("threats", [])
                                              for m in settings.get("methods", [])]
        for threat, method in keys:
            d = cell_dir(root, seed, threat, method)
            if dir_there(d, root) and (d / "done.json").exists():  # a file where a cell's folder belongs: an error
                done[(seed, threat, method)] = read_done(d / "done.json", "threats", d.relative_to(root).as_posix(),
                                                         seed=seed, threat=threat, method=method)
    return settings, done


def _stats(metric: str, pairs: list[tuple[float | None, float | None]], base: list[float]) -> dict:
    from opct.report.aggregate import difference_range, t_interval

    deltas = [a - b for a, b in pairs if a is not None and b is not None]
    value = lo = hi = None
    if deltas:
        bounds = difference_range(metric, [x for p in pairs for x in p if x is not None]) or (None, None)
        value, lo, hi = t_interval(deltas, *bounds)

    def mean(xs):
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else None

    def count(xs):
        return sum(x is not None for x in xs)

    return {"value": value, "lo": lo, "hi": hi, "n": len(deltas), "method_mean": mean([a for a, _ in pairs]),
            "control_mean": mean([b for _, b in pairs]), "base_mean": mean(base),
            "method_n": count([a for a, _ in pairs]), "control_n": count([b for _, b in pairs]),
            "base_n": count(base)}


def build_matrix(root: Path) -> dict:
    """The matrix; each cell also counts the unparsed answers behind its means ([unparsed, answers] summed over its
    seeds, `opct.report.unparsed`): a method whose answers were all unreadable read as a change, unmarked, until
    2026-12-07."""
    from opct.report.unparsed import counts_of
    from opct.threats.runner import BASE, CONTROL, NO_SIGNAL

    settings, done = load_cells(root)
    # a done.json whose metrics were removed or emptied since is no cell measured (it read as n/a, listed nowhere)
    damaged = {k for k, v in done.items() if not v.get("metrics")}
    done = {k: v for k, v in done.items() if k not in damaged}
    seeds = settings.get("seeds", [])
    metrics = {k: v.get("metrics") or {} for k, v in done.items()}
    cols = columns(list(metrics.values()))
    base = {s: metrics.get((s, "", BASE)) for s in seeds}
    control = {s: metrics.get((s, "", CONTROL)) for s in seeds}
    rows, cells, per_seed = [], [], {s: [] for s in seeds}
    for threat in settings.get("threats", []):
        for method in settings.get("methods", []):
            skipped = NO_SIGNAL if method in settings.get("no_signal", {}).get(threat, []) else None
            have = [s for s in seeds if (s, threat, method) in metrics]
            rows.append({"threat": threat, "method": method, "skipped": skipped, "seeds": have})
            for c in cols:
                name = c["metric"]
                cell = {"threat": threat, "method": method, "metric": name, "higher_is_better": c["higher_is_better"]}
                if skipped:
                    cells.append({**cell, "value": None, "lo": None, "hi": None, "n": 0, "method_mean": None,
                                  "control_mean": None, "base_mean": None, "skipped": skipped})
                    continue
                pairs = []
                for s in have:
                    m, ctl, b = (value_of(x, name) for x in (metrics[(s, threat, method)], control[s], base[s]))
                    pairs.append((m, ctl))
                    per_seed[s].append({"threat": threat, "method": method, "metric": name, "value": m,
                                        "control": ctl, "base": b,
                                        "delta": None if m is None or ctl is None else m - ctl})
                cells.append({**cell, **_stats(name, pairs, [value_of(base[s], name) for s in have]),
                              "method_unparsed": counts_of([metrics[(s, threat, method)] for s in have], name),
                              "control_unparsed": counts_of([control[s] for s in have], name)})
    vs_base = []
    for c in cols:
        have = [s for s in seeds if control[s] is not None and base[s] is not None]
        name = c["metric"]
        st = _stats(name, [(value_of(control[s], name), value_of(base[s], name)) for s in have], [])
        vs_base.append({"metric": c["metric"], "higher_is_better": c["higher_is_better"], "value": st["value"],
                        "lo": st["lo"], "hi": st["hi"], "n": st["n"], "control_mean": st["method_mean"],
                        "base_mean": st["control_mean"], "control_n": st["method_n"], "base_n": st["control_n"],
                        "control_unparsed": counts_of([control[s] for s in have], name),
                        "base_unparsed": counts_of([base[s] for s in have], name)})
    seconds = {f"seed{s}/{t + '/' if t else ''}{m}": v.get("seconds") for (s, t, m), v in done.items()}
    # what a killed or running run lacks (no-signal cells are never trained, so never missing)
    planned = [("", BASE), ("", CONTROL)] + [(r["threat"], r["method"]) for r in rows if not r["skipped"]]
    missing = [f"seed {s}: {t + ' / ' if t else ''}{m}: " + ("done.json holds no metrics (`opct run` runs it again)"
                                                           if (s, t, m) in damaged else "not finished (no done.json)")
               for s in seeds for t, m in planned if (s, t, m) not in done]
    return {"rows": rows, "columns": cols, "cells": cells, "control_vs_base": vs_base, "per_seed": per_seed,
            "missing": missing,
            "settings": {k: v for k, v in settings.items() if k not in ("train", "eval")} | {
                "train": settings.get("train"), "eval": settings.get("eval")}, "seconds": seconds}


def write_matrix(root, out=None) -> dict:
    """cross_threat.json (without the per-seed rows) and each seed's rows.json; returns the matrix. With `out` (`opct
    report --out`) the run is only read: cross_threat.json goes into `out`, and no rows.json is written."""
    root = Path(root)
    m = build_matrix(root)
    for s, rows in m.pop("per_seed").items():
        if out is None and (root / f"seed{s}").is_dir():
            write_json_atomic(root / f"seed{s}" / "rows.json", {"seed": s, "rows": rows}, indent=1)
    write_json_atomic(Path(out or root) / MATRIX, m, indent=1)
    return m
