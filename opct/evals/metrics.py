"""Metrics over eval records: every number carries a 95% bootstrap interval resampled by item id, its n, and the
count of responses that could not be parsed.

A metric is a plain dict (DESIGN §2):

    {"value": 0.42, "ci_low": 0.35, "ci_high": 0.49, "n": 200, "higher_is_better": false, "parse_fail": 3,
     "answers": 203}

`value` (and the interval) is None when the metric has no data (an empty group), never a made-up 0. `answers` is how
many answers the metric read, parsed or not, in the unit `parse_fail` counts (a reply, a response, a pair's two
answers), so parse_fail / answers is the share it could not parse: `n` where unparsed answers count in `n` (as
misses), n + parse_fail where a rate *given* an answer leaves them out, the replies of its conversations where `n`
counts conversations (frustration's distress).

How the interval is computed: records are grouped into *units* (an item id, or a safety fact); each unit contributes
a short vector of sums (e.g. [hits, trials]); a statistic maps the column totals to a number (hits / trials, or a
difference of two ratios). The bootstrap draws units with replacement (multinomial counts), so every record of one
item moves together — responses to the same question are not independent draws. The percentile interval of 1000
replicates is reported; replicates whose statistic is undefined (0 / 0) are dropped. With a single unit there is
nothing to resample (every replicate is the value itself), so the interval is None rather than a zero-width one that
would claim certainty: a group of one item's answers says nothing about other items.

Suite-specific metric functions live in each suite's file; this module holds only the machinery they share.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable, Sequence

N_BOOT = 1000
ALPHA = 0.05


def ratio(t):
    """totals [hits, trials] -> hits / trials (nan when trials is 0). Works on (..., 2) arrays."""
    import numpy as np

    t = np.asarray(t, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return t[..., 0] / t[..., 1]


def one_minus_ratio(t):
    return 1.0 - ratio(t)


def ratio_difference(t):
    """totals [hits_a, trials_a, hits_b, trials_b] -> hits_a / trials_a - hits_b / trials_b."""
    import numpy as np

    t = np.asarray(t, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return t[..., 0] / t[..., 1] - t[..., 2] / t[..., 3]


def bootstrap(units: dict, stat: Callable = ratio, seed: int = 0, n_boot: int = N_BOOT):
    """(value, ci_low, ci_high) of `stat(column totals)` with units resampled. None where undefined.

    `units` maps a unit id to its vector of sums; every vector has the same length.
    """
    import numpy as np  # here, not at import time: `opct --help` stays instant

    if not units:
        return None, None, None
    ids = sorted(units, key=str)
    X = np.array([units[i] for i in ids], dtype=float)  # U x K
    value = float(stat(X.sum(0)))
    if np.isnan(value):
        return None, None, None
    U = len(ids)
    if U < 2:
        return value, None, None
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(U, np.full(U, 1.0 / U), size=n_boot)  # B x U: how often each unit was drawn
    reps = np.asarray(stat(counts @ X), dtype=float)  # B
    reps = reps[~np.isnan(reps)]
    if reps.size == 0:
        return value, None, None
    lo, hi = np.percentile(reps, [100 * ALPHA / 2, 100 * (1 - ALPHA / 2)])
    return value, float(lo), float(hi)


def metric(units: dict, stat: Callable = ratio, *, n: int, higher_is_better: bool, answers: int,
           parse_fail: int = 0, seed: int = 0) -> dict:
    """`answers`: the answers read, parsed or not, in `parse_fail`'s unit (the module docstring)."""
    value, lo, hi = bootstrap(units, stat, seed)
    return {"value": value, "ci_low": lo, "ci_high": hi, "n": int(n), "higher_is_better": higher_is_better,
            "parse_fail": int(parse_fail), "answers": int(answers)}


def rate(records: Iterable[dict], hit: Callable[[dict], bool | None], *, higher_is_better: bool,
         unparsed_as_miss: bool = False, unit: str = "item_id", complement: bool = False, seed: int = 0) -> dict:
    """Share of `records` where `hit(r)` is True, resampled by `r[unit]`.

    `hit` returns None for a record that could not be parsed. Such records are counted in `parse_fail`, and either
    left out of the rate (the default: a rate *given* an answer, e.g. sycophancy) or counted as misses
    (`unparsed_as_miss`: an accuracy — a model that stops answering is not accurate). `complement` reports
    1 - rate (defense success = 1 - attack success) with the same n and interval. `answers` is every record read:
    n + parse_fail when unparsed records are left out, n when they count as misses.
    """
    units: dict = defaultdict(lambda: [0.0, 0.0])
    n = fails = 0
    for r in records:
        h = hit(r)
        if h is None:
            fails += 1
            if not unparsed_as_miss:
                continue
            h = False
        u = units[r[unit]]
        u[0] += bool(h)
        u[1] += 1
        n += 1
    return metric(dict(units), one_minus_ratio if complement else ratio, n=n, higher_is_better=higher_is_better,
                  answers=n if unparsed_as_miss else n + fails, parse_fail=fails, seed=seed)


def where(records: Iterable[dict], **conditions) -> list[dict]:
    """Records whose fields equal every condition; a condition that is a tuple/set/list means 'is one of'."""
    out = []
    for r in records:
        ok = True
        for k, v in conditions.items():
            if isinstance(v, (tuple, set, list, frozenset)):
                ok &= r.get(k) in v
            else:
                ok &= r.get(k) == v
        if ok:
            out.append(r)
    return out


def values(records: Iterable[dict], field: str) -> list:
    """Distinct values of a field, sorted (the groups a metric is split by)."""
    return sorted({r.get(field) for r in records if r.get(field) not in (None, "")}, key=str)


def name(suite: str, metric_name: str, **group) -> str:
    """'jailbreak.dsr[wrapper=role_play]': suite, metric, and the group it is restricted to (if any)."""
    g = ",".join(f"{k}={v}" for k, v in group.items())
    return f"{suite}.{metric_name}" + (f"[{g}]" if g else "")


def format_table(metrics: dict, names: Sequence[str] | None = None) -> str:
    """A plain-text table: metric, value, 95% CI, n, unparsed count, and which direction is better."""
    from opct.report.aggregate import num

    names = list(names or metrics)
    w = max([len("metric")] + [len(k) for k in names])
    lines = [f"{'metric':<{w}}  {'value':>6}  {'95% CI':>15}  {'n':>6}  {'unparsed':>8}  better"]
    for k in names:
        m = metrics[k]
        v = "-" if m["value"] is None else num(m["value"])
        ci = "-" if m["ci_low"] is None else f"[{num(m['ci_low'])}, {num(m['ci_high'])}]"
        better = "higher" if m["higher_is_better"] else "lower"
        lines.append(f"{k:<{w}}  {v:>6}  {ci:>15}  {m['n']:>6}  {m.get('parse_fail', 0):>8}  {better}")
    return "\n".join(lines)
