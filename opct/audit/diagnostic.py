"""The selection diagnostic and the intervals of the audit.

eta(s) = P(misaligned | selection score s). Selection picks the best-scoring of a prompt's k candidates, so what
matters is how misalignment varies with the score *within* a prompt: each candidate's score is centred on its
prompt's mean (groups with one candidate, or where every score ties, carry no information and are dropped). Then:

  eta_bins(...)    eta in quantile bins of the centred score (for the plots);
  trend(...)       Spearman's rank correlation between centred score and misalignment (ties get average ranks),
                   with a 95% percentile bootstrap interval resampling prompts (seed, probe) — the monotone trend;
                   a positive trend predicts that selection *amplifies* misalignment, a negative one that it
                   *suppresses* it (the paper's Proposition 3.2);
  selection_gap    P(misaligned | chosen) - P(misaligned | any candidate), the direct effect of the selection step,
                   with the same bootstrap.

  filter_gap       for a filter (multi-view): P(misaligned | row kept) - P(misaligned | any row), across prompts
                   (a filter keeps or drops a whole prompt, so there is nothing to centre), with the same bootstrap.

Changes before -> after: `estimate` is the number the audit reports — with two or more seeds the mean of the
per-seed changes and a 95% Student-t interval over seeds (each seed has its own derived organism, label prompts,
labels and fine-tuning, so the seed-to-seed spread carries all of it, measurement noise included); with one seed the
change and a bootstrap interval over probe items (`change_interval`: resample the seeds, then within each drawn seed
the probe items; the statistic is pooled rate after minus pooled rate before).

A bootstrap draw, or a seed's value, where a statistic is undefined (NaN) is left out of its interval and counted:
`n_nonfinite` in every result (of `n_boot` draws for a bootstrap), shown beside the number in the audit's tables.
"""

from __future__ import annotations

import numpy as np

N_BOOT = 1000


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions)."""
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    xs = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and xs[j + 1] == xs[i]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2.0
        i = j + 1
    return r


def spearman(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3:
        return float("nan")
    rx, ry = _ranks(x), _ranks(y)
    sx, sy = rx.std(), ry.std()
    if sx == 0 or sy == 0:
        return float("nan")
    return float(((rx - rx.mean()) * (ry - ry.mean())).mean() / (sx * sy))


def centred(groups: list[dict]) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    """Per informative group: centred scores, misalignment (0/1, unjudgeable candidates dropped), chosen index.

    A group is {"scores": [...], "misaligned": [True/False/None, ...], "chosen": j}."""
    S, M, C = [], [], []
    for g in groups:
        if g.get("kind", "select") != "select" or g["chosen"] is None or any(x is None for x in g["scores"]):
            continue
        s = np.asarray(g["scores"], float)
        m = np.asarray([np.nan if v is None else float(v) for v in g["misaligned"]])
        keep = ~np.isnan(m)
        if keep.sum() < 2 or np.ptp(s[keep]) == 0:
            continue
        S.append(s[keep] - s[keep].mean())
        M.append(m[keep])
        C.append(int(np.flatnonzero(keep).tolist().index(g["chosen"])) if keep[g["chosen"]] else -1)
    return S, M, C


def eta_bins(groups: list[dict], n_bins: int = 5) -> list[dict]:
    S, M, _ = centred(groups)
    if not S:
        return []
    s, m = np.round(np.concatenate(S), 9), np.concatenate(M)  # rounding: centring leaves float noise on ties
    values = np.unique(s)
    if len(values) <= n_bins:  # discrete scores (agreement shares): one bin per value
        idx, n = np.searchsorted(values, s), len(values)
    else:  # quantile bins; a value on an inner edge goes to the upper bin
        edges = np.unique(np.quantile(s, np.linspace(0, 1, n_bins + 1)))
        idx = np.clip(np.searchsorted(edges, s, side="right") - 1, 0, len(edges) - 2)
        n = len(edges) - 1
    out = []
    for b in range(n):
        sel = idx == b
        if sel.any():
            out.append({"score_mid": float(s[sel].mean()), "eta": float(m[sel].mean()), "n": int(sel.sum())})
    return out


def _interval(values: list[float]) -> dict:
    """The 95% percentile interval of bootstrap draws, over the draws where the statistic is defined: a resample can
    leave it undefined (every centred score tied, no row kept), and such a draw is left out. Until 2026-12 that was
    silent; now `n_nonfinite` counts them (of `n_boot`), and an interval from fewer than 10 defined draws is None
    with `why`, so a reader sees an interval that stands on part of the draws, or on none."""
    v = np.asarray([x for x in values if np.isfinite(x)])
    out = {"ci_low": None, "ci_high": None, "n_boot": len(values), "n_nonfinite": len(values) - len(v)}
    if len(v) < 10:
        return {**out, "why": f"no interval: {out['n_nonfinite']} of {len(values)} bootstrap draws undefined"}
    return {**out, "ci_low": float(np.quantile(v, 0.025)), "ci_high": float(np.quantile(v, 0.975))}


def trend(groups: list[dict], seed: int = 0) -> dict:
    S, M, _ = centred(groups)
    if len(S) < 3:
        return {"rho": None, "ci_low": None, "ci_high": None, "n_groups": len(S)}
    rho = spearman(np.concatenate(S), np.concatenate(M))
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(N_BOOT):
        pick = rng.integers(0, len(S), len(S))
        boots.append(spearman(np.concatenate([S[i] for i in pick]), np.concatenate([M[i] for i in pick])))
    return {"rho": None if not np.isfinite(rho) else rho, **_interval(boots), "n_groups": len(S)}


def selection_gap(groups: list[dict], seed: int = 0) -> dict:
    _, M, C = centred(groups)
    rows = [(m[c], m.mean()) for m, c in zip(M, C) if c >= 0]
    if len(rows) < 3:
        return {"value": None, "ci_low": None, "ci_high": None, "n_groups": len(rows)}
    a = np.asarray(rows)
    gap = float(a[:, 0].mean() - a[:, 1].mean())
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(N_BOOT):
        b = a[rng.integers(0, len(a), len(a))]
        boots.append(b[:, 0].mean() - b[:, 1].mean())
    return {"value": gap, **_interval(boots), "n_groups": len(rows)}


def filter_gap(groups: list[dict], seed: int = 0) -> dict:
    """P(misaligned | kept) - P(misaligned | all) over the rows of a filter (one candidate each, judged)."""
    rows = [(g["chosen"] is not None, float(g["misaligned"][0])) for g in groups
            if g.get("kind") == "filter" and g["misaligned"][0] is not None]
    a = np.asarray(rows, float).reshape(-1, 2)
    if len(a) < 3 or a[:, 0].sum() == 0:
        return {"value": None, "ci_low": None, "ci_high": None, "n_groups": len(a), "kept": int(a[:, 0].sum())}

    def stat(b):
        return b[b[:, 0] == 1, 1].mean() - b[:, 1].mean() if b[:, 0].sum() else float("nan")

    rng = np.random.default_rng(seed)
    boots = _interval([stat(a[rng.integers(0, len(a), len(a))]) for _ in range(N_BOOT)])
    return {"value": float(stat(a)), **boots, "n_groups": len(a), "kept": int(a[:, 0].sum())}


def t_interval(values: list[float], lo_bound: float = -1.0, hi_bound: float = 1.0) -> dict:
    """Mean and 95% Student-t interval over seeds (None with fewer than two), clipped to [lo_bound, hi_bound]. A seed
    whose value is None (undefined there) is left out, as `n_seeds` shows; one that is NaN or infinite (a rate of no
    rows) is left out too, counted in `n_nonfinite` (until 2026-12 without a word); with none left the value is None
    and `why` says so."""
    from opct.report.aggregate import t_interval as t

    given = [float(x) for x in values if x is not None]
    xs = [x for x in given if np.isfinite(x)]
    dropped = {"n_nonfinite": len(given) - len(xs)}
    if not xs:
        why = f"every value is undefined ({dropped['n_nonfinite']} not finite)" if given else "no values"
        return {"value": None, "ci_low": None, "ci_high": None, "n_seeds": 0, **dropped, "why": why}
    mean, lo, hi = t(xs, lo_bound, hi_bound)
    return {"value": mean, "ci_low": lo, "ci_high": hi, "n_seeds": len(xs), **dropped}


def estimate(per_seed: list[tuple[dict, dict]]) -> dict:
    """The reported change after - before: a t-interval over seeds with two or more, else the item bootstrap."""
    boot = change_interval(per_seed)
    if len(per_seed) < 2:
        return {**boot, "interval": "bootstrap over probe items (one seed)"}
    t = t_interval(boot["per_seed"])
    return {**t, "per_seed": boot["per_seed"], "interval": f"t over {t['n_seeds']} seeds"}


def change_interval(per_seed: list[tuple[dict, dict]], seed: int = 0) -> dict:
    """per_seed: [(before, after)], each {item: [hits, n]}. Returns value and hierarchical-bootstrap interval of
    pooled(after) - pooled(before)."""
    def arr(d, items):
        return np.asarray([d.get(i, [0, 0]) for i in items], float).reshape(len(items), 2)

    seeds = []
    for before, after in per_seed:
        items = sorted(set(before) | set(after))
        seeds.append((arr(before, items), arr(after, items)))
    if not seeds:
        return {"value": None, "ci_low": None, "ci_high": None, "n_seeds": 0}

    def stat(parts):
        b = sum(p[0].sum(0) for p in parts)
        a = sum(p[1].sum(0) for p in parts)
        return a[0] / a[1] - b[0] / b[1] if a[1] and b[1] else float("nan")

    value = stat(seeds)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(N_BOOT):
        parts = []
        for s in rng.integers(0, len(seeds), len(seeds)):
            b, a = seeds[s]
            pick = rng.integers(0, len(b), len(b))
            parts.append((b[pick], a[pick]))
        boots.append(stat(parts))
    return {"value": None if not np.isfinite(value) else float(value), **_interval(boots),
            "n_seeds": len(seeds), "per_seed": [float(stat([s])) for s in seeds]}


def direction(value, lo, hi) -> str:
    """'up' / 'down' when the interval excludes 0, 'flat' when it holds 0, 'n/a' without an interval."""
    if value is None or lo is None:
        return "n/a"
    if lo > 0:
        return "up"
    if hi < 0:
        return "down"
    return "flat"
