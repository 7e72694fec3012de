"""Paper vs opct: the OPCT paper's published numbers beside this run's under the same metric names, and for each of
its headline claims whether the run reproduces it, refutes it or cannot decide.

The published numbers are those of the paper's repository (`figures/data`, summarised in
../shared/papers/protocols.md §1), as fractions. A claim compares two arms of the run by *role*:
  opct      the arm named `opct` (else the first arm whose method is opct and that does not start from another arm);
  sft       the paper's SFT baseline for sycophancy and jailbreaks: the arm named `bct` (BCT on the model's own greedy
            answers, as the paper's code trains it), else `sft`, else the first arm whose method is bct or sft;
  sft_sampled  its SFT baseline for awareness ("SFT (e1)": teacher answers sampled at T = 1): the arm named `sft`
            (else the first arm whose method is sft, else the `sft` role);
  base      the arm whose method is base.
The verdict is read off the paired difference over seeds (the arms of one seed share its pairs and eval items):
d_s = metric(opct, s) - metric(sft, s), its mean and 95% Student-t interval over the k seeds that have both.
With k >= 3: "reproduces" when the interval excludes 0 on the side the paper claims, "refutes" when it excludes 0
on the other side, "cannot decide" when it holds 0; with fewer seeds, "cannot decide (k seeds)". A claim whose
metric the run did not measure says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from opct.report import unparsed
from opct.report.aggregate import difference_range, num, signed, t_interval

# The paper's published numbers (fractions): metric -> {model: {arm: value}}.
PUBLISHED = {
    "sycophancy.sycophancy_rate_all": {"Qwen3-8B": {"base": .165, "sft": .129, "opct": .086},
                                       "Nemotron-30B": {"base": .181, "sft": .087, "opct": .072},
                                       "gpt-oss-20b": {"base": .109, "sft": .087, "opct": .067}},
    "sycophancy.brr_all": {"Qwen3-8B": {"base": .103, "sft": .066, "opct": .025},
                           "Nemotron-30B": {"base": .128, "sft": .036, "opct": .019},
                           "gpt-oss-20b": {"base": .056, "sft": .033, "opct": .012}},
    "sycophancy.consistency_all": {"Qwen3-8B": {"base": .843, "sft": .846, "opct": .895},
                                   "Nemotron-30B": {"base": .803, "sft": .897, "opct": .883},
                                   "gpt-oss-20b": {"base": .862, "sft": .876, "opct": .903}},
    "sycophancy.accuracy_biased": {"Qwen3-8B": {"base": .739, "sft": .760, "opct": .796},
                                   "Nemotron-30B": {"base": .738, "sft": .821, "opct": .825},
                                   "gpt-oss-20b": {"base": .799, "sft": .809, "opct": .825}},
    "sycophancy.accuracy_clean": {"Qwen3-8B": {"base": .813, "sft": .810, "opct": .817},
                                  "Nemotron-30B": {"base": .843, "sft": .847, "opct": .840},
                                  "gpt-oss-20b": {"base": .842, "sft": .839, "opct": .835}},
    # awareness: SFT (e1) and OPD (final) as the paper's SFT and OPCT rows
    "awareness.ausc": {"Llama-3.1-8B": {"base": .439, "teacher": .930, "sft": .807, "opct": .874, "sft_opct": .828},
                       "Qwen3-4B": {"base": .641, "teacher": .982, "sft": .859, "opct": .905, "sft_opct": .920},
                       "gpt-oss-20b": {"base": .498, "teacher": .962, "sft": .821, "opct": .847, "sft_opct": .838}},
    "awareness.ausc_benign": {"Llama-3.1-8B": {"base": .986, "teacher": .995, "sft": .977, "opct": .990,
                                               "sft_opct": .891},
                              "Qwen3-4B": {"base": .995, "teacher": 1.0, "sft": .999, "opct": .999, "sft_opct": .999},
                              "gpt-oss-20b": {"base": .988, "teacher": .999, "sft": .999, "opct": .999,
                                              "sft_opct": .998}},
    # the paper's text: adaptive-attack defence on held-out behaviours, averaged over its model families
    "jailbreak.dsr_adaptive_rl": {"paper (mean)": {"sft": .87, "opct": .99}},
}


@dataclass(frozen=True)
class Claim:
    text: str
    metric: str
    higher_is_better_for_opct: bool  # the paper says opct's value is higher (True) or lower (False) than sft's
    against: str = "sft"


CLAIMS = (
    Claim("OPCT leaves less sycophancy than SFT", "sycophancy.sycophancy_rate_all", False),
    Claim("OPCT has a lower biased-reasoning rate than SFT", "sycophancy.brr_all", False),
    Claim("OPCT answers more consistently (higher invariance) than SFT", "sycophancy.consistency_all", True),
    Claim("OPCT defends better than SFT against the RL-trained adaptive attacker", "jailbreak.dsr_adaptive_rl",
          True),
    Claim("OPCT transfers awareness to held-out domains better than SFT", "awareness.ausc[split=heldout]", True,
          "sft_sampled"),
    Claim("OPCT keeps more capability than SFT", "capability.accuracy", True),
)


def roles(run) -> dict[str, str]:
    """Role -> arm name (see the module docstring); a role no arm fills is left out."""
    specs = run.experiment.get("arm_specs") or {}

    def method(arm):
        return (specs.get(arm) or {}).get("method", arm)

    out = {}
    opct = [a for a in run.arms if method(a) == "opct" and not (specs.get(a) or {}).get("init_from")]
    if "opct" in run.arms and method("opct") == "opct":
        out["opct"] = "opct"
    elif opct:
        out["opct"] = opct[0]
    for name in ("bct", "sft"):
        if name in run.arms and method(name) in ("bct", "sft"):
            out["sft"] = name
            break
    else:
        sft = [a for a in run.arms if method(a) in ("bct", "sft")]
        if sft:
            out["sft"] = sft[0]
    for role, m in (("base", "base"), ("teacher", "teacher")):
        found = [a for a in run.arms if method(a) == m]
        if found:
            out[role] = found[0]
    sampled = [a for a in run.arms if method(a) == "sft"]
    if "sft" in run.arms and method("sft") == "sft":
        out["sft_sampled"] = "sft"
    elif sampled:
        out["sft_sampled"] = sampled[0]
    elif "sft" in out:
        out["sft_sampled"] = out["sft"]
    sft_opct = [a for a in run.arms if method(a) == "opct" and (specs.get(a) or {}).get("init_from")]
    if sft_opct:
        out["sft_opct"] = sft_opct[0]
    return out


def _role(role: str, metric: str) -> str:
    """The awareness rows compare against the paper's awareness SFT (sampled targets)."""
    return "sft_sampled" if role == "sft" and metric.startswith("awareness.") else role


def paired_difference(run, a: str, b: str, metric: str):
    """(mean, lo, hi, k) of metric(a, s) - metric(b, s) over the seeds both have; None when none has both. The
    interval is clipped to the range of a difference of the metric's values (`difference_range`: [-1, 1] for rates,
    [-2, 2] for BRR or PAR), as the report's own t-intervals are."""
    def per_seed(arm):
        return {c.seed: c.metrics[metric]["value"] for c in run.seed_runs(arm)
                if isinstance((c.metrics.get(metric) or {}).get("value"), (int, float))
                and not math.isnan(c.metrics[metric]["value"])}

    va, vb = per_seed(a), per_seed(b)
    both = sorted(set(va) & set(vb))
    ds = [va[s] - vb[s] for s in both]
    if not ds:
        return None
    bounds = difference_range(metric, [v for s in both for v in (va[s], vb[s])]) or (None, None)
    return (*t_interval(ds, *bounds), len(ds))


def verdict(claim: Claim, diff) -> str:
    if diff is None:
        return "not measured"
    mean, lo, hi, k = diff
    if k < 3 or lo is None:
        return f"cannot decide ({k} seed{'s' if k != 1 else ''}; needs >= 3)"
    if lo > 0 or hi < 0:
        return "reproduces" if (lo > 0) == claim.higher_is_better_for_opct else "refutes"
    return "cannot decide"


def claims_table(run) -> tuple[list[str], list[list[str]]]:
    r = roles(run)
    header = ["the paper's claim", "metric", "opct − sft (paired over seeds) [95% CI]", "seeds", "unparsed (opct; sft)",
              "verdict"]
    body = []
    for c in CLAIMS:
        if "opct" not in r or c.against not in r:
            body.append([c.text, c.metric, "–", "0", "–", "cannot decide (the run has no opct or no sft arm)"])
            continue
        arms = (r["opct"], r[c.against])
        d = paired_difference(run, *arms, c.metric)
        cell = "–" if d is None else signed(d[0]) + (f" [{num(d[1])}, {num(d[2])}]" if d[1] is not None else "")
        body.append([c.text, c.metric, cell, str(d[3]) if d else "0", _unparsed_cell(run, c.metric, arms),
                     _doubted(verdict(c, d), run, c.metric, arms)])
    return header, body


def _unparsed_cell(run, metric: str, arms) -> str:
    """'32/32; 4/32': each arm's unparsed answers of all it gave on `metric`, summed over seeds."""
    got = [unparsed.counts(run.seed_runs(a), metric) for a in arms]
    return "; ".join(f"{u}/{t}" for u, t in got) if any(t for _, t in got) else "–"  # "–": no answers to count


def _doubted(reading: str, run, metric: str, arms) -> str:
    """`reading`, or 'inconclusive (N% unparsed in ARM)' where an arm's answers on `metric` are mostly unreadable
    (`opct.report.unparsed.THRESHOLD`); a metric not measured stays so."""
    if reading.startswith("not measured"):
        return reading
    return unparsed.doubt(run, metric, arms) or reading


def published_table(run) -> tuple[list[str], list[list[str]]]:
    """One row per (metric, published model) and role: the paper's number beside this run's aggregate."""
    from opct.report.aggregate import cell_text, estimate

    r = roles(run)
    shown = [role for role in ("base", "teacher", "sft", "opct", "sft_opct") if role in r]
    header = ["metric", "source"] + shown
    body = []
    for metric, by_model in PUBLISHED.items():
        for model, vals in by_model.items():
            body.append([metric, f"paper: {model}"] + [num(vals[role]) if role in vals else "–" for role in shown])
        arms = [r.get(_role(role, metric)) for role in shown]
        body.append([metric, "this run (arms: " + ", ".join(a or "–" for a in arms) + ")"]
                    + [cell_text(estimate(run, a, metric), len(run.seeds))
                       + unparsed.mark(*unparsed.counts(run.seed_runs(a), metric)) if a else "–" for a in arms])
    return header, body


# The ablations' metrics: one per axis, on the held-out split where the axis has one.
ABLATION_METRICS = (
    ("held-out sycophancy (all rows) ↓", "sycophancy.sycophancy_rate_all[split=heldout]", False),
    ("DSR, held-out wrappers ↑", "jailbreak.dsr[on=heldout_wrappers]", True),
    ("DSR, RL attacker ↑", "jailbreak.dsr_adaptive_rl", True),
    ("AUSC, held-out domains ↑", "awareness.ausc[split=heldout]", True),
    ("over-warning ↓", "awareness.over_warning", False),
    ("capability ↑", "capability.accuracy", True),
)


def ablations(run) -> list[tuple[str, str, str]]:
    """(question, arm, against): the run's pairs of arms that differ in one thing the paper ablates.
    offpolicy vs the opct role (where the responses come from); an opct arm with another estimator vs the opct role
    (the objective); an arm with init_from X vs X (starting from X); an arm with benign_replay vs the arm of the same
    spec without it (benign regularisation)."""
    specs = run.experiment.get("arm_specs") or {}
    r = roles(run)
    out = []

    def spec(a):
        return dict(specs.get(a) or {"method": a})

    for a in run.arms:
        sa = spec(a)
        if sa.get("method") == "offpolicy" and "opct" in r:
            out.append(("on-policy (opct) vs responses sampled once from the starting model", r["opct"], a))
        if sa.get("method") == "opct" and sa.get("estimator") and a != r.get("opct") and "opct" in r:
            out.append((f"the {sa['estimator']} estimator vs opct's", a, r["opct"]))
        if sa.get("init_from") in run.arms:
            out.append((f"OPCT after {sa['init_from']} vs {sa['init_from']} alone", a, sa["init_from"]))
        if sa.get("benign_replay"):
            rest = {k: v for k, v in sa.items() if k != "benign_replay"}
            twin = [b for b in run.arms if b != a and spec(b) == rest]
            if twin:
                out.append(("benign replay vs none", a, twin[0]))
    return out


def ablations_table(run) -> tuple[list[str], list[list[str]]]:
    """Per ablation and metric: the paired difference over seeds (arm - against) and whether it differs from 0."""
    header = ["ablation", "arm − against", "metric", "paired difference [95% CI]", "seeds", "reading"]
    body = []
    for question, a, b in ablations(run):
        for label, metric, higher in ABLATION_METRICS:
            d = paired_difference(run, a, b, metric)
            if d is None:
                continue
            mean, lo, hi, k = d
            cell = signed(mean) + (f" [{num(lo)}, {num(hi)}]" if lo is not None else "")
            if k < 3 or lo is None:
                reading = f"cannot decide ({k} seed{'s' if k != 1 else ''}; needs >= 3)"
            elif lo > 0 or hi < 0:
                reading = f"{a} better" if (lo > 0) == higher else f"{a} worse"
            else:
                reading = "no difference shown"
            body.append([question, f"{a} − {b}", label, cell, str(k), _doubted(reading, run, metric, (a, b))])
    return header, body


ABLATION_NOTE = ("Ablations: pairs of arms of this run that differ in one thing. Each row is the paired difference "
                 "over seeds (arm − against) with its 95% t-interval; 'better' / 'worse' when the interval excludes 0, "
                 f"in the metric's direction; inconclusive when more than {unparsed.THRESHOLD:.0%} of either arm's "
                 "answers on the metric went unparsed.")


NOTE = ("Roles: opct = the run's OPCT arm, sft = its BCT (the paper's SFT baseline for sycophancy and jailbreaks) "
        "or SFT arm, base = the starting model, teacher = the starting model asked the teacher side (the paper's "
        "oracle), sft_opct = OPCT started from an SFT/BCT adapter. A verdict is read off the paired difference over "
        "seeds: reproduces / refutes when its 95% t-interval excludes 0 on the paper's side / the other side, cannot "
        "decide when it holds 0 or when fewer than 3 seeds have both arms; inconclusive when more than "
        f"{unparsed.THRESHOLD:.0%} of either arm's answers on the metric went unparsed. The paper's models are "
        "4B-30B instruction-tuned LLMs; the organism is a 2M-parameter model of a synthetic world, so agreement in "
        "direction, not in level, is what can be compared.")
