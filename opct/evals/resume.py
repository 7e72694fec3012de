"""Resuming an eval run (`opct eval --resume`, a cell of `opct run` continuing its eval), and what it reads, by
content, so that it measures its remaining axes on what its finished ones were measured on — a model, an adapter or an items file
replaced at the same path between the stop and the resume is refused, as train's RUN/inputs.json refuses other pairs
or weights (the same fingerprints: `opct.resume_check`).

  eval_inputs(cfg)                        {input: fingerprint}, recorded in run.json's `inputs`
  check_inputs(out, cfg, saved, inputs)   a resume whose inputs differ from those run.json recorded is an error
  resumed(out, cfg, ...)                  what an earlier run into `out` finished, checked (settings, inputs)
  check_resume(cfg, attack_cfg, resume)   the same, read before any model is loaded (`opct eval`)
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from opct.errors import OpctError

EVAL_FILES = ("records.jsonl", "metrics.json", "metrics.txt")  # what a run writes beside its run.json


def eval_inputs(cfg) -> dict[str, str]:
    """What the run reads, by content, as train's RUN/inputs.json records it (`opct.resume_check`): a fingerprint of
    the weights of the model and the adapter and of their configuration, tokenizer and chat template files
    (`model.files`, `adapter.files`), the SHA-256 of the items files of the axes it runs (`items`,
    `axis_items.AXIS`), and with lm-eval a fingerprint of the include folder and of each task given as a YAML file
    (`lm_eval_tasks.PATH`). Recorded in run.json's `inputs`; a resume must find the same contents at those paths.
    A path with nothing there is left out (its reader names the problem)."""
    from opct import files
    from opct.evals.run import suite_names
    from opct.resume_check import files_fingerprint, folder_fingerprint, weights_fingerprint

    out = {}
    for field in ("model", "adapter"):
        path = getattr(cfg, field)
        if path and (field == "model" or Path(path).is_dir()):
            if fp := weights_fingerprint(path):
                out[field] = fp
            if fp := files_fingerprint(path):  # its own key: a run.json before 2026-12-07 lacks it
                out[f"{field}.files"] = fp
    names = suite_names(cfg.suite)
    data = {"items": cfg.items} if cfg.items else \
        {f"axis_items.{a}": cfg.axis_items[a] for a in names if a in cfg.axis_items}
    if cfg.lm_eval:
        data.update({f"lm_eval_tasks.{t}": t for t in cfg.lm_eval_tasks if Path(t).is_file()})
        if cfg.lm_eval_include and (fp := folder_fingerprint(cfg.lm_eval_include)):
            out["lm_eval_include"] = fp
    for key, path in data.items():
        if Path(path).is_file():
            try:
                out[key] = files.sha256(path)
            except OSError as e:
                raise OpctError(f"{path}: {files.os_problem(e)}") from None
    return out


def _input_named(cfg, key: str) -> str:
    """An `eval_inputs` key as the user gave it: `--adapter DIR`, `axis_items.sycophancy FILE`, ..."""
    field, _, axis = key.partition(".")
    if field == "axis_items":
        return f"axis_items.{axis} {cfg.axis_items[axis]}"
    if field == "lm_eval_tasks":
        return f"--lm-eval-tasks {axis}"
    if axis == "files":
        return f"--{field} {getattr(cfg, field)} (its config, tokenizer or chat template)"
    return f"--{field.replace('_', '-')} {getattr(cfg, field)}"


def check_inputs(out: Path, cfg, saved: dict, inputs: dict) -> list[str]:
    """Refuse to resume a run whose inputs (`eval_inputs`) hold other contents than those run.json recorded: its
    finished axes were measured on those. A run.json written before inputs were recorded resumes unchecked, with a
    note saying so. The lm-eval task YAMLs (--lm-eval-include, task files) may change: they are returned, and the
    resumed run measures every lm-eval task again (a failed task's YAML, fixed, was refused as "other contents",
    though `retry_failed_lm_eval` promised to run it again; 2026-12-07)."""
    import sys

    run_json = out / "run.json"
    if "inputs" not in saved:
        print(f"opct: note: {run_json} records no fingerprints of its inputs (a run started before 2026-12-06): "
              f"the model, adapter and items its finished axes were measured on are not checked against these",
              file=sys.stderr)
        return []
    if not isinstance(saved["inputs"], dict):  # read as "nothing recorded", any model would continue the run
        raise OpctError(f"{run_json}: inputs: not a record of the run's inputs (expected a JSON object); put the "
                        f"original back, or start a new run")
    from opct.resume_check import changed_inputs

    changed = changed_inputs(saved["inputs"], inputs)
    tasks = [k for k in changed if k == "lm_eval_include" or k.startswith("lm_eval_tasks.")]
    changed = [k for k in changed if k not in tasks]
    if changed:
        # a model or adapter whose weights and files both changed is named once ("--adapter X, --adapter X (its
        # config, ...)" until 2026-12-07)
        both = {k for k in changed if k + ".files" in changed}
        named = [_input_named(cfg, k) + (" (its weights, and its config, tokenizer or chat template)" if k in both
                                         else "") for k in changed if k.removesuffix(".files") not in both or k in both]
        names = ", ".join(named)
        one = len(named) == 1
        raise OpctError(f"{out}: cannot resume: {names} {'holds' if one else 'hold'} other contents than when the "
                        f"run started ({'its fingerprint differs' if one else 'their fingerprints differ'} from "
                        f"{run_json}'s inputs); its finished "
                        f"axes were measured on the earlier contents: put the original back, or evaluate again from "
                        f"the start (another --out, or remove {out})")
    return tasks


LM_EVAL_CHANGED = "lm_eval_changed"  # a resumed run's lm-eval task YAMLs changed since it started (`resumed`)

# EvalConfig fields that may differ when an eval run is resumed (they change no record or metric)
RESUMABLE = ("out", "progress", "log_with")


def attack_settings(cfg, attack_cfg) -> dict | None:
    """The attacker's settings as a run records them (None when it does not run)."""
    return asdict(attack_cfg) if attack_cfg is not None and cfg.attack else None


def resumed(out: Path, cfg, attack_cfg, names: list[str], resume: bool | str,
            inputs: dict | None = None):
    """What an earlier run into `out` finished: (axes, their records, metrics, seconds, info). Without `resume`
    that run is an error (it would be overwritten), as are other settings than its own (unless `resume` is
    "checked": the caller compared them, as an experiment does, whose run directory may have moved) and, either way,
    inputs with other contents than those it recorded (`inputs`: `eval_inputs(cfg)`, when the caller has them). Each
    axis draws from its own seed, so the axes run after the finished ones give what an uninterrupted run would
    have."""
    from opct.evals.run import EvalConfig
    from opct.files import read_json
    from opct.pairs.schema import read_jsonl
    from opct.report.rundir import read_metrics
    from opct.resume_check import changes

    saved = read_json(out / "run.json", "eval run")
    done = saved.get("done") if isinstance(saved, dict) else None
    if not isinstance(done, list) or not isinstance(saved.get("config"), dict):
        raise OpctError(f"{out / 'run.json'}: not an eval run's run.json (no config and done axes)")
    if not resume:
        raise OpctError(f"{out}: already holds an eval run ({len(done)} of its axes done); pass --resume to continue "
                        "it, or choose another --out")
    now = {"config": asdict(cfg), "attack_config": attack_settings(cfg, attack_cfg)}
    keys = [k for k in now if k in saved]  # a run.json written before attack_config was: its config only
    changed = changes({k: saved[k] for k in keys}, {k: now[k] for k in keys},
                      may_change=tuple(f"config.{f}" for f in RESUMABLE), defaults={"config": asdict(EvalConfig())})
    if changed and resume != "checked":
        raise OpctError(f"{out}: cannot resume an eval run with other settings; changed: {', '.join(changed)}")
    tasks_changed = check_inputs(out, cfg, saved, eval_inputs(cfg) if inputs is None else inputs)
    done = [n for n in names if n in done]
    for name in ("records.jsonl", "metrics.json"):  # written with run.json, before it: removed since
        if not (out / name).exists():
            raise OpctError(f"{out / name}: missing, though {out / 'run.json'} lists {len(done)} axes as done; the "
                            f"run's files are damaged: evaluate again from the start (another --out, or remove {out})")
    records = []
    for line, r in read_jsonl(out / "records.jsonl"):
        if not isinstance(r, dict):
            raise OpctError(f"{out / 'records.jsonl'}:{line}: not a record (a JSON object)")
        if r.get("suite") in done:
            records.append(r)
    metrics = read_json(out / "metrics.json", "metrics")
    if not isinstance(metrics, dict):
        raise OpctError(f"{out / 'metrics.json'}: not an eval run's metrics (a JSON object)")
    read_metrics(out / "metrics.json", metrics)  # each a value with its interval: they are printed and reported
    metrics = {k: v for k, v in metrics.items() if k.split(".")[0] in done}
    for axis in done:  # a finished axis is kept as it is: it must all be there (a file emptied or cut is not)
        for name, found in (("records.jsonl", any(r.get("suite") == axis for r in records)),
                            ("metrics.json", any(k.split(".")[0] == axis for k in metrics))):
            if not found:
                raise OpctError(f"{out / name}: holds nothing of axis {axis}, which {out / 'run.json'} lists as done; "
                                f"the run's files are damaged: evaluate again from the start (another --out, or "
                                f"remove {out})")
    info = {k: v for k, v in saved.items() if k not in ("config", "attack_config", "seconds", "done", "inputs")}
    if tasks_changed:  # read by `opct.axes.capability.retry_failed_lm_eval`, which runs every task again
        info[LM_EVAL_CHANGED] = [_input_named(cfg, k) for k in tasks_changed]
    seconds = saved.get("seconds") if isinstance(saved.get("seconds"), dict) else {}  # timings only: not checked
    return done, records, metrics, dict(seconds), info


def check_resume(cfg, attack_cfg, resume: bool, inputs: dict | None = None) -> tuple | None:
    """What a run already in `cfg.out` finished (None: no run there), read before any model is loaded, with the
    errors `run_eval` would raise about it; pass it to `run_eval` as `earlier` so the files are read once.
    `inputs`: `eval_inputs(cfg)`, when the caller has them (and passes the same to `run_eval`: the model's files
    are then hashed once)."""
    from opct.modeldir import refuse_model_dir

    out = Path(cfg.out)
    refuse_model_dir(out, "an eval run")  # a model's or adapter's folder: the run's files would mix with its own
    if (out / "run.json").exists():
        from opct.evals.run import suite_names

        return resumed(out, cfg, attack_cfg, suite_names(cfg.suite), resume, inputs)
    # an eval's files without its run.json (another tool's, or a run whose run.json was removed): the run would
    # replace them, and there is nothing to resume from
    found = [name for name in EVAL_FILES if (out / name).exists()]
    if found:
        raise OpctError(f"{out}: holds {', '.join(found)} but no run.json (not an eval run opct can resume), and an "
                        f"eval run would replace {'it' if len(found) == 1 else 'them'}; choose another --out, or "
                        "move them away")
    return None


def finished_metrics(out: Path) -> tuple[dict | None, str | None]:
    """(the metrics, None) of the finished evaluation in the eval run directory `out`, or (None, why it holds none).
    A cell's done.json vouches for its evaluation; a metrics.json removed, emptied or cut since was read as a cell
    measured (a report's dashes, a rerun that skipped it, exit 0). Needed: a metrics.json with metrics; with a
    run.json (an `opct eval` run's), some metric of every axis it lists as done. A metrics.json there but malformed
    is an OpctError naming it."""
    from opct.files import dir_there, read_json
    from opct.report.rundir import read_metrics

    if not dir_there(out) or not (out / "metrics.json").exists():
        return None, f"no {out.name}/metrics.json"
    metrics = read_metrics(out / "metrics.json")
    if not metrics:
        return None, f"{out.name}/metrics.json holds no metrics"
    if not (out / "run.json").exists():  # metrics assembled by hand or by another tool: they are what there is
        return metrics, None
    saved = read_json(out / "run.json", "eval run")
    done = saved.get("done") if isinstance(saved, dict) else None
    # the axes run.json lists, not today's registry (an older run did not have every axis); run.json's shape is its
    # readers' to check (`opct.report.rundir.eval_failures`, `resumed`)
    for axis in done if isinstance(done, list) else []:
        if not any(k.split(".")[0] == axis for k in metrics):
            return None, f"{out.name}/metrics.json holds nothing of axis {axis}"
    return metrics, None
