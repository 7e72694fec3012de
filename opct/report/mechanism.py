"""The mechanism probe (`opct mechanism RUN`): what each trained arm changed in the residual stream, layer by layer,
and whether methods changed it the same way.

For every complete (arm, seed) cell of an experiment with a trained adapter, and the starting model:
  * prompts: the *perturbed* (student) prompts of that seed's training pairs, up to `n` per axis (a seeded draw);
  * h[l]: the residual stream (the output of decoder layer l) at the last prompt position — where the answer starts;
  * delta[l] = h_trained[l] - h_base[l], one row per prompt (N x d);
  * change[l] = mean ||delta[l]|| / mean ||h_base[l]||: how far the arm moved the stream, relative to its size;
  * between two arms of the same seed: the cosine of their mean deltas (the direction of the shift) and the linear
    CKA of their delta matrices (prompts centred: whether they move the same prompts the same way, up to rotation
    and scale; Kornblith et al. 2019).
Over seeds: means with 95% t-intervals. A pair is "undefined" where either arm's change is below `MIN_CHANGE`
(a method that changed nothing has no direction to compare).

The clustering reading: the MLPCT / AttCT paper reports a shared residual-stream mechanism for ACT, MLPCT and AttCT,
with BCT distinct. Per seed, the mean CKA among the activation arms (act, mlpct, attct, those in the run) against
the mean CKA between an activation arm and an output-level arm (bct, sft, opct and their variants); the paired
difference over seeds, with its t-interval, says "cluster" (interval above 0), "no cluster" (below) or "cannot
decide". Written to RUN/mechanism.json; `opct report` adds its tables when the file is there.
"""

from __future__ import annotations

import random
from pathlib import Path

from opct.errors import OpctError
from opct.flags import first_repeat

MIN_CHANGE = 1e-3  # relative change below which an arm "changed nothing" at that layer
ACTIVATION_METHODS = ("act", "mlpct", "attct")
OUTPUT_METHODS = ("bct", "sft", "opct", "offpolicy")
UNTRAINED = ("base", "teacher")
RANGE = {"cos": (-1.0, 1.0), "cka": (0.0, 1.0)}
# Two centred prompts make rank-1 kernels, whose linear CKA is 1 whatever the arms do: it was printed as 1.000,
# "the same change", from --n 2 or a run of two training pairs (found 2026-12-07)
MIN_PROMPTS = 3
_WHY_THREE = "with two prompts, centred, CKA is 1 whatever the arms do"


def _t_interval(xs: list, lo: float | None = None, hi: float | None = None):
    """(mean, low, high) over the seeds where the statistic is defined (opct.report.aggregate.t_interval)."""
    from opct.report.aggregate import t_interval

    xs = [float(x) for x in xs if x is not None]
    return t_interval(xs, lo, hi) if xs else (None, None, None)


def linear_cka(x, y) -> float | None:
    """Linear CKA of two (N x d) matrices, rows centred: ||Y'X||_F^2 / (||X'X||_F ||Y'Y||_F). None when either is
    constant (no variation to compare)."""
    import torch

    x = x.double() - x.double().mean(0, keepdim=True)
    y = y.double() - y.double().mean(0, keepdim=True)
    xx = torch.linalg.matrix_norm(x.T @ x)
    yy = torch.linalg.matrix_norm(y.T @ y)
    if float(xx) == 0.0 or float(yy) == 0.0:
        return None
    return float(torch.linalg.matrix_norm(y.T @ x) ** 2 / (xx * yy))


def cosine(u, v) -> float | None:
    import torch

    nu, nv = torch.linalg.vector_norm(u.double()), torch.linalg.vector_norm(v.double())
    if float(nu) == 0.0 or float(nv) == 0.0:
        return None
    return float(torch.dot(u.double(), v.double()) / (nu * nv))


def _method_of(run, arm: str) -> str:
    spec = (run.experiment.get("arm_specs") or {}).get(arm) or {}
    return str(spec.get("method", arm))


def _prompts(pairs_file: Path, n: int, seed: int) -> list[tuple[str, list]]:
    """(axis, student messages) for up to n training pairs per axis, drawn with `seed`."""
    from opct.pairs.schema import load_pairs

    by_axis: dict[str, list] = {}
    for p in load_pairs(pairs_file):
        if p.teacher == p.student:  # a benign anchor pair carries no perturbation
            continue
        by_axis.setdefault(p.axis, []).append(p.student)
    out = []
    rng = random.Random(seed)
    for axis in sorted(by_axis):
        rows = list(by_axis[axis])
        rng.shuffle(rows)
        out += [(axis, m) for m in rows[:n]]
    return out


def _states(policy, prompts: list, batch_size: int):
    """(L, N, d) residual stream at the last prompt position, every decoder layer."""
    import torch

    ids = [policy.render(m) for m in prompts]
    chunks = []
    with torch.no_grad():
        for i in range(0, len(ids), batch_size):
            rec, _ = policy.read_activations(ids[i:i + batch_size], ("residual",))
            layers = sorted(rec.residual)
            chunks.append(torch.stack([rec.residual[layer][:, -1, :].float() for layer in layers]))
    return torch.cat(chunks, dim=1)


def compute(run_dir, arms=None, n: int = 64, batch_size: int = 32, progress: bool = True, log=print) -> dict:
    """The probe over a run directory written by `opct run`; returns (and writes RUN/mechanism.json) its result."""
    from opct.report.rundir import load_run, writing_into

    if not isinstance(n, int) or isinstance(n, bool) or n < MIN_PROMPTS:
        raise OpctError(f"--n: must be an integer >= {MIN_PROMPTS} (got {n!r}): {_WHY_THREE}")
    for record, kind in (("threats.json", "cross-threat (kind: threats)"),
                         ("study.json", "robustness (kind: robustness)")):
        if (Path(run_dir) / record).exists():  # it said "is it a run directory written by `opct run`?" (2026-12-07)
            raise OpctError(f"{run_dir}: a {kind} run ({record}); the mechanism probe compares the arms of an "
                            "experiment (`opct run EXPERIMENT.yaml`)")
    # the probe writes RUN/mechanism.json, which `opct report` reads: under the lock `opct run` and `opct report` take
    # (two probes, or one while the run trains its arms, interleaved; 2026-12), and not for minutes before finding
    # the run directory read-only
    with writing_into(Path(run_dir), "experiment", file="mechanism.json", writes="mechanism.json there"):
        return _probe(load_run(run_dir), arms, n, batch_size, progress)


def _probe(run, arms, n: int, batch_size: int, progress: bool) -> dict:
    import torch
    from tqdm.auto import tqdm

    from opct.files import write_json_atomic
    from opct.policy import load_policy
    from opct.subjects import resolve

    model_dir, _ = resolve(str(run.experiment.get("model_dir") or run.experiment.get("model", "default")))
    trained = [a for a in run.arms if a not in UNTRAINED and _method_of(run, a) not in UNTRAINED]
    if arms:
        if (twice := first_repeat(arms)) is not None:  # `--arms opct opct`: refused, as elsewhere
            raise OpctError(f"--arms: {twice} named twice")
        unknown = [a for a in arms if a not in run.arms]
        if unknown:
            raise OpctError(f"--arms: {unknown[0]!r} is not an arm of {run.dir} (arms: {', '.join(run.arms)})")
        trained = [a for a in trained if a in arms]
    if not trained:
        raise OpctError(f"{run.dir}: no trained arm to probe")
    seeds, per_seed, skipped = [], {}, []
    jobs = [(s, a) for s in run.seeds for a in trained]
    bar = tqdm(total=len(jobs) + len(run.seeds), desc="mechanism", disable=not progress, mininterval=2.0)
    for seed in run.seeds:
        pairs_file = run.dir / "pairs" / f"seed{seed}.jsonl"
        if not pairs_file.exists():
            skipped.append(f"seed {seed}: no {pairs_file}")
            bar.update(1 + len(trained))
            continue
        prompts = _prompts(pairs_file, n, seed)
        if len(prompts) < MIN_PROMPTS:
            raise OpctError(f"{pairs_file}: {len(prompts)} perturbed prompt(s), fewer than {MIN_PROMPTS}: {_WHY_THREE}")
        base = _states(load_policy(model_dir, progress=progress), [m for _, m in prompts], batch_size)
        bar.update(1)
        deltas = {}
        for arm in trained:
            adapter = run.dir / arm / str(seed) / "train" / "final"
            trained_there = (adapter / "adapter_config.json").exists()
            if (arm, seed) not in run.cells or not trained_there:  # an adapter without done.json: cell unfinished
                why = f"the cell is not finished (no {run.dir / arm / str(seed) / 'done.json'})" if trained_there \
                    else f"no trained adapter at {adapter}"
                skipped.append(f"{arm} seed {seed}: {why}")
                bar.update(1)
                continue
            policy = load_policy(model_dir, adapter=str(adapter), progress=progress)
            h = _states(policy, [m for _, m in prompts], batch_size)
            deltas[arm] = h - base
            bar.update(1)
        base_norm = base.norm(dim=-1).mean(dim=-1)  # (L,)
        change = {a: (d.norm(dim=-1).mean(dim=-1) / base_norm).tolist() for a, d in deltas.items()}
        L = base.shape[0]
        sim = {}
        for i, a in enumerate(deltas):
            for b in list(deltas)[i + 1:]:
                rows = []
                for layer in range(L):
                    if min(change[a][layer], change[b][layer]) < MIN_CHANGE:
                        rows.append({"cos": None, "cka": None})
                        continue
                    rows.append({"cos": cosine(deltas[a][layer].mean(0), deltas[b][layer].mean(0)),
                                 "cka": linear_cka(deltas[a][layer], deltas[b][layer])})
                sim[f"{a}|{b}"] = rows
        per_seed[seed] = {"n_prompts": len(prompts), "axes": sorted({ax for ax, _ in prompts}), "change": change,
                          "similarity": sim, "layers": L}
        seeds.append(seed)
        del base, deltas
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    bar.close()
    # an arm with no adapter in any seed is left out (and listed in `skipped`), not shown as measured: its row would
    # read "undefined" and its diagonal 1, as though it had been probed
    probed = [a for a in trained if any(a in per_seed[s]["change"] for s in seeds)]
    if not probed:
        raise OpctError(f"{run.dir}: nothing to probe ({'; '.join(skipped)})")
    result = {"run": str(run.dir), "model": str(model_dir), "arms": probed, "seeds": seeds, "n_per_axis": n,
              "min_change": MIN_CHANGE, "methods": {a: _method_of(run, a) for a in probed},
              "per_seed": {str(s): v for s, v in per_seed.items()}, "skipped": skipped}
    result["summary"] = summarise(result)
    write_json_atomic(run.dir / "mechanism.json", result)
    return result


def _pair_key(a: str, b: str, sim: dict) -> str | None:
    return f"{a}|{b}" if f"{a}|{b}" in sim else (f"{b}|{a}" if f"{b}|{a}" in sim else None)


def _mean_over_layers(rows: list[dict], key: str) -> float | None:
    xs = [r[key] for r in rows if r.get(key) is not None]
    return sum(xs) / len(xs) if xs else None


def summarise(result: dict) -> dict:
    """Means and t-intervals over seeds: change per arm and layer; cosine and CKA per arm pair (mean over the layers
    where both changed); the clustering reading."""
    seeds = [str(s) for s in result["seeds"]]
    arms = result["arms"]
    methods = result["methods"]
    L = max(result["per_seed"][s]["layers"] for s in seeds)
    change = {}
    for a in arms:
        change[a] = []
        for layer in range(L):
            xs = [result["per_seed"][s]["change"][a][layer] for s in seeds if a in result["per_seed"][s]["change"]]
            change[a].append(dict(zip(("value", "ci_low", "ci_high"), _t_interval(xs, 0.0)), n=len(xs)))
    pairs = {}
    for i, a in enumerate(arms):
        for b in arms[i + 1:]:
            entry = {}
            for key in ("cos", "cka"):
                xs = []
                for s in seeds:
                    sim = result["per_seed"][s]["similarity"]
                    k = _pair_key(a, b, sim)
                    if k is not None:
                        xs.append(_mean_over_layers(sim[k], key))
                entry[key] = dict(zip(("value", "ci_low", "ci_high"), _t_interval(xs, *RANGE[key])),
                                  n=len([x for x in xs if x is not None]))
            pairs[f"{a}|{b}"] = entry
    act = [a for a in arms if methods.get(a) in ACTIVATION_METHODS]
    out = [a for a in arms if methods.get(a) in OUTPUT_METHODS]
    diffs = []
    for s in seeds:
        sim = result["per_seed"][s]["similarity"]

        def mean_cka(group_pairs):
            xs = []
            for a, b in group_pairs:
                k = _pair_key(a, b, sim)
                v = _mean_over_layers(sim[k], "cka") if k else None
                if v is not None:
                    xs.append(v)
            return sum(xs) / len(xs) if xs else None

        within = mean_cka([(a, b) for i, a in enumerate(act) for b in act[i + 1:]])
        between = mean_cka([(a, b) for a in act for b in out])
        if within is not None and between is not None:
            diffs.append(within - between)
    value, lo, hi = _t_interval(diffs, -1.0, 1.0)
    if len(act) < 2 or not out:
        reading = "not measured (needs two activation-consistency arms and an output-level arm)"
    elif not diffs:
        reading = "cannot decide (an arm changed nothing: no direction to compare)"
    elif len(diffs) < 2 or lo is None:
        reading = "cannot decide (fewer than two seeds)"
    elif lo > 0:
        reading = "cluster"
    elif hi < 0:
        reading = "no cluster"
    else:
        reading = "cannot decide"
    return {"change": change, "pairs": pairs, "activation_arms": act, "output_arms": out,
            "cluster": {"within_minus_between_cka": {"value": value, "ci_low": lo, "ci_high": hi, "n": len(diffs)},
                        "reading": reading}}


# ------------------------------------------------------------------------------------------------ rendering

def _fmt(m: dict) -> str:
    if m.get("value") is None:
        return "undefined"
    from opct.report.aggregate import num

    if m.get("ci_low") is None or m.get("n", 0) < 2:
        return num(m["value"])
    return f"{num(m['value'])} [{num(m['ci_low'])}, {num(m['ci_high'])}]"


def load(run_dir) -> dict | None:
    path = Path(run_dir) / "mechanism.json"
    if not path.exists():
        return None
    from opct.files import read_json

    data = read_json(path, "mechanism")  # names the file: not UTF-8, a directory, nested too deeply (2026-12-07:
    try:  # "input: nested too deeply to read", no file)
        markdown(data)  # the file must hold what the report shows: a summary of every arm it names
        _covered(data)  # and which seeds and arms it covers
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, StopIteration, RecursionError):
        raise OpctError(f"{path}: not a mechanism probe result (rerun `opct mechanism {run_dir}`)") from None
    return data


def tables(result: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the probe's tables."""
    s = result["summary"]
    arms = result["arms"]
    L = len(next(iter(s["change"].values())))
    change = ("Residual-stream change per layer (mean ||h_trained − h_base|| / mean ||h_base||, last prompt "
              "position, perturbed prompts)", ["arm (method)"] + [f"layer {i}" for i in range(L)],
              [[f"{a} ({result['methods'][a]})"] + [_fmt(m) for m in s["change"][a]] for a in arms])
    header = ["arm"] + arms
    cka_rows, cos_rows = [], []
    for a in arms:
        r_cka, r_cos = [a], [a]
        for b in arms:
            if a == b:
                r_cka.append("1")
                r_cos.append("1")
                continue
            key = f"{a}|{b}" if f"{a}|{b}" in s["pairs"] else f"{b}|{a}"
            r_cka.append(_fmt(s["pairs"][key]["cka"]))
            r_cos.append(_fmt(s["pairs"][key]["cos"]))
        cka_rows.append(r_cka)
        cos_rows.append(r_cos)
    c = s["cluster"]
    cluster = ("Do the activation methods share a mechanism?", ["activation arms", "output-level arms",
                                                                  "CKA within − between (paired over seeds)",
                                                                  "seeds", "reading"],
               [[", ".join(s["activation_arms"]) or "–", ", ".join(s["output_arms"]) or "–",
                 _fmt(c["within_minus_between_cka"]), str(c["within_minus_between_cka"]["n"]), c["reading"]]])
    return [change,
            ("Linear CKA of the residual-stream changes (mean over layers where both arms changed)", header, cka_rows),
            ("Cosine of the mean residual-stream changes (mean over layers where both arms changed)", header, cos_rows),
            cluster]


NOTE = ("The mechanism probe (`opct mechanism RUN`): residual stream at the last prompt position on the perturbed "
        "prompts of each seed's training pairs; per seed, the change of each trained arm from the starting model and "
        "the similarity of two arms' changes; means over seeds with 95% t-intervals. 'undefined': an arm changed the "
        f"stream by less than {MIN_CHANGE:g} of its norm, so it has no direction to compare. The reading compares the "
        "CKA among activation-consistency arms with their CKA to output-level arms.")


def _covered(result: dict) -> set:
    """{(arm, seed)} the probe measured (a KeyError / ValueError / TypeError where the file has another shape)."""
    [int(s) for s in result["seeds"]], [str(a) for a in result["arms"]]
    return {(str(a), int(s)) for s, v in result["per_seed"].items() for a in v["change"]}


def coverage(result: dict, run) -> list[str]:
    """What the probe covers, and the finished cells of trained arms it does not (a seed run since `opct mechanism`:
    the section read as the run's, found 2026-12-07), with how to refresh it."""
    covered = _covered(result)
    out = [f"This probe covers seed{'s' if len(result['seeds']) != 1 else ''} "
           f"{', '.join(map(str, result['seeds']))} of arm{'s' if len(result['arms']) != 1 else ''} "
           f"{', '.join(result['arms'])}."]
    stale = [f"{arm} seed {seed}" for (arm, seed) in sorted(run.cells, key=lambda k: (k[1], run.arms.index(k[0])))
             if arm not in UNTRAINED and _method_of(run, arm) not in UNTRAINED and (arm, seed) not in covered]
    if stale:
        out.append(f"Out of date: the run now has finished cells it does not cover ({', '.join(stale)}); run "
                   f"`opct mechanism {run.dir}` to refresh it.")
    return out


def markdown(result: dict) -> str:
    from opct.report import markdown as md

    lines = []
    for title, header, rows in tables(result):
        lines += [f"### {md.text(title)}", "", md.table(header, rows), ""]
    if result.get("skipped"):
        lines += ["Not probed: " + md.text("; ".join(result["skipped"])), ""]
    lines += [NOTE, ""]
    return "\n".join(lines)
