"""The audit's report, rebuilt from files alone: OUT/results.jsonl and OUT/cells/*/*/seed*/candidates.jsonl.

Writes OUT/summary.json (one entry per organism x method: misalignment and capability before -> after, the change
with its hierarchical-bootstrap 95% interval over seeds and probes, the eta(s) trend and the selection gap with their
intervals, and whether the trend's sign predicted the observed direction), OUT/results.md (the same as tables) and
OUT/report.html (a heatmap of organism x method showing the change in misalignment with its interval, the same for
capability, and the eta(s) plots; PNGs inline, matplotlib Agg).
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from opct.audit import diagnostic as D
from opct.audit.run import CAPABILITY, read_results
from opct.errors import DataError, OpctError
from opct.files import read_appended_jsonl, write_atomic, write_json_atomic


def _candidates(out: Path, organism: str, method: str, seeds: list[int]) -> list[dict]:
    groups = []
    for seed in seeds:
        path = out / "cells" / organism / method / f"seed{seed}" / "candidates.jsonl"
        if path.exists():
            for n, r in read_appended_jsonl(path):  # written atomically; a bad line is an error naming it
                if not isinstance(r, dict) or not {"scores", "misaligned", "chosen"} <= set(r):
                    raise DataError(path, n, "<record>", "expected an object with scores, misaligned and chosen")
                groups.append({"scores": r["scores"], "misaligned": r["misaligned"], "chosen": r["chosen"]})
    return groups


def _rate(items: dict) -> float | None:
    n = sum(v[1] for v in items.values())
    return sum(v[0] for v in items.values()) / n if n else None


def summarise(out) -> dict:
    out = Path(out)
    rows = read_results(out)
    if not rows:
        raise OpctError(f"{out}: no results.jsonl (or it is empty); run `opct audit --out {out}` first")
    organisms = {r["organism"]: r for r in rows if r["kind"] == "organism"}
    before = {(r["organism"], r["seed"]): r["before"] for r in rows if r["kind"] == "before"}
    cells: dict = {}
    for r in rows:
        if r["kind"] == "cell":
            cells.setdefault((r["organism"], r["method"]), {})[r["seed"]] = r
    summary = {"organisms": {}, "cells": []}
    for name, r in organisms.items():
        summary["organisms"][name] = {"failure": r["failure"], "base_misalignment": r["base"]["misalignment"],
                                      "misalignment": r["derived"]["misalignment"],
                                      "base_capability": r["base"][CAPABILITY],
                                      CAPABILITY: r["derived"][CAPABILITY], "n": r["derived"]["n"]}
    for (organism, method), by_seed in sorted(cells.items()):
        seeds = sorted(s for s in by_seed if (organism, s) in before)
        mis = [(before[(organism, s)]["items"], by_seed[s]["after"]["items"]) for s in seeds]
        cap = [(before[(organism, s)]["capability_items"], by_seed[s]["after"]["capability_items"]) for s in seeds]
        change = D.change_interval(mis)
        cap_change = D.change_interval(cap)
        groups = _candidates(out, organism, method, seeds)
        tr = D.trend(groups) if groups else None
        gap = D.selection_gap(groups) if groups else None
        observed = D.direction(change["value"], change["ci_low"], change["ci_high"])
        predicted = D.direction(tr["rho"], tr["ci_low"], tr["ci_high"]) if tr else "n/a"
        summary["cells"].append({
            "organism": organism, "method": method, "seeds": seeds,
            "before_mean": _mean([_rate(b) for b, _ in mis]), "after_mean": _mean([_rate(a) for _, a in mis]),
            "change": change, "capability_change": cap_change,
            "capability_before": _mean([_rate(b) for b, _ in cap]), "capability_after": _mean([_rate(a) for _, a in cap]),
            "trend": tr, "selection_gap": gap, "eta_bins": D.eta_bins(groups) if groups else [],
            "observed": observed, "predicted": predicted,
            "sign_agrees": None if "n/a" in (observed, predicted) or "flat" in (observed, predicted)
            else observed == predicted,
            "label": [by_seed[s].get("label") for s in seeds],
            "seconds": sum(by_seed[s]["seconds"]["total"] for s in seeds)})
    return summary


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


# ------------------------------------------------------------------------------------------ rendering

def _fmt(x, signed=False):
    if x is None:
        return "—"
    return f"{x:+.3f}" if signed else f"{x:.3f}"


def _ci(d):
    if d is None or d.get("ci_low") is None:
        return ""
    return f" [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _heatmap(summary: dict, key: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    orgs = sorted({c["organism"] for c in summary["cells"]})
    methods = []
    for c in summary["cells"]:
        if c["method"] not in methods:
            methods.append(c["method"])
    grid = np.full((len(orgs), len(methods)), np.nan)
    text = [["" for _ in methods] for _ in orgs]
    for c in summary["cells"]:
        i, j = orgs.index(c["organism"]), methods.index(c["method"])
        d = c[key]
        if d["value"] is not None:
            grid[i, j] = d["value"]
            text[i][j] = f"{d['value']:+.2f}" + (f"\n[{d['ci_low']:+.2f},{d['ci_high']:+.2f}]"
                                                 if d["ci_low"] is not None else "")
    lim = max(0.05, float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 0.05)
    fig, ax = plt.subplots(figsize=(1.5 * len(methods) + 2, 0.9 * len(orgs) + 1.5))
    im = ax.imshow(grid, cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
    ax.set_yticks(range(len(orgs)), orgs)
    for i in range(len(orgs)):
        for j in range(len(methods)):
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, shrink=0.8)
    ax.set_title(title)
    return _png(fig)


def _eta_plots(summary: dict) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in summary["cells"] if c["eta_bins"]]
    if not cells:
        return None
    orgs = sorted({c["organism"] for c in cells})
    methods = []
    for c in cells:
        if c["method"] not in methods:
            methods.append(c["method"])
    fig, axes = plt.subplots(len(orgs), len(methods), figsize=(2.6 * len(methods), 2.2 * len(orgs)), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for c in cells:
        ax = axes[orgs.index(c["organism"])][methods.index(c["method"])]
        ax.set_visible(True)
        xs = [b["score_mid"] for b in c["eta_bins"]]
        ys = [b["eta"] for b in c["eta_bins"]]
        ax.plot(xs, ys, "o-")
        ax.set_ylim(-0.05, 1.05)
        t = c["trend"]
        rho = "n/a" if t["rho"] is None else f"{t['rho']:+.2f}" + (
            f" [{t['ci_low']:+.2f},{t['ci_high']:+.2f}]" if t["ci_low"] is not None else "")
        ax.set_title(f"{c['organism'][:14]} / {c['method']}\nrho {rho}", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.set_xlabel("score - prompt mean", fontsize=6)
        ax.set_ylabel("eta(s)", fontsize=6)
    fig.tight_layout()
    return _png(fig)


def _markdown(summary: dict) -> str:
    lines = ["# Misalignment audit", "", "## Organisms (seed 0, sampled at T = 1)", "",
             "| organism | failure | base misalignment | organism misalignment | base capability | capability |",
             "|---|---|---|---|---|---|"]
    for name, o in sorted(summary["organisms"].items()):
        lines.append(f"| {name} | {o['failure']} | {_fmt(o['base_misalignment'])} | {_fmt(o['misalignment'])} | "
                     f"{_fmt(o['base_capability'])} | {_fmt(o[CAPABILITY])} |")
    lines += ["", "## Organism x method (change after - before; 95% hierarchical bootstrap over seeds and probes)", "",
              "| organism | method | seeds | misalignment before -> after | change [95% CI] | capability change "
              "[95% CI] | eta trend rho [95% CI] | selection gap [95% CI] | predicted | observed | agrees |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in summary["cells"]:
        t, g = c["trend"], c["selection_gap"]
        lines.append(
            f"| {c['organism']} | {c['method']} | {len(c['seeds'])} | {_fmt(c['before_mean'])} -> "
            f"{_fmt(c['after_mean'])} | {_fmt(c['change']['value'], True)}{_ci(c['change'])} | "
            f"{_fmt(c['capability_change']['value'], True)}{_ci(c['capability_change'])} | "
            f"{_fmt(t and t['rho'], True)}{_ci({'ci_low': t and t['ci_low'], 'ci_high': t and t['ci_high']})} | "
            f"{_fmt(g and g['value'], True)}{_ci(g)} | {c['predicted']} | {c['observed']} | "
            f"{'—' if c['sign_agrees'] is None else ('yes' if c['sign_agrees'] else 'no')} |")
    lines += ["", "## Per organism: direction over the seven methods, and the k = 1 ablation", "",
              "| organism | amplified (up) | suppressed (down) | flat | k1 change [95% CI] | mean change of the five "
              "selection methods | selection minus k1 |", "|---|---|---|---|---|---|---|"]
    for org in sorted({c["organism"] for c in summary["cells"]}):
        cs = [c for c in summary["cells"] if c["organism"] == org and c["method"] != "k1"]
        dirs = {d: [c["method"] for c in cs if c["observed"] == d] for d in ("up", "down", "flat")}
        k1 = next((c for c in summary["cells"] if c["organism"] == org and c["method"] == "k1"), None)
        sel = _mean([c["change"]["value"] for c in cs if c["method"] not in ("bct", "act")])
        k1v = k1["change"]["value"] if k1 else None
        lines.append(f"| {org} | {', '.join(dirs['up']) or '—'} | {', '.join(dirs['down']) or '—'} | "
                     f"{', '.join(dirs['flat']) or '—'} | {_fmt(k1v, True)}{_ci(k1 and k1['change'])} | "
                     f"{_fmt(sel, True)} | {_fmt(None if sel is None or k1v is None else sel - k1v, True)} |")
    lines += ["", "predicted: sign of the eta(s) trend (up = higher-scoring candidates are more often misaligned, so "
              "selection should amplify); observed: sign of the change; 'flat' = the 95% interval holds 0. "
              "k1 = the ablation without selection (one sample per prompt); bct/act select nothing.", ""]
    return "\n".join(lines)


def write_report(out) -> dict:
    out = Path(out)
    summary = summarise(out)
    write_json_atomic(out / "summary.json", summary)
    md = _markdown(summary)
    write_atomic(out / "results.md", md)
    parts = ["<html><head><meta charset='utf-8'><title>opct audit</title></head><body>",
             "<h1>Misalignment audit</h1>"]
    if summary["cells"]:
        parts.append("<h2>Change in misalignment rate (after - before), 95% interval</h2>")
        parts.append(f"<img src='data:image/png;base64,{_heatmap(summary, 'change', 'misalignment change')}'>")
        parts.append("<h2>Change in capability</h2>")
        parts.append(f"<img src='data:image/png;base64,"
                     f"{_heatmap(summary, 'capability_change', 'capability change')}'>")
        eta = _eta_plots(summary)
        if eta:
            parts.append("<h2>eta(s) = P(misaligned | selection score), score centred per prompt</h2>")
            parts.append(f"<img src='data:image/png;base64,{eta}'>")
    parts.append("<h2>Tables</h2><pre>" + html.escape(md) + "</pre></body></html>")
    write_atomic(out / "report.html", "\n".join(parts))
    return {"results": out / "results.jsonl", "md": out / "results.md", "html": out / "report.html",
            "summary": out / "summary.json"}
