"""The report's figures as PNG bytes (matplotlib's Agg canvas, no pyplot state, no display needed):

- `metric_grid`: one panel per metric of a table: each arm's value with its 95% interval as an error bar;
- `grouped`: one metric per group (family, wrapper, domain), bars grouped by arm, training groups shaded;
- `curves`: training curves (loss and a few logged keys vs step), one line per arm and seed.
"""

from __future__ import annotations

import io
import math

from opct.report.aggregate import estimate

# keys plotted beside the loss, in order of preference; a panel shows only the arms that log the key
CURVE_KEYS = ("grad_norm", "mean_delta", "response_len", "student_entropy")


def _figure(w: float, h: float, **margins):
    """A figure with fixed margins in inches (matplotlib's constrained layout measures every tick label first and
    costs more than the drawing on a busy 2-core machine)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100)
    m = {"left": 0.55, "right": 0.15, "top": 0.35, "bottom": 0.45, "wspace": 0.3, "hspace": 0.55} | margins
    fig.subplots_adjust(left=m["left"] / w, right=1 - m["right"] / w, top=1 - m["top"] / h,
                        bottom=m["bottom"] / h, wspace=m["wspace"], hspace=m["hspace"])
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def arm_colors(arms: list[str]) -> dict:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {a: cmap(i % 10) for i, a in enumerate(arms)}


def _unit_ylim(ax, lows: list[float], highs: list[float]) -> None:
    """Rates live in [0, 1]: show the whole range unless a value (a difference like BRR) leaves it."""
    if lows and min(lows) >= -0.02 and max(highs) <= 1.02:
        ax.set_ylim(-0.03, 1.03)


def _interval(est) -> tuple[float, float, float, float]:
    """(low, high, below, above): the interval's ends (the value where it has none) and the error bar's lengths
    under and over the value, never negative. A file's interval need not hold its value: a constant rate's bootstrap
    ends come from other float sums than the value (1/3 as 0.3333333333333335 over [..326, ..337]), and a percentile
    interval may miss the point estimate; matplotlib refuses a negative bar, which made `opct report` a traceback."""
    lo = est.ci_low if est.ci_low is not None else est.value
    hi = est.ci_high if est.ci_high is not None else est.value
    return lo, hi, max(0.0, est.value - lo), max(0.0, hi - est.value)


def metric_grid(run, table, directions: dict) -> bytes:
    cols = table.columns
    ncol = min(4, len(cols))
    nrow = math.ceil(len(cols) / ncol)
    fig = _figure(3.1 * ncol, 2.6 * nrow)
    colors = arm_colors(run.arms)
    for i, col in enumerate(cols):
        ax = fig.add_subplot(nrow, ncol, i + 1)
        lows, highs = [], []
        for x, arm in enumerate(run.arms):
            est = estimate(run, arm, col.metric)
            if est is None:
                ax.text(x, 0.5, "–", ha="center", va="center", transform=ax.get_xaxis_transform(), color="0.5")
                continue
            lo, hi, below, above = _interval(est)
            ax.errorbar([x], [est.value], yerr=[[below], [above]], fmt="o", capsize=4, color=colors[arm],
                        markersize=6)
            lows.append(lo)
            highs.append(hi)
        d = directions.get(col.metric)
        ax.set_title(col.label + ("" if d is None else (" ↑" if d else " ↓")), fontsize=9)
        ax.set_xticks(range(len(run.arms)), run.arms, fontsize=8)
        ax.set_xlim(-0.6, len(run.arms) - 0.4)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(axis="y", alpha=0.3)
        _unit_ylim(ax, lows, highs)
    return _png(fig)


def grouped(run, table, train: set, ylabel: str) -> bytes:
    """Bars per (group, arm) with 95% intervals; training groups shaded and labelled so the held-out gap shows."""
    groups = table.groups
    arms = run.arms
    colors = arm_colors(arms)
    fig = _figure(max(6.0, 0.55 * len(groups) * max(1, len(arms)) + 1.5), 3.8, bottom=1.3)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(arms))
    lows, highs = [], []
    for j, arm in enumerate(arms):
        xs, ys, err = [], [], [[], []]
        for i, col in enumerate(table.columns):
            est = estimate(run, arm, col.metric)
            if est is None:
                continue
            lo, hi, below, above = _interval(est)
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(est.value)
            err[0].append(below)
            err[1].append(above)
            lows.append(lo)
            highs.append(hi)
        ax.bar(xs, ys, width * 0.9, yerr=err, capsize=2, color=colors[arm], label=arm, error_kw={"lw": 0.8})
    for i, g in enumerate(groups):
        if g in train:
            ax.axvspan(i - 0.5, i + 0.5, color="0.88", zorder=0)
    ax.set_xticks(range(len(groups)), [g + ("\n(train)" if g in train else "") for g in groups], fontsize=8,
                  rotation=20 if len(groups) > 5 else 0)
    ax.set_xlim(-0.5, len(groups) - 0.5)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_title(table.title + ("  (shaded: training groups)" if train & set(groups) else ""), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    _unit_ylim(ax, lows, highs)
    ax.legend(fontsize=8, ncols=min(len(arms), 7), loc="upper center", bbox_to_anchor=(0.5, -0.3), frameon=False)
    return _png(fig)


def _numeric(rows: list[dict], key: str) -> tuple[list, list]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and not r.get("skipped"):
            xs.append(r["step"])
            ys.append(v)
    return xs, ys


def _smooth(ys: list[float], k: int) -> list[float]:
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= k:
            acc -= ys[i - k]
        out.append(acc / min(i + 1, k))
    return out


def curve_keys(cells, n_extra: int = 2) -> list[str]:
    """'loss' and the first `n_extra` keys of CURVE_KEYS that these cells log as numbers."""
    present = {k for c in cells for r in c.curve for k, v in r.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return ["loss"] + [k for k in CURVE_KEYS if k in present][:n_extra]


def curves(run):
    """Training curves: one row of panels per trained arm (each method's loss has its own meaning and scale, so arms
    do not share an axis), one panel per logged key, one line per seed. None when nothing trained (base only)."""
    arms = [a for a in run.arms if any(c.curve for c in run.seed_runs(a))]
    if not arms:
        return None
    colors = arm_colors(run.arms)
    styles = ["-", "--", ":", "-."]
    ncol = max(len(curve_keys(run.seed_runs(a))) for a in arms)
    fig = _figure(3.9 * ncol, 2.5 * len(arms), bottom=0.55, hspace=0.75)
    for r, arm in enumerate(arms):
        cells = [c for c in run.seed_runs(arm) if c.curve]
        for i, key in enumerate(curve_keys(cells)):
            ax = fig.add_subplot(len(arms), ncol, r * ncol + i + 1)
            for c in cells:
                xs, ys = _numeric(c.curve, key)
                if not xs:
                    continue
                style = styles[run.seeds.index(c.seed) % len(styles)]
                label = f"seed {c.seed}"
                if len(xs) > 20:  # raw steps faint, a moving average on top: on-policy losses are noisy
                    ax.plot(xs, ys, style, color=colors[arm], alpha=0.25, lw=0.8)
                    ax.plot(xs, _smooth(ys, max(3, len(xs) // 20)), style, color=colors[arm], lw=1.5, label=label)
                else:
                    ax.plot(xs, ys, style, color=colors[arm], lw=1.5, marker=".", label=label)
            ax.set_title(f"{arm}: {key}", fontsize=10)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3)
            if len(cells) > 1 and ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    return _png(fig)
