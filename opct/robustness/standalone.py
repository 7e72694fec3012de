"""Run one robustness study alone, for testing it: `python -m opct.robustness.<study> CONFIG [--seeds 0 1 2]
[--out DIR] [--block KEY] [--quick]`. CONFIG is a YAML/JSON file; its mapping under KEY (default: the study's name,
else the whole file) holds the study's `Config` fields; `--quick` puts the study's QUICK on top. Rows go to
OUT/rows.jsonl; a summary (mean and 95% t-interval over seeds of every metric at the last x) is printed. A rerun
resumes (finished pieces are kept); its settings are recorded in OUT/settings.json, and a rerun into the same OUT with
other settings is refused naming the changed fields (more seeds are fine), as `opct run` refuses it. Every study of
`opct.robustness.studies.STUDIES` runs this way."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def check_rows(rows: list[dict], study: str) -> list[dict]:
    """Every row is well-formed (the study contract), of `study`, and its key (study, method, axis, condition, x,
    metric) unique within the seed: the rows as `opct run` checks them (`opct.robustness.runner.check_rows`), or an
    OpctError naming the first bad row."""
    from opct.robustness.runner import check_rows as checked

    return checked(rows, f"study {study}", study)


def t_interval(metric: str, values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval over seeds, clipped to the metric's range as the runner's report clips it
    (`opct.robustness.runner.metric_range`: a rate's interval stays in [0, 1])."""
    from opct.report.aggregate import t_interval as t
    from opct.robustness.runner import metric_range

    m, lo, hi = t(values, *(metric_range(metric, values) or (None, None)))
    return (m, m, m) if lo is None else (m, lo, hi)


def summarize(rows: list[dict]) -> list[str]:
    """One line per (condition, metric) at each condition's last x: mean [95% t-interval] over seeds."""
    last: dict = {}
    for r in rows:
        key = (r["condition"], r["axis"], r["metric"])
        x = -1.0 if r["x"] is None else r["x"]
        if r["value"] is not None and x >= last.get(key, (-2.0, None))[0]:
            if x > last.get(key, (-2.0, None))[0]:
                last[key] = (x, [])
            last[key][1].append(r["value"])
    out = []
    for (cond, axis, metric), (x, vals) in sorted(last.items()):
        m, lo, hi = t_interval(metric, vals)
        out.append(f"{cond:56s} {axis + '.' + metric:40s} x={x:g}  {m:.3f} [{lo:.3f}, {hi:.3f}]  n_seeds={len(vals)}")
    return out


def study_block(data: dict, key: str | None, study: str, path) -> tuple[dict, str]:
    """The study's settings in CONFIG and the field path that names them: the mapping under `key` (--block), else
    under the study's name, else the whole file. A --block the file lacks, or a block that is no mapping, is an
    error naming it (both were taken for the whole file: `unknown Config field(s) reasons`)."""
    from opct.errors import OpctError

    if key is None:
        if study not in data:
            return data, ""
        key = study
    if key not in data:
        raise OpctError(f"{path}: --block {key}: no such key in the file (its keys: {', '.join(map(str, data))})")
    if not isinstance(data[key], dict):
        raise OpctError(f"{path}: {key}: must be a mapping of the {study} study's settings (got {data[key]!r})")
    return data[key], key


SETTINGS = "settings.json"


def check_settings(out: Path, study: str, settings: dict, seeds: list[int]) -> None:
    """Before a study alone runs into `out`: refuse, naming the changed fields, when `out` was run with other settings
    (OUT/settings.json: the study, its resolved Config and the seeds run), as `opct run` refuses it (seeds may be
    added); an OUT holding a study's pieces without settings.json is refused too (its settings cannot be checked).
    Until 2026-12-07 a rerun with other settings reused every piece's done.json: `eval: {n: 8}` reported n = 4's
    results. Then writes the settings, the seeds merged."""
    from opct.errors import OpctError
    from opct.files import read_json, write_json_atomic
    from opct.resume_check import check_extended, restart_allowed
    from opct.robustness.runner import study_changes

    path = out / SETTINGS
    settings = json.loads(json.dumps(settings))  # as it reads back (tuples as lists)
    old_seeds: list[int] = []
    if path.exists():
        old = read_json(path, "robustness study settings")
        if not isinstance(old, dict) or not isinstance(old.get("settings"), dict):
            raise OpctError(f"{path}: not a robustness study's settings; use another --out, or delete {out}")
        check_extended(old, path, seeds="seeds")
        if old.get("study") != study:
            raise OpctError(f"{path}: {out} holds the {old.get('study')} study, not {study}; use another --out")
        changed = study_changes(study, old["settings"], settings)
        if changed and not restart_allowed(out, SETTINGS, changed):
            raise OpctError(f"{path}: the {study} study in {out} was run with other settings ({', '.join(changed)}); "
                            f"use another --out, or delete {out} to start again")
        old_seeds = [] if changed else old.get("seeds", [])
    elif out.is_dir() and any(p.name == "rows.jsonl" or p.name.startswith("seed") for p in out.iterdir()):
        raise OpctError(f"{out}: holds a study's results but no {SETTINGS} (written before 2026-12-07, or removed), "
                        f"so its settings cannot be checked; use another --out, or delete {out}")
    write_json_atomic(path, {"study": study, "seeds": list(dict.fromkeys([*old_seeds, *seeds])),
                             "settings": settings}, indent=2)


def main(study_module, argv=None) -> int:
    import dataclasses

    from opct.config import construct, load_config_file, seed_arg
    from opct.errors import OpctError, user_message
    from opct.flags import OnceList, path_arg
    from opct.robustness.cells import UnknownMetric

    name = study_module.__name__.rsplit(".", 1)[-1]
    ap = argparse.ArgumentParser(prog=f"python -m {study_module.__name__}", description=__doc__)
    ap.add_argument("config", type=path_arg)
    ap.add_argument("--seeds", type=seed_arg, nargs="+", action=OnceList, default=[0])
    ap.add_argument("--out", type=path_arg, default=f"runs/robustness-{name}")
    ap.add_argument("--block", default=None, help=f"the key of the study's settings in CONFIG (default: {name}, "
                                                  f"else the whole file)")
    ap.add_argument("--quick", action="store_true", help="the study's smoke-test size (its QUICK)")
    args = ap.parse_args(argv)
    try:
        if len(set(args.seeds)) != len(args.seeds):  # as `opct run`: a seed run twice was counted twice (n_seeds)
            raise OpctError(f"--seeds: must not repeat (got {' '.join(map(str, args.seeds))})")
        block, prefix = study_block(load_config_file(args.config), args.block, name, args.config)
        if args.quick:
            from opct.robustness.runner import _merge

            block = _merge(block, getattr(study_module, "QUICK", {}))
        try:
            cfg = construct(study_module.Config, block, prefix=prefix)
            settings = dataclasses.asdict(cfg)  # what OUT/settings.json records (the model as the file names it)
            if any(f.name == "model" for f in dataclasses.fields(cfg)):  # as the runner: a subject -> its directory
                from opct.experiment.runner import resolve_model

                cfg = dataclasses.replace(cfg, model=resolve_model(cfg.model))
        except OpctError as e:
            raise OpctError(f"{args.config}: {e}") from None
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)  # `--out FILE`: one line naming it, before any seed runs
        check_settings(out, name, settings, args.seeds)
        rows = []
        for seed in args.seeds:
            t0 = time.time()
            try:
                got = study_module.run(cfg, seed, out / f"seed{seed}", print)
            except UnknownMetric as e:  # a field of the file that only the evaluation could check: named in it
                raise OpctError(f"{args.config}: {e.under(prefix)}") from None
            got = check_rows(got, name)
            rows += got
            print(f"{name} seed {seed}: {len(got)} rows in {time.time() - t0:.0f} s")
        from opct.files import write_atomic

        write_atomic(out / "rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        print("\n".join(summarize(rows)))
    except KeyboardInterrupt:  # as `opct`: one line, exit status 130 (it was a traceback until 2026-12-07)
        print("opct: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - sorted by user_message: the user's problem (one line), or a bug
        message = user_message(e)
        if message is None:
            raise
        from opct.cli import _end_progress_bars, _one_line

        _end_progress_bars()
        print(f"opct: error: {_one_line(message)}", file=sys.stderr)
        return 1
    return 0
