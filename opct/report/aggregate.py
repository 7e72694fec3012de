"""One number per (arm, metric) from the seeds that completed, with its 95% interval.

- one seed: that seed's value and the eval's own 95% bootstrap interval (resampled by item);
- two or more seeds: the mean over seeds and a 95% Student-t interval over seeds, mean ± t(0.975, k-1) · s / √k,
  where s is the sample standard deviation of the k per-seed values. This is the seed-to-seed spread (training and
  evaluation noise together), not the item-level bootstrap.

Every metric opct writes is a rate in [0, 1] except a difference of two rates in [-1, 1] (BRR, BRR over all rows,
PAR: `DIFFERENCES`);
a t-interval is clipped to that range (with two seeds t = 12.7, so an unclipped interval of a rate easily reads
[-1.2, 2.2]), and a paired difference of two arms' values to the range of a difference (`difference_range`).
An lm-eval measure is clipped to its own range (`opct.evals.lm_eval_bridge.RANGES`: an MCC's [-1, 1], a Brier score's
[0, 2], a perplexity's [1, inf)), or not at all when unknown. A metric with a value outside [0, 1] and no known range
is not clipped. A huge or infinite value is a value: it is
shown as such (`num`: 1e+308, inf), and an infinite one has no interval.

A seed whose metric is missing or null (an empty group, a suite not run) is left out; `n_seeds` says how many seeds
went into the number, so a cell built from fewer seeds than its row is visible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Two-sided 95% critical values of Student's t, df = 1..30, to 6 decimals (the 3-decimal tables' 4.303 for df = 2
# made every 3-seed interval 8e-5 of its width too wide, which moved a printed bound by 0.001 now and then).
_T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
         2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
         2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (a table to 30; beyond, the Cornish-Fisher
    expansion to df^-3, within 2e-6 of the exact quantile)."""
    if df < 1:
        raise ValueError("df must be at least 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959963985
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def t_interval(xs, lo: float | None = None, hi: float | None = None):
    """(mean, low, high) of a non-empty list of per-seed values: the 95% Student-t interval mean ± t(0.975, k-1)·s/√k,
    clipped to [lo, hi] where given; low and high are None from a single value (no spread to estimate)."""
    k = len(xs)
    mean = sum(x / k for x in xs)  # not sum(xs) / k: two values of 1e308 add up to inf
    if k < 2 or not math.isfinite(mean):
        return mean, None, None  # an infinite value has no interval to give
    scale = max(abs(x - mean) for x in xs) or 1.0  # the squares of values near 1e308 overflow
    sd = scale * math.sqrt(sum(((x - mean) / scale) ** 2 for x in xs) / (k - 1))
    half = t975(k - 1) * sd / math.sqrt(k)
    low, high = mean - half, mean + half
    return mean, low if lo is None else max(lo, low), high if hi is None else min(hi, high)


@dataclass
class Estimate:
    value: float
    ci_low: float | None
    ci_high: float | None
    n_seeds: int  # 1: the interval is that seed's bootstrap interval over items; more: a t-interval over seeds
    higher_is_better: bool | None


def estimate(run, arm: str, metric: str) -> Estimate | None:
    """The arm's aggregate for `metric`, or None when no complete seed has a value for it."""
    ms = [c.metrics[metric] for c in run.seed_runs(arm)
          if metric in c.metrics and c.metrics[metric].get("value") is not None
          and not math.isnan(c.metrics[metric]["value"])]  # inf is a value, shown as such (`num`); NaN is none
    if not ms:
        return None
    hib = next((m["higher_is_better"] for m in ms if isinstance(m.get("higher_is_better"), bool)), None)
    if len(ms) == 1:
        m = ms[0]
        lo, hi = m.get("ci_low"), m.get("ci_high")
        if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
            lo = hi = None
        return Estimate(float(m["value"]), lo, hi, 1, hib)
    xs = [float(m["value"]) for m in ms]
    mean, lo, hi = t_interval(xs, *(value_range(metric, xs) or (None, None)))
    return Estimate(mean, lo, hi, len(xs), hib)


# metrics that are a difference of two rates (opct.evals.metrics.ratio_difference), in [-1, 1]
DIFFERENCES = ("sycophancy.brr", "sycophancy.brr_all", "prefill.par")


def value_range(metric: str, values: list[float]):
    """The range a metric's value can take, or None when unknown. An lm-eval measure's is its own
    (`opct.evals.lm_eval_bridge.RANGES`), never read off the values: two seeds' MCCs of 0.2 and 0.4 clipped their
    interval at 0, two Brier scores' at 1 (it runs to 2), two BLEUs of 0.5 at 1 (to 100), until 2026-12."""
    from opct.evals.lm_eval_bridge import PREFIX, metric_range

    if metric.startswith(PREFIX + "["):
        return metric_range(metric)
    if metric.split("[", 1)[0] in DIFFERENCES:
        return (-1.0, 1.0)
    if all(0.0 <= v <= 1.0 for v in values):
        return (0.0, 1.0)
    return None


def difference_range(metric: str, values: list[float]):
    """The range of a difference of two values of `metric` (`value_range` minus itself: [-1, 1] for two rates,
    [-2, 2] for two differences of rates), or None when unknown."""
    r = value_range(metric, values)
    return None if r is None else (r[0] - r[1], r[1] - r[0])


# beyond this a number is written in exponent form (1e+308 is one word, not 309 digits)
HUGE = 1e6


def signed(x: float, digits: int = 3) -> str:
    """+0.012 / −0.005 (a real minus sign, so a column of deltas lines up and reads as a number); +inf / −inf / nan
    for what is not finite."""
    if math.isnan(x):
        return "nan"
    s = num(abs(x), digits)
    if s == f"{0:.{digits}f}":
        return "±" + s
    return ("+" if x > 0 else "−") + s


def num(x: float, digits: int = 3, plus: bool = False) -> str:
    """x to `digits` places (`plus`: with its sign, +0.012 / -0.005), never '-0.000' (a bootstrap bound of -1e-17 is
    zero); a huge value in exponent form (1e+308), a non-finite one as inf / -inf / nan: every report writes its
    numbers through this, so a value is shown as what it is, never dropped and never a crash."""
    sign = "+" if plus else ""
    if not math.isfinite(x) or abs(x) >= HUGE:
        return f"{x:{sign}.{digits}g}"
    s = f"{x:{sign}.{digits}f}"
    return sign + s[1:] if s.startswith("-") and float(s) == 0 else s


def cell_text(est: Estimate | None, row_seeds: int = 1, base: Estimate | None = None,
              digits: int = 3) -> str:
    """'0.990 [0.970, 1.000]', plus ' (n=2)' when fewer seeds than the row has, plus ' (−0.005)' versus base."""
    if est is None:
        return "–"
    s = num(est.value, digits)
    if est.ci_low is not None and est.ci_high is not None:
        s += f" [{num(est.ci_low, digits)}, {num(est.ci_high, digits)}]"
    if est.n_seeds < row_seeds:
        s += f" (n={est.n_seeds})"
    if base is not None:
        s += f" ({signed(est.value - base.value, digits)})"
    return s
