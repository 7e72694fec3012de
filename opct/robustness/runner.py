"""`run_robustness(config)`: every study of a robustness file x every seed, resumable; then the aggregate and report.

    OUT/NAME/study.json                  the resolved settings (every study's Config); a rerun with other settings
                                         is refused (adding studies or seeds is allowed)
    OUT/NAME/<study>/seed<S>/...         what the study writes for seed S (its cells, each resumable)
    OUT/NAME/<study>/seed<S>/rows.json   written last: the seed's rows and seconds (a cell with it is skipped)
    OUT/NAME/robustness.json             every aggregated row (mean, 95% t-interval over seeds, n)
    OUT/NAME/results.md, report.html     tables and curves (opct.robustness.report)
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from opct.config import SEED, ConfigError, changes, construct, option, restart_allowed, validate
from opct.errors import OpctError
from opct.files import dir_there, is_dir_name, read_json, write_json_atomic
from opct.resume_check import check_extended
from opct.shapes import INT, LIST, NUM, OBJECT, STR, read_checked

KIND = "robustness"
KEY = ("study", "method", "axis", "condition", "x", "metric")
ROW_FIELDS = {"study": str, "method": str, "axis": str, "condition": str, "x": (float, type(None)), "metric": str,
              "value": (float, type(None)), "higher_is_better": bool}
# A row read off an evaluation's metric may also carry how many of the answers behind it were unparsed, of how many
# (`opct.report.unparsed.counts_of`); the report marks the cell "(u/N unparsed)", summed over seeds.
COUNT_FIELDS = ("unparsed", "answers")


def default_studies() -> dict[str, dict]:
    return {"replay": {}, "washout": {}}


@dataclass
class RobustnessConfig:
    CONFIG_LABEL: ClassVar[str] = "robustness"

    kind: str = option(KIND, "what the file is: `robustness` (an `opct run` file without it is an experiment)",
                       choices=[KIND])
    name: str = option("robustness", "study name; everything is written under OUT/NAME/ (--quick adds -quick)")
    model: str = option("default", "a subject ('default', the shipped organism; 'test'; ...) or a model directory",
                        nonempty=True)
    out: str = option("runs", "root directory", nonempty=True)
    seeds: list[int] = option([0, 1, 2], "seeds; every study runs once per seed", nonempty=True, **SEED)
    studies: dict[str, dict] = option(help="study name (opct.robustness.studies.STUDIES) -> its Config fields",
                                      factory=default_studies, nonempty=True)
    quick: bool = option(False, "smaller sizes (each study's QUICK: fewer steps, doses and items)")
    threads: int = option(0, "torch CPU threads (0: opct's default for the model's size)", ge=0, threads=True)
    progress: bool = option(True, "progress bars: the study's own and its training runs' (--no-progress: none, "
                                  "transformers' loading bars included; the evaluations run without)")
    note: str = option("", "free text shown at the top of the report")
    report: bool = option(True, "write results.md and report.html at the end")

    def __post_init__(self):
        from opct.robustness.studies import STUDIES

        validate(self)
        if not is_dir_name(self.name):
            raise ConfigError("name", f"must be a non-empty directory name (got {self.name!r})")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("seeds", "must not repeat")
        self.built = {}
        self.source = "robustness file"  # the file it was read from (load_robustness), to name in a late error
        for name, block in self.studies.items():
            if name not in STUDIES:
                raise ConfigError("studies", f"unknown study {name!r}; known: {', '.join(STUDIES)}")
            block = {} if block is None else block
            if not isinstance(block, dict):
                raise ConfigError(f"studies.{name}", f"must be a mapping of the study's settings (got {block!r})")
            quick = getattr(STUDIES[name], "QUICK", {}) if self.quick else {}
            self.built[name] = construct(STUDIES[name].Config, _merge(block, quick), prefix=f"studies.{name}",
                                         reserved=("model",))

    def run_name(self) -> str:
        return self.name + ("-quick" if self.quick and not self.name.endswith("-quick") else "")


def _merge(block: dict, quick: dict) -> dict:
    """The file's block with QUICK's values on top (mappings merged one level down)."""
    out = dict(block)
    for k, v in quick.items():
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_robustness(path, args=None, **overrides) -> RobustnessConfig:
    from opct.config import build_config

    cfg = build_config(RobustnessConfig, args, path, None, **overrides)
    cfg.source = str(path)
    return cfg


def check_rows(rows, where: str, study: str | None = None) -> list[dict]:
    """A study's rows of one seed, checked against the contract (a study bug is reported naming the study): the
    fields and their types, counts, each row's key (study, method, axis, condition, x, metric) once, and its study
    `study` when given. (Until 2026-12-08 the runner checked no key twice, and a study run alone checked the rest
    with asserts, a bare AssertionError traceback: one check now serves both.)"""
    if not isinstance(rows, list):
        raise OpctError(f"{where}: run() must return a list of rows (got {type(rows).__name__})")
    out, seen = [], {}
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or not set(ROW_FIELDS) <= set(r) <= {*ROW_FIELDS, *COUNT_FIELDS}:
            raise OpctError(f"{where}: row {i}: must have exactly the keys {', '.join(ROW_FIELDS)} (and optionally "
                            f"{' and '.join(COUNT_FIELDS)}) (got {r!r})")
        r = dict(r)
        for k in COUNT_FIELDS:
            if k in r and (not isinstance(r[k], int) or isinstance(r[k], bool) or r[k] < 0):
                raise OpctError(f"{where}: row {i}: {k}: must be a count >= 0 ({r[k]!r})")
        if "unparsed" in r and r["unparsed"] > r.get("answers", -1):
            raise OpctError(f"{where}: row {i}: unparsed ({r['unparsed']}) must come with answers at least as many "
                            f"(got {r.get('answers')!r})")
        for k in ("x", "value"):
            if isinstance(r[k], int) and not isinstance(r[k], bool):
                r[k] = float(r[k])
            if isinstance(r[k], float) and not math.isfinite(r[k]):
                r[k] = None
        for k, t in ROW_FIELDS.items():
            if not isinstance(r[k], t) or (t is not bool and isinstance(r[k], bool)):
                raise OpctError(f"{where}: row {i}: {k}: wrong type ({r[k]!r})")
        if study is not None and r["study"] != study:
            raise OpctError(f"{where}: row {i}: study: {r['study']!r}, but the rows are study {study!r}'s")
        key = tuple(r[k] for k in ROW_KEY)
        if key in seen:
            raise OpctError(f"{where}: row {i}: the same {', '.join(ROW_KEY)} as row {seen[key]} ({key!r}): a result "
                            f"given twice")
        seen[key] = i
        out.append(r)
    return out


ROW_KEY = ("study", "method", "axis", "condition", "x", "metric")  # what one row of a seed is the result of


# The studies' metrics that are no rate: ratios and counts, whose interval is never clipped (a study adding one lists
# its name's start here). Until 2026-12-07 only the wash fraction was: a reasons `transfer` (held-out gain / train
# gain, unbounded) or a backdoor count whose values fell in [0, 1] in every seed had its interval clipped to [0, 1].
UNBOUNDED = ("wash_fraction", "transfer", "pairs_", "admission_")


def metric_range(metric: str, values: list[float]):
    """The range a robustness metric's interval is clipped to: [0, 1] for rates (every value in [0, 1]), [-1, 1] for
    a difference of two rates (BRR, PAR); None (not clipped) for the ratios and counts of `UNBOUNDED`."""
    from opct.report.aggregate import value_range

    return None if metric.startswith(UNBOUNDED) else value_range(metric, values)


def aggregate(per_seed: dict[int, list[dict]]) -> list[dict]:
    """Rows over seeds -> one row per KEY: mean and 95% Student-t interval over the seeds where the value is defined
    (no interval from one seed), n (defined seeds) and n_undefined. Rates (every value in [0, 1]) are clipped to
    [0, 1], a difference of two rates (BRR, PAR) to [-1, 1]; other values (a wash fraction) are not. Where the rows
    count their unparsed answers (COUNT_FIELDS), the counts are summed over the seeds."""
    from opct.report.aggregate import t_interval

    groups: dict[tuple, dict] = {}
    for seed, rows in sorted(per_seed.items()):
        for r in rows:
            k = tuple(r[f] for f in KEY)
            g = groups.setdefault(k, {"higher_is_better": r["higher_is_better"], "values": {}, "counts": None})
            g["values"][seed] = r["value"]
            if "answers" in r:  # summed over the seeds that counted them
                c = g["counts"] or [0, 0]
                g["counts"] = [c[0] + r.get("unparsed", 0), c[1] + r["answers"]]
    out = []
    for k, g in groups.items():
        vals = [v for v in g["values"].values() if v is not None]
        n = len(vals)
        mean = lo = hi = None
        if n:
            mean, lo, hi = t_interval(vals, *(metric_range(k[5], vals) or (None, None)))
        out.append({**dict(zip(KEY, k)), "higher_is_better": g["higher_is_better"], "mean": mean, "ci_low": lo,
                    "ci_high": hi, "n": n, "n_undefined": len(g["values"]) - n,
                    "seeds": sorted(g["values"]), "values": [g["values"][s] for s in sorted(g["values"])],
                    **(dict(zip(COUNT_FIELDS, g["counts"])) if g["counts"] else {})})
    return out


# What a study's settings may change on a rerun: its progress bars, and the blocks' model, out and seed (the study
# sets them itself, per cell)
MAY_CHANGE = ("progress", "train.progress", "eval.progress") + tuple(
    f"{b}.{f}" for b in ("train", "eval") for f in ("model", "out", "seed"))


def study_changes(name: str, saved: dict, now: dict, may_change=MAY_CHANGE) -> list[str]:
    """What differs in one study's settings (its Config as a mapping), field by field; inside its `train` / `eval`
    blocks, key by key. A field added to the study's Config, TrainConfig or EvalConfig after the run started counts
    as its default (so a run started before a new option existed resumes). Also a study run alone
    (`opct.robustness.standalone`) is checked with it."""
    from opct.config import block_defaults, defaults_of
    from opct.evals.run import EvalConfig
    from opct.robustness.studies import STUDIES
    from opct.train.config import TrainConfig

    module = STUDIES.get(name)
    defaults = defaults_of(module.Config) if module is not None and hasattr(module, "Config") else {}
    return changes(saved, now, may_change, {**defaults, **block_defaults(saved, train=TrainConfig, eval=EvalConfig)})


def _study_changes(name: str, saved: dict, now: dict) -> list[str]:
    """`study_changes` of a study of a robustness file, named under `studies.NAME.` (the runner sets its model)."""
    return [f"studies.{name}.{c}" for c in study_changes(name, saved, now, ("model", *MAY_CHANGE))]


def _previous(root: Path, resolved: dict) -> dict:
    path = root / "study.json"
    if not path.exists():
        return {}
    old = read_json(path, "robustness study")
    if not isinstance(old, dict) or old.get("kind") != KIND:
        raise OpctError(f"{path}: not a robustness study's settings; use another --name or delete {root}")
    check_extended(old, path, seeds="seeds", studies="mappings")  # what this run extends
    changed = changes({k: v for k, v in old.items() if k != "studies"},
                      {k: v for k, v in resolved.items() if k != "studies"},
                      ("seeds", "name", "out", "note", "report", "threads", "progress", "model_dir"))
    for s, c in resolved["studies"].items():
        if s in old.get("studies", {}):
            changed += _study_changes(s, old["studies"][s], c)
    if restart_allowed(root, path.name, changed):
        return {}
    if changed:
        raise OpctError(f"{path}: the study in {root} was started with other settings ({', '.join(changed)}); use "
                        f"another --name, or delete {root} to start again")
    return old


def _without_bars(study, progress: bool):
    """A study's Config as it runs: without `progress`, its own `progress` (the studies that build their training
    runs themselves) and its `train` and `eval` blocks' are off."""
    if progress:
        return study
    names = {f.name for f in dataclasses.fields(study)}
    changes = {"progress": False} if "progress" in names else {}
    for block in ("train", "eval"):
        if block in names and dataclasses.is_dataclass(getattr(study, block)):
            changes[block] = dataclasses.replace(getattr(study, block), progress=False)
    return dataclasses.replace(study, **changes)


def run_robustness(cfg: RobustnessConfig, log=print) -> Path:
    """Run every (seed, study) cell not already done; write robustness.json; return the run directory."""
    from tqdm.auto import tqdm

    from opct.experiment.runner import resolve_model
    from opct.policy import count_parameters, cpu_threads
    from opct.robustness.studies import STUDIES
    from opct.robustness.cells import UnknownMetric, train_config
    from opct.train.loop import check_samplers

    # before any cell runs: every method of a study that trains from a shared `train` block (replay, washout)
    check_samplers({f"studies.{n} ({m})": train_config(c, m) for n, c in cfg.built.items()
                    if hasattr(c, "train") and hasattr(c, "methods") for m in c.methods})
    root = Path(cfg.out) / cfg.run_name()
    from opct.run_inputs import check_not_nested

    check_not_nested(root)  # before anything is written into another run's folder
    model = resolve_model(cfg.model)
    configs = {n: _without_bars(dataclasses.replace(c, model=model) if any(f.name == "model" for f in
                                                                           dataclasses.fields(c)) else c, cfg.progress)
               for n, c in cfg.built.items()}
    resolved = {"kind": KIND, "name": cfg.run_name(), "model": cfg.model, "model_dir": model, "quick": cfg.quick,
                "seeds": cfg.seeds, "note": cfg.note, "studies": {n: dataclasses.asdict(c) for n, c in configs.items()}}
    old = _previous(root, resolved)
    resolved["seeds"] = list(dict.fromkeys([*old.get("seeds", []), *cfg.seeds]))
    resolved["studies"] = {**old.get("studies", {}), **resolved["studies"]}
    from opct.evals.run import EvalConfig
    from opct.run_inputs import check_run_inputs, experiment_inputs

    # the model the cells already run were trained from (the studies read the world's items): no other at its path
    check_run_inputs(root, *experiment_inputs(model, EvalConfig()), continuing=bool(old))
    write_json_atomic(root / "study.json", resolved, indent=2)
    with cpu_threads(count_parameters(model), "cpu", cfg.threads or None):

        cells = [(seed, name) for seed in cfg.seeds for name in configs]
        t_start = time.time()
        bar = tqdm(total=len(cells), desc="robustness", unit="cell", dynamic_ncols=True, disable=not cfg.progress)
        say = tqdm.write
        for seed, name in cells:
            d = root / name / f"seed{seed}"
            if (d / "rows.json").exists():
                say(f"{name} seed {seed}: done already, skipped")
                bar.update(1)
                continue
            say(f"{name} seed {seed} ({time.time() - t_start:.0f} s into the run)")
            t0 = time.time()
            try:
                rows = check_rows(STUDIES[name].run(configs[name], seed, d, lambda m: say(m)), f"study {name}",
                                 name)
            except UnknownMetric as e:  # a field of the file that only the evaluation could check: named in it
                raise OpctError(f"{cfg.source}: {e.under(f'studies.{name}')}") from None
            seconds = round(time.time() - t0, 1)
            write_json_atomic(d / "rows.json", {"study": name, "seed": seed, "seconds": seconds, "rows": rows})
            say(f"{name} seed {seed}: {len(rows)} rows in {seconds:.0f} s")
            bar.update(1)
        bar.close()
        write_aggregate(root)
        log(f"robustness {cfg.run_name()}: {len(cells)} cells in {root} ({time.time() - t_start:.0f} s this run)")
        return root


def load_rows(root: Path) -> tuple[dict, dict[str, dict[int, list[dict]]], dict]:
    """(study.json, {study: {seed: rows}}, {(study, seed): seconds}) of every finished cell under `root`."""
    settings = read_checked(root / "study.json", "robustness study", STUDY_SHAPE)
    rows: dict[str, dict[int, list[dict]]] = {}
    seconds = {}
    for name in settings.get("studies", {}):
        for seed in settings.get("seeds", []):
            cell = read_cell(root, name, seed)
            if cell is not None:
                where = str(root / name / f"seed{seed}" / "rows.json")
                rows.setdefault(name, {})[seed] = check_rows(cell["rows"], where, name)
                seconds[(name, seed)] = cell.get("seconds")
    return settings, rows, seconds


# What the report reads of study.json and of a cell's rows.json (opct/shapes.py; the rows are `check_rows`'s)
# (`opct run` writes every one of them; a report of `{}` read "model: None (None)", rc 0)
STUDY_SHAPE = {"seeds": [INT], "studies": {"*": OBJECT}, "name?": STR, "model?": (None, STR),
               "model_dir?": (None, STR), "note?": (None, STR)}
CELL_SHAPE = {"rows": LIST, "seconds?": (None, NUM)}


def read_cell(root: Path, name: str, seed: int) -> dict | None:
    """A finished cell's rows.json, checked; None when the cell has not finished (a file where its folder belongs is
    an error)."""
    if not is_dir_name(name):  # '../x' read rows outside the run
        raise OpctError(f"{root / 'study.json'}: studies: {name!r} is no study's folder name")
    d = root / name / f"seed{seed}"
    if not dir_there(d, root) or not (d / "rows.json").exists():
        return None
    return read_checked(d / "rows.json", "study rows", CELL_SHAPE)


def write_aggregate(root: Path, out: Path | None = None) -> list[dict]:
    """robustness.json into `out` (default the run `root`, which is only read otherwise: `opct report --out`)."""
    settings, rows, _ = load_rows(root)
    agg = [r for name in rows for r in aggregate(rows[name])]
    kept = {k: v for k, v in settings.items() if k != "studies"}
    write_json_atomic(Path(out or root) / "robustness.json", {"settings": kept, "rows": agg}, indent=1)
    return agg
