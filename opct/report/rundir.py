"""Reading a run directory written by `opct run` (the report reads only these files):

    runs/<name>/experiment.json                   the resolved experiment: name, model, arms, seeds, note, train_* sets
    runs/<name>/<arm>/<seed>/done.json            present only when the cell (pairs, train, eval) is complete
    runs/<name>/<arm>/<seed>/train/metrics.jsonl  one JSON object per optimizer step (not for `base`)
    runs/<name>/<arm>/<seed>/eval/metrics.json    {metric: {"value", "ci_low", "ci_high", "n", "higher_is_better", ...}}
    runs/<name>/<arm>/<seed>/eval/run.json        the eval's settings; `lm_eval_errors`: lm-eval tasks that failed

A cell counts only when done.json is there and its eval/ holds a finished evaluation
(`opct.evals.resume.finished_metrics`: a metrics.json removed or emptied since is no cell measured); every other (arm,
seed) of the experiment is listed as missing with the reason, so a report of a half-finished experiment still builds
and says what it lacks; so is what a complete cell's evaluation failed to measure (`failed`). Files that are present
but malformed are errors naming the file: a report must not silently drop a result.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from opct.errors import DataError, OpctError
from opct.files import dir_there, is_dir_name, read_appended_jsonl, read_json
from opct.resume_check import check_extended
from opct.shapes import read_done


@dataclass
class SeedRun:
    """One complete (arm, seed) cell."""

    arm: str
    seed: int
    dir: Path
    done: dict
    metrics: dict  # metric name -> metric dict (eval/metrics.json)
    curve: list[dict] = field(default_factory=list)  # train/metrics.jsonl, one dict per step; [] for base


@dataclass
class Run:
    dir: Path
    experiment: dict
    arms: list[str]
    seeds: list[int]
    cells: dict  # (arm, seed) -> SeedRun, complete cells only
    missing: list[tuple[str, int, str]]  # (arm, seed, reason)
    failed: list[tuple[str, int, str]] = field(default_factory=list)  # (arm, seed, what of a complete cell failed)

    def seed_runs(self, arm: str) -> list[SeedRun]:
        return [self.cells[(arm, s)] for s in self.seeds if (arm, s) in self.cells]

    def metric_names(self) -> list[str]:
        """Every metric any complete cell has, in first-seen order."""
        seen: dict = {}
        for cell in self.cells.values():
            for k in cell.metrics:
                seen.setdefault(k, None)
        return list(seen)


def _read_json(path: Path, what: str):
    return read_json(path, what)  # a read or decoding problem names the file


def _is_num(x) -> bool:
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))


def read_metrics(path: Path, data=None) -> dict:
    """eval/metrics.json, checked: every entry a dict whose value and interval are numbers (or null). `data`: its
    contents, when the caller has read them."""
    data = _read_json(path, "metrics") if data is None else data
    if not isinstance(data, dict):
        raise OpctError(f"{path}: metrics: expected an object of metric name -> metric, got {type(data).__name__}")
    for name, m in data.items():
        if not isinstance(m, dict) or "value" not in m:
            raise OpctError(f"{path}: metric {name!r}: expected an object with a \"value\" field")
        for k in ("value", "ci_low", "ci_high"):
            if not _is_num(m.get(k)):
                raise OpctError(f"{path}: metric {name!r}: {k} is {m.get(k)!r}, not a number or null")
    return data


def read_curve(path: Path) -> list[dict]:
    """train/metrics.jsonl; [] when absent (the base arm trains nothing)."""
    if not dir_there(path.parent) or not path.exists():
        return []
    rows = []
    for i, row in read_appended_jsonl(path):  # a last line torn by a kill is left out
        if not isinstance(row, dict) or not isinstance(row.get("step"), (int, float)):
            raise DataError(path, i, "step", "each line must be an object with a numeric \"step\"")
        rows.append(row)
    return rows


def _seed_dirs(arm_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in arm_dir.iterdir() if p.is_dir() and p.name.lstrip("-").isdigit()) \
        if arm_dir.is_dir() else []


def check_lists(exp: dict, exp_path) -> None:
    """The arms, seeds, arm_specs and trained of an experiment.json (those it has) are what `opct run` writes: an
    OpctError naming the file and the key otherwise (`opct report` reads them; `opct run` extends them)."""
    check_extended(exp, exp_path, arms="names", seeds="seeds", train="mapping", eval="mapping")
    if "name" in exp and not (isinstance(exp["name"], str) and exp["name"].strip()):  # "# Results: None"
        raise OpctError(f"{exp_path}: name: expected the experiment's name, got {exp['name']!r}")
    arms, seeds = exp.get("arms", []), exp.get("seeds", [])
    bad = [a for a in arms if not is_dir_name(a)]  # '../x' read cells outside the run directory
    if bad:
        raise OpctError(f"{exp_path}: arms: {bad[0]!r} is no arm's folder name (an arm name is one directory)")
    for key, xs in (("arms", arms), ("seeds", seeds)):  # counted twice, one cell made "2/2" and a zero-width interval
        twice = sorted({x for x in xs if xs.count(x) > 1}, key=str)
        if twice:
            raise OpctError(f"{exp_path}: {key}: {', '.join(map(str, twice))} listed twice")
    specs, trained = exp.get("arm_specs"), exp.get("trained")
    if specs is not None and not (isinstance(specs, dict) and all(isinstance(v, dict) for v in specs.values())):
        raise OpctError(f"{exp_path}: arm_specs: expected a mapping of arm name -> its settings, got {specs!r}")
    if isinstance(trained, dict) and not all(isinstance(v, list) for v in trained.values()):
        raise OpctError(f"{exp_path}: trained: expected a mapping of axis -> list of families, got {trained!r}")


def load_run(run_dir) -> Run:
    from opct.evals.resume import finished_metrics

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise OpctError(f"{run_dir}: not a directory; a run directory written by `opct run` is expected"
                        if run_dir.exists() else f"{run_dir}: run directory not found")
    exp_path = run_dir / "experiment.json"
    if not exp_path.exists():
        raise OpctError(f"{exp_path}: not found; is {run_dir} a run directory written by `opct run`?")
    exp = _read_json(exp_path, "experiment")
    if not isinstance(exp, dict):
        raise OpctError(f"{exp_path}: expected a JSON object")
    # arms and seeds come from the experiment; a hand-assembled run without them is read off the folders
    arms = exp.get("arms") or sorted(p.name for p in run_dir.iterdir()
                                     if p.is_dir() and _seed_dirs(p))
    check_lists({**exp, "arms": arms, "seeds": []}, exp_path)
    seeds = exp.get("seeds")
    if seeds is None:
        seeds = sorted({s for a in arms for s in _seed_dirs(run_dir / a)})
    check_lists({**exp, "arms": arms, "seeds": seeds}, exp_path)
    # `opct run` writes one of each at least: a report of no cell was all dashes, and said nothing was missing
    if exp.get("seeds") == []:
        raise OpctError(f"{exp_path}: seeds: an empty list; `opct run` writes the seeds it runs")
    if not arms or not seeds:
        raise OpctError(f"{exp_path}: lists no {'arms' if not arms else 'seeds'}, and {run_dir} holds no cell "
                        f"folders (ARM/SEED) to read them off; a run directory written by `opct run` is expected")

    cells, missing, failed = {}, [], []
    for arm in arms:
        for seed in seeds:
            d = run_dir / arm / str(seed)
            if not dir_there(d, run_dir):  # a file at RUN/arm or RUN/arm/seed is an error, not "not started"
                missing.append((arm, seed, "not started"))
                continue
            if not (d / "done.json").exists():
                missing.append((arm, seed, "incomplete (no done.json)"))
                continue
            done = read_done(d / "done.json", "experiment", f"{arm}/{seed}", arm=arm, seed=seed)
            metrics, why = finished_metrics(d / "eval")
            if why:  # damaged since: not shown as measured (`opct run` evaluates it again)
                missing.append((arm, seed, f"done.json, but {why}"))
                continue
            cells[(arm, seed)] = SeedRun(arm, seed, d, done, metrics, read_curve(d / "train" / "metrics.jsonl"))
            failed += [(arm, seed, why) for why in eval_failures(d / "eval")]
    return Run(run_dir, exp, list(arms), list(seeds), cells, missing, failed)


def eval_failures(eval_dir: Path) -> list[str]:
    """What an evaluation that finished did not measure, from its run.json: the lm-eval tasks that failed (their
    metrics are absent, and an absent row reads like a task never asked for)."""
    from opct.evals.lm_eval_bridge import recorded_errors

    return [f"lm-eval task {task} failed ({msg})" for task, msg in recorded_errors(eval_dir).items()]


@contextmanager
def writing_into(out: Path, what: str, instead: str = "", new: bool = False, file: str = "results.md",
                 writes: str = "the report"):
    """Hold the lock of the folder a report (or the mechanism probe's `file`) is written into (`opct.files.dir_lock`;
    the run directory's is the one `opct run` holds, `what` as it names it): two reports, or a report and the run it
    reads, interleaved their results.md and report.html, and could leave a stale report over the run's own (2026-12).
    A folder that cannot be written (a finished run kept read-only) is refused first ("cannot write `writes`"), saying
    what to do `instead`; with `--out` elsewhere the run is only read, so a read-only run directory still reports. A
    folder that is not there (unless it is `new`: an --out), or a file in its place, is left to the reader and
    writer, which name it."""
    from opct.errors import blocking_file, os_problem
    from opct.files import check_writable, dir_lock

    if not (out.is_dir() or (new and blocking_file(str(out)) is None)):
        yield
        return
    try:
        check_writable(out / file)
    except OSError as e:
        raise OpctError(f"{out}: cannot write {writes}: {os_problem(e)}" + (f"; {instead}" if instead else "")) \
            from None
    with dir_lock(out, what, instead=instead):
        yield
