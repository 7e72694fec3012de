"""Optional bridge to EleutherAI's lm-evaluation-harness for capability on real checkpoints.

    pip install 'opct[lmeval]'       # lm-eval is not a dependency of opct
    opct eval --model DIR [--adapter DIR] --suite capability --lm-eval [--lm-eval-tasks T ...]
              [--lm-eval-include DIR] [--lm-eval-limit N] [--lm-eval-bootstrap-iters N] [--no-lm-eval-chat-template]
              --out RUN

runs the tasks (default: `minerva_math500`, `gpqa_diamond_cot_zeroshot`, `ifeval` — MATH-500, GPQA-Diamond, IFEval,
as in the OPCT paper; they fetch their datasets from the Hugging Face hub, and IFEval needs `langdetect`, MATH
`lm_eval[math]`, so offline only a user's local tasks run: `--lm-eval-include DIR` adds a folder of task YAMLs,
e.g. with `dataset_path: json`) through the harness's own `hf` model backend, loaded once, with the peft adapter if
any. The model's chat template is applied to every request (`apply_chat_template`; `--no-lm-eval-chat-template`
turns it off): an instruction-tuned model asked without its template answers another question.

Each task and measure becomes a metric `capability.lm_eval[task=...,measure=...,filter=...]` (the filter's name
kept, so a task with several filters does not overwrite itself); only the measures the harness scores (those in its
`higher_is_better` table, with that direction) are metrics — a sample length is not a score. The intervals are the
harness's normal approximation (value ± 1.96 stderr), clipped to the measure's range where `RANGES` knows it ([0, 1]
for an accuracy, [-1, 1] for a Matthews correlation, [0, 2] for a Brier score, [1, inf) for a perplexity; never by the
value: an MCC of 0.2 is no rate); `n` is the number of documents evaluated (a group's: those of its tasks that have
the measure). Each document's prompt (as
sent), responses, target and scores go to `RUN/lm_eval_samples/TASK.jsonl` (`write_samples`). A task that fails is
logged and listed in `errors` (run.json's `lm_eval_errors`; a resumed eval runs it again), and the others still run;
a task name the harness does not know is refused before anything runs (`check_tasks`, from
`opct.evals.run.check_config`); one it cannot find is reported with the include folder's YAML files that do not
parse (the harness skips those without a word, so a typo in one reads as "not a registered task"). When `lm_eval` is
not installed the bridge is skipped with a message saying so, and every task asked for is listed in `errors` as not
run (so `opct eval` exits 1 and an experiment's report lists them); it never stops the run.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from pathlib import Path

from opct.errors import OpctError, first_line
from opct.flags import first_repeat

TASKS = ("minerva_math500", "gpqa_diamond_cot_zeroshot", "ifeval")
PREFIX = "capability.lm_eval"


def available() -> bool:
    return importlib.util.find_spec("lm_eval") is not None


SKIP_MESSAGE = ("capability: lm-evaluation-harness bridge skipped: the `lm_eval` package is not installed "
                "(pip install lm-eval, or opct[lmeval], to run " + ", ".join(TASKS) + ")")


def run_lm_eval(model_dir, adapter=None, tasks=TASKS, limit: int | None = None, batch_size: int | str = 8,
                device: str = "cpu", dtype: str = "float32", chat_template: bool = True, include_path=None,
                log=print, errors: dict | None = None, on_task=None, samples_dir=None,
                bootstrap_iters: int = 1000) -> dict:
    """Run the tasks one by one; return opct metrics (empty, after logging `SKIP_MESSAGE`, when the harness is
    missing). A task that raises is logged and recorded in `errors` (task -> message); the others still run.
    `on_task(task, metrics)` is called as each task finishes (to keep its metrics should the run be killed).
    `samples_dir`: where each evaluated (sub)task's documents go, one JSON line each (`write_samples`).
    `bootstrap_iters`: the harness's bootstrap iterations for the stderr of a measure aggregated otherwise than by a
    mean (f1, mcc, bleu: at its default of 100000 each such measure took minutes on 6 documents; a mean's stderr is
    computed directly, whatever this is; 0 computes no stderr at all)."""
    if not available():
        log(SKIP_MESSAGE)
        if errors is not None:  # asked for and not run: said like a failure, so no report reads the absence as a pass
            errors.update(dict.fromkeys(tasks, "not run: the lm_eval package is not installed (pip install "
                                               "'opct[lmeval]')"))
        return {}
    from lm_eval import evaluator
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=str(model_dir), peft=str(adapter) if adapter else None, dtype=dtype, device=device,
              batch_size=batch_size)
    manager = TaskManager(include_path=str(include_path) if include_path else None)
    out: dict = {}
    for task in tasks:
        try:
            results = evaluator.simple_evaluate(model=lm, tasks=[task], limit=limit, task_manager=manager,
                                                apply_chat_template=chat_template, bootstrap_iters=bootstrap_iters,
                                                log_samples=samples_dir is not None)
        except Exception as e:  # noqa: BLE001 - one task's failure (a missing dataset or extra) must not lose the rest
            detail = first_line(e, "")
            message = f"{type(e).__name__}: {detail}" if detail else f"{type(e).__name__} {_raised_at(e)}"
            if include_path and "not a registered task" in message:
                message += "".join(f"; {bad}" for bad in unparseable_yamls(include_path))
            log(f"capability: lm-eval task {task} failed: {message}")
            if errors is not None:
                errors[task] = message
            continue
        done = to_metrics(results)
        if samples_dir is not None:
            write_samples(samples_dir, results.get("samples") or {})
        out.update(done)
        if on_task is not None:
            on_task(task, done)
    return out


def check_tasks(tasks, include_path=None) -> None:
    """An OpctError naming each task the harness does not know (neither a registered task, group or tag, with the
    include folder's, nor a task YAML's path), with close matches and the include folder's YAMLs that do not parse:
    called before any model loads or axis runs, so a typo is not found after the other axes. Indexing the harness's
    tasks takes a few seconds; nothing is checked when `lm_eval` is not installed (the bridge says so when it runs)."""
    if twice := first_repeat(tasks):  # it would run, and count, twice
        raise OpctError(f"lm_eval_tasks: names {twice!r} twice (got {' '.join(tasks)})")
    if not available():
        return
    import difflib

    from lm_eval.tasks._index import TaskIndex

    folder = Path(include_path) if include_path else None
    known = _known_tasks(str(folder) if folder else None, tuple(
        sorted((str(p), p.stat().st_mtime_ns) for p in folder.rglob("*.y*ml")) if folder else ()))
    names = set(known)
    bad = [t for t in tasks if t not in names and not TaskIndex.entry_from_path(Path(t))]
    if not bad:
        if folder and (twice := defined_twice(folder, tasks)):
            raise OpctError(f"lm_eval_tasks: {twice}")
        if lacking := lacking_fields(folder, tasks):
            raise OpctError(f"lm_eval_tasks: {lacking}")
        return
    said = []
    for t in bad:
        close = difflib.get_close_matches(t, known, n=3, cutoff=0.75)
        said.append(f"{t!r}" + (f" (close: {', '.join(close)})" if close else ""))
    unparsed = unparseable_yamls(include_path) if include_path else []
    raise OpctError(f"lm_eval_tasks: not a task lm-eval knows: {'; '.join(said)}"
                    + (f" (with the task YAMLs of {include_path})" if include_path else
                       " (a task of your own needs --lm-eval-include DIR)")
                    + "".join(f"; {u}" for u in unparsed))


@functools.lru_cache(maxsize=4)
def _known_tasks(include_path: str | None, yamls: tuple) -> tuple[str, ...]:
    """The harness's task, group and tag names, with those of `include_path`; cached by the folder's YAML files and
    their times (`yamls`), so an experiment's cells index once and a task file added since is seen."""
    import logging

    from lm_eval.tasks import TaskManager

    quiet = logging.getLogger("lm_eval")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the index warns about every YAML it skips
    try:
        return tuple(TaskManager(include_path=include_path).all_tasks)
    finally:
        quiet.setLevel(level)


SAMPLES_DIR = "lm_eval_samples"  # in an eval's run directory: TASK.jsonl per evaluated (sub)task


def samples_file(folder, task: str) -> Path:
    """`folder/TASK.jsonl`, the task's name made a file name (anything but letters, digits, `._-` becomes `_`)."""
    return Path(folder) / (re.sub(r"[^A-Za-z0-9._-]", "_", task) + ".jsonl")


def write_samples(folder, samples: dict) -> list[Path]:
    """Write the harness's logged samples (task -> documents) as `folder/TASK.jsonl`, one line per document and
    filter: the document's id, the request as sent (`arguments`: the prompt after the chat template), the raw and the
    filtered responses, the target and each measure's score for it — what a score of 0 was given for. Replaces a
    task's file from an earlier run (written atomically); returns the files written."""
    from opct.files import write_atomic

    written = []
    for task, docs in samples.items():
        path = samples_file(folder, task)
        lines = (json.dumps({"task": task, **{k: v for k, v in doc.items()
                                              if k not in ("doc_hash", "prompt_hash", "target_hash")}},
                            default=_jsonable, ensure_ascii=False) + "\n" for doc in docs)
        written.append(write_atomic(path, lines))
    return written


def _jsonable(o):
    """What json cannot write of a logged sample (numpy scalars, sets, request objects) as JSON values."""
    if type(o).__module__ == "numpy" and hasattr(o, "item"):
        return o.item() if getattr(o, "ndim", 0) == 0 else o.tolist()
    return sorted(o, key=str) if isinstance(o, (set, frozenset)) else str(o)


def recorded_errors(eval_dir) -> dict:
    """The lm-eval tasks an evaluation recorded as failed (task -> message: its run.json's `lm_eval_errors`); {} when
    there is no run.json or none failed. A run.json that is not JSON, or not of this shape, is an OpctError naming
    it (a report read a damaged record as "nothing failed")."""
    from opct.shapes import STR, read_checked

    path = Path(eval_dir) / "run.json"
    info = read_checked(path, "eval run", {"lm_eval_errors?": {"*": STR}}) if path.exists() else {}
    return info.get("lm_eval_errors") or {}


def _raised_at(e: BaseException) -> str:
    """Where an exception without a message was raised (a task whose data file is empty failed with a bare
    "StopIteration", no file named; 2026-12-07), and the harness's hint for the commonest cause."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    where = f"(no message; raised in {Path(frames[-1].filename).name}:{frames[-1].lineno}, {frames[-1].name})" \
        if frames else "(no message)"
    return where + ("; is the task's dataset empty?" if isinstance(e, StopIteration) else "")


def _read_yamls(folder):
    """(path, its YAML value, or the YAMLError / OSError reading it raised) for each task YAML under `folder`, in path
    order; lm-eval's own tags, such as `!function`, are read as None."""
    for path in sorted(Path(folder).rglob("*.y*ml")):
        yield path, _read_one(path)


def _read_one(path: Path):
    """A YAML file's value (lm-eval's tags, such as `!function`, read as None), or the YAMLError / OSError reading it
    raised."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506 - SafeLoader
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as e:
        return e


def unparseable_yamls(folder) -> list[str]:
    """`FILE:LINE: problem` for each task YAML under `folder` that is not valid YAML, or whose `include` cannot be
    read (`FILE: include NAME: no such file (PATH)`): the harness skips those without a word. At most 5."""
    import yaml

    bad = []
    for path, value in _read_yamls(folder):
        if isinstance(value, yaml.YAMLError):
            mark = getattr(value, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            problem = getattr(value, "problem", None) or first_line(value, "cannot parse")
            bad.append(f"{path}{line}: not valid YAML ({problem})")
        elif isinstance(value, Exception):
            bad.append(f"{path}: cannot read ({first_line(value, type(value).__name__)})")
        elif isinstance(value, dict) and "include" in value:  # the harness skips it as silently (2026-12-07)
            try:
                _merged(path, value)
            except ValueError as e:
                bad.append(f"{path}: {e}")
        if len(bad) == 5:
            break
    return bad


def defined_twice(folder, tasks) -> str | None:
    """The first of `tasks` that two task YAMLs under `folder` define (`task: NAME`): the harness indexes one of them,
    says so in its log and runs it (2026-12-07: the other file's task was never run, exit 0)."""
    where: dict[str, list[str]] = {}
    for path, value in _read_yamls(folder):
        if isinstance(value, dict) and isinstance(value.get("task"), str):
            where.setdefault(value["task"], []).append(str(path))
    for t in tasks:
        if len(where.get(t, [])) > 1:
            return f"{t!r} is defined by {len(where[t])} task YAMLs of {folder} ({', '.join(where[t])}), and " \
                   f"lm-eval would run one of them; rename the task of the others"
    return None


def _merged(path: Path, value, seen=()) -> dict:
    """A task YAML's keys with those of the files it `include`s (a name, or a list of them, relative to its folder;
    its own keys win), as the harness merges them. An include that cannot be read is a ValueError naming it."""
    if not isinstance(value, dict) or "include" not in value:
        return value if isinstance(value, dict) else {}
    merged: dict = {}
    includes = value["include"] if isinstance(value["include"], list) else [value["include"]]
    for inc in includes:
        target = path.parent / str(inc) if not Path(str(inc)).is_absolute() else Path(str(inc))
        if not target.is_file():
            raise ValueError(f"include {inc}: no such file ({target})")
        if target.resolve() in seen:
            raise ValueError(f"include {inc}: includes itself")
        inner = _read_one(target)
        if isinstance(inner, Exception):
            raise ValueError(f"include {inc}: cannot read it ({first_line(inner, type(inner).__name__)})")
        merged.update({k: v for k, v in _merged(target, inner, (*seen, path.resolve())).items() if k != "task_list"})
    merged.update({k: v for k, v in value.items() if k != "include"})
    return merged


def lacking_fields(folder, tasks) -> str | None:
    """`FILE: task NAME has no dataset_path ...` for the first of `tasks` (a name a YAML under `folder` defines, or a
    YAML's path) whose YAML, with its includes, names no dataset: the harness ran it and failed with "TypeError:
    expected str, bytes or os.PathLike object, not NoneType", naming neither file nor field (2026-12-07). A task of
    its own Python class (`class:`) is not checked."""
    found = [(Path(t), _read_one(Path(t))) for t in tasks if Path(t).suffix in (".yaml", ".yml") and Path(t).is_file()]
    found += [(p, v) for p, v in (_read_yamls(folder) if folder else ())
              if isinstance(v, dict) and isinstance(v.get("task"), str) and v["task"] in tasks]
    for path, value in found:
        try:
            cfg = _merged(path, value)
        except ValueError:
            continue  # the harness does not index it: an unknown task, said as such
        if isinstance(cfg.get("task"), str) and "class" not in cfg and not cfg.get("dataset_path"):
            return (f"{path}: task {cfg['task']!r} has no dataset_path (where lm-eval reads its documents from, e.g. "
                    f"dataset_path: json with dataset_kwargs.data_files)")
    return None


# The range of the harness's measures, by name (lm-eval's own metrics, `lm_eval/api/metrics.py`, and its tasks'):
# the means of 0/1 scores (and IFEval's and TruthfulQA's rates) and an F1 score (sklearn's f1_score) lie in [0, 1], a
# Matthews correlation in [-1, 1]; a Brier score is a mean over documents of the sum over choices of squared errors of
# the normalised choice probabilities, in [0, 2] (lower is better; until 2026-12 it kept a normal interval below 0);
# BLEU and chrF in [0, 100]. Some are bounded on one side only: a perplexity (exp of minus a mean log-likelihood) is at
# least 1, bits per byte and TER at least 0, with no upper bound. Any other measure (a task's own) keeps the normal
# approximation's interval as it is.
INF = float("inf")
RANGES = {**dict.fromkeys(("acc", "acc_norm", "acc_mutual_info", "acc_bytes", "acc_all", "exact_match", "mc1", "mc2",
                           "prompt_level_strict_acc", "prompt_level_loose_acc", "inst_level_strict_acc",
                           "inst_level_loose_acc", "f1"), (0.0, 1.0)),
          "mcc": (-1.0, 1.0), "brier_score": (0.0, 2.0),
          **dict.fromkeys(("bleu", "chrf", "chrf++"), (0.0, 100.0)),
          **dict.fromkeys(("perplexity", "word_perplexity", "byte_perplexity"), (1.0, INF)),
          **dict.fromkeys(("bits_per_byte", "ter"), (0.0, INF))}


def _clip(x: float, measure: str) -> float:
    low, high = RANGES.get(measure, (-INF, INF))
    return min(high, max(low, x))


def metric_range(metric: str) -> tuple[float, float] | None:
    """The range of the bridge's metric `metric` (`capability.lm_eval[task=...,measure=M,...]`): M's in `RANGES`, or
    None for a measure of unknown range (or a name of another metric)."""
    found = re.match(re.escape(PREFIX) + r"\[(?:.*,)?measure=([^,\]]*)", metric)
    return RANGES.get(found.group(1)) if found else None


def _total(results: dict, task: str) -> int:
    """The documents `task` scored: its n-samples entry; a group has none of its own, and its result holds how many
    documents its tasks scored."""
    own = results.get("results", {}).get(task, {}).get("sample_len", 0)
    return results.get("n-samples", {}).get(task, {}).get("effective", own)


def _documents(results: dict, task: str, key: str) -> int:
    """The documents measure `key` (`measure,filter`) of `task` was computed on: a task's own count (`_total`); a
    group's, the sum over its (sub)tasks that have the measure (until 2026-12-07 every measure of a group read the
    group's whole count: acc from 6 documents and exact_match from 12 both said n=18). The whole count where the
    harness names no subtasks."""
    children = (results.get("group_subtasks") or {}).get(task)
    if not children:
        return _total(results, task)
    res = results.get("results", {})
    found = [_documents(results, c, key) for c in children if key in res.get(c, {})]
    return sum(found) if found else _total(results, task)


def to_metrics(results: dict) -> dict:
    """The harness's results dict as opct metric dicts: one per scored (task, measure, filter)."""
    out = {}
    scored = results.get("higher_is_better", {})
    for task, res in results.get("results", {}).items():
        directions = scored.get(task)
        for key, value in res.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or "_stderr" in key or key == "alias":
                continue
            measure, _, filt = key.partition(",")
            if directions is not None and measure not in directions:
                continue  # not a score (e.g. a sample length)
            err = res.get(f"{measure}_stderr,{filt}" if filt else f"{measure}_stderr")
            err = err if isinstance(err, (int, float)) and not isinstance(err, bool) else None
            hib = directions.get(measure, True) if directions is not None else True
            n = int(_documents(results, task, key))
            out[f"{PREFIX}[task={task},measure={measure},filter={filt or 'none'}]"] = {
                "value": float(value),
                "ci_low": None if err is None else _clip(float(value) - 1.96 * err, measure),
                "ci_high": None if err is None else _clip(float(value) + 1.96 * err, measure),
                "n": n, "higher_is_better": bool(hib) if hib is not None else True, "parse_fail": 0, "answers": n}
    return out
