"""Run one robustness study alone, for testing it: `python -m opct.robustness.<study> CONFIG [--seeds 0 1 2]
[--out DIR] [--block KEY] [--quick]`. CONFIG is a YAML/JSON file; its mapping under KEY (default: the study's name,
else the whole file) holds the study's `Config` fields; `--quick` puts the study's QUICK on top. Rows go to OUT/rows.jsonl; a summary (mean and 95% t-interval over
seeds of every metric at the last x) is printed. A rerun resumes (finished pieces are kept)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROW_KEYS = ("study", "method", "axis", "condition", "x", "metric", "value", "higher_is_better")


def check_rows(rows: list[dict], study: str) -> None:
    """Every row is well-formed (the study contract) and its key (study, method, axis, condition, x, metric) is
    unique within the seed; an AssertionError naming the first bad row otherwise."""
    keys = [tuple(r.get(k) for k in ROW_KEYS[:6]) for r in rows]
    assert len(set(keys)) == len(keys), "duplicate row keys"
    for r in rows:
        assert tuple(sorted(r)) == tuple(sorted(ROW_KEYS)), f"row keys {sorted(r)}"
        assert r["study"] == study and isinstance(r["method"], str) and isinstance(r["axis"], str), r
        assert isinstance(r["condition"], str) and isinstance(r["metric"], str), r
        assert r["x"] is None or isinstance(r["x"], float), r
        assert r["value"] is None or (isinstance(r["value"], float) and math.isfinite(r["value"])), r
        assert isinstance(r["higher_is_better"], bool), r


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval over seeds."""
    from opct.report.aggregate import t_interval as t

    m, lo, hi = t(values)
    return (m, m, m) if lo is None else (m, lo, hi)


def summarize(rows: list[dict]) -> list[str]:
    """One line per (condition, metric) at each condition's last x: mean [95% t-interval] over seeds."""
    last: dict = {}
    for r in rows:
        key = (r["condition"], f'{r["axis"]}.{r["metric"]}')
        x = -1.0 if r["x"] is None else r["x"]
        if r["value"] is not None and x >= last.get(key, (-2.0, None))[0]:
            if x > last.get(key, (-2.0, None))[0]:
                last[key] = (x, [])
            last[key][1].append(r["value"])
    out = []
    for (cond, metric), (x, vals) in sorted(last.items()):
        m, lo, hi = t_interval(vals)
        out.append(f"{cond:56s} {metric:40s} x={x:g}  {m:.3f} [{lo:.3f}, {hi:.3f}]  n_seeds={len(vals)}")
    return out


def main(study_module, argv=None) -> int:
    from opct.config import construct, load_config_file, seed_arg
    from opct.errors import OpctError
    from opct.flags import OnceList, path_arg

    name = study_module.__name__.rsplit(".", 1)[-1]
    ap = argparse.ArgumentParser(prog=f"python -m {study_module.__name__}", description=__doc__)
    ap.add_argument("config", type=path_arg)
    ap.add_argument("--seeds", type=seed_arg, nargs="+", action=OnceList, default=[0])
    ap.add_argument("--out", type=path_arg, default=f"runs/robustness-{name}")
    ap.add_argument("--block", default=name)
    ap.add_argument("--quick", action="store_true", help="the study's smoke-test size (its QUICK)")
    args = ap.parse_args(argv)
    try:
        data = load_config_file(args.config)
        block = data.get(args.block, data) if isinstance(data.get(args.block), dict) else data
        if args.quick:
            block = {**block, **getattr(study_module, "QUICK", {})}
        try:
            cfg = construct(study_module.Config, block, prefix=args.block if block is not data else "")
        except OpctError as e:
            raise OpctError(f"{args.config}: {e}") from None
        out = Path(args.out)
        rows = []
        for seed in args.seeds:
            t0 = time.time()
            got = study_module.run(cfg, seed, out / f"seed{seed}", print)
            check_rows(got, name)
            rows += got
            print(f"{name} seed {seed}: {len(got)} rows in {time.time() - t0:.0f} s")
        from opct.files import write_atomic

        write_atomic(out / "rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        print("\n".join(summarize(rows)))
    except OpctError as e:
        print(f"opct: error: {e}", file=sys.stderr)
        return 1
    return 0
