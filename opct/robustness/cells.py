"""What the robustness studies share: one axis's training pairs, a resumable training cell, a resumable evaluation,
and the long-format rows a study returns (see `opct.robustness`).

Every piece writes under the study's seed directory and is skipped when its output is complete: a pairs file is
written atomically once; a training cell is `opct train`'s run directory (`final/` present = done; otherwise it
resumes from its last checkpoint, exactly); an evaluation is done when its `done.json` exists (written last, holding
the metrics of every axis it ran).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from opct.axes import capability as CAP
from opct.config import ConfigError, construct, validate
from opct.errors import OpctError
from opct.evals.run import EvalConfig
from opct.files import write_json_atomic
from opct.train.config import TrainConfig, check_per_method

# Fields the study sets itself, per cell (an error when a file gives them).
RUNNER_TRAIN_FIELDS = ("method", "model", "pairs", "out", "seed", "resume", "init_adapter", "targets")
RUNNER_EVAL_FIELDS = ("model", "adapter", "out", "seed", "trained", "suite", "items", "axis_items", "pair_options",
                      "prompt_side", "attack")
CAPABILITY = CAP.NAME  # every model is also evaluated on capability, with where its losses come from
CAPABILITY_METRICS = tuple(d.name() for d in (CAP.ACCURACY, CAP.ACCURACY_PARSED, CAP.PARSE_FAIL, CAP.TRUNCATION))


def default_axes() -> list[str]:
    """The first axis of the registry that trains on pairs."""
    from opct.axes import AXES

    return [next(n for n, a in AXES.items() if a.make_pairs is not None)]


def default_metrics(axis: str) -> list[str]:
    """An axis's headline metrics (its report summary) that need no attacker."""
    from opct.axes import AXES

    return [c.metric for c in AXES[axis].summary if "adaptive" not in c.metric]


def study_train() -> TrainConfig:
    """The demo's training settings (opct.experiment.config.demo_train): what moves the organism's behaviour."""
    from opct.experiment.config import demo_train

    return demo_train()


def study_eval() -> EvalConfig:
    return EvalConfig(n=100, attack=False, progress=False)


def check_blocks(cfg) -> None:
    """Build a study Config's `train` / `eval` blocks from their mappings, validate every field (types and ranges,
    `opct.config.validate`), and check methods, axes, trained
    families and per-method overrides (ConfigErrors name the field)."""
    from opct.axes import AXES
    from opct.methods import METHODS

    if isinstance(cfg.train, dict):
        cfg.train = construct(TrainConfig, cfg.train, "train", RUNNER_TRAIN_FIELDS)
    if isinstance(cfg.eval, dict):
        cfg.eval = construct(EvalConfig, cfg.eval, "eval", RUNNER_EVAL_FIELDS)
    validate(cfg)
    for i, m in enumerate(cfg.methods):
        if m not in METHODS:
            raise ConfigError(f"methods[{i}]", f"unknown method {m!r}; known: {', '.join(METHODS)}")
    if len(set(cfg.methods)) != len(cfg.methods):
        raise ConfigError("methods", "must not repeat")
    for m, over in cfg.method_train.items():
        if m not in cfg.methods:
            raise ConfigError(f"method_train.{m}", f"not one of the methods ({', '.join(cfg.methods)})")
        try:
            construct(TrainConfig, {**over}, reserved=RUNNER_TRAIN_FIELDS)
        except ConfigError as e:
            raise e.under(f"method_train.{m}") from None
    check_per_method(cfg.train, cfg.methods, cfg.method_train)
    for i, a in enumerate(cfg.axes):
        if a not in AXES or AXES[a].make_pairs is None:
            pair_axes = [n for n, x in AXES.items() if x.make_pairs is not None]
            raise ConfigError(f"axes[{i}]", f"must be an axis that trains on pairs ({', '.join(pair_axes)}); got {a!r}")
    if len(set(cfg.axes)) != len(cfg.axes):  # each axis's rows would be given twice (`check_rows` refuses them)
        raise ConfigError("axes", "must not repeat")
    for a, fams in cfg.trained.items():
        if a not in cfg.axes:
            raise ConfigError(f"trained.{a}", f"not one of the axes ({', '.join(cfg.axes)})")
        bad = [f for f in fams if f not in AXES[a].families]
        if bad:
            raise ConfigError(f"trained.{a}", f"unknown famil{'y' if len(bad) == 1 else 'ies'} {', '.join(bad)}; "
                                              f"known: {', '.join(AXES[a].families)}")
        if not fams:
            raise ConfigError(f"trained.{a}", "must name at least one family")
        if len(set(fams)) != len(fams):  # as an experiment's: the family's pairs were made twice, with the same ids
            raise ConfigError(f"trained.{a}", "families must not repeat")
    from opct.evals.used import check_used

    try:  # every evaluation reads the study's axes and capability (`evaluate`): a setting for no axis of those
        check_used(dataclasses.replace(cfg.eval, suite=",".join(dict.fromkeys([*cfg.axes, CAPABILITY]))))
    except ConfigError as e:
        raise e.under("eval") from None
    for a, names in cfg.metrics.items():
        if a not in cfg.axes:
            raise ConfigError(f"metrics.{a}", f"not one of the axes ({', '.join(cfg.axes)})")
        if not names:
            raise ConfigError(f"metrics.{a}", "must name at least one metric")
        if len(set(names)) != len(names):
            raise ConfigError(f"metrics.{a}", "must not repeat")
        for j, n in enumerate(names):
            if not n.startswith(a + "."):
                raise ConfigError(f"metrics.{a}[{j}]", f"must be a metric of the {a} axis ({a}.NAME[GROUP]); got {n!r}")
            check_metric_name(a, n, f"metrics.{a}[{j}]")


def check_metric_name(axis: str, name: str, field: str) -> None:
    """A metric name a study config gives, checked when the file is read: its name before any `[group]` is one the
    axis declares (`opct.axes.base.declared_metrics`), and a group is `[key=value,...]`. Whether a group exists (a
    family the probes have) is known only after the evaluation: `check_metrics` checks that. Until 2026-12-07 a
    misspelt name was found only after the base model had been evaluated, in a message without the file."""
    from opct.axes.base import declared_metrics

    base, bracket, group = name.partition("[")
    known = sorted(d.name() for d in declared_metrics(axis))
    if base not in known:
        raise ConfigError(field, f"no metric {name!r} (known: {', '.join(known)}; each may take a [group], e.g. "
                                 f"[split=heldout])")
    parts = group[:-1].split(",") if group.endswith("]") else []
    if bracket and not (parts and all(k and v for k, _, v in (p.partition("=") for p in parts))):
        raise ConfigError(field, f"the group of {name!r} must read [key=value] or [key=value,key=value]")


def trained_of(cfg) -> dict[str, list[str]]:
    """Per axis, the families trained on (the axis's default training set where the config names none)."""
    from opct.axes import AXES

    return {a: list(cfg.trained.get(a) or AXES[a].default_trained()) for a in cfg.axes}


def train_config(cfg, method: str, **runner) -> TrainConfig:
    """The shared `train` block, the method's own overrides, then what the study sets."""
    return dataclasses.replace(cfg.train, **{**cfg.method_train.get(method, {}), **runner}, method=method)


def axis_pairs(axis: str, families: list[str], seed: int, path: Path, per_family=None, benign: bool = True) -> Path:
    """The world's training pairs of one axis (every other family held out and not made), written once."""
    from opct.axes import AXES
    from opct.pairs.make import make_pairs
    from opct.pairs.schema import save_pairs

    if path.exists():
        return path
    a = AXES[axis]
    held = [f for f in a.families if f not in families]
    pairs = make_pairs(axis, a.world_items(seed), families=families, heldout=held, per_family=per_family, seed=seed,
                       include_benign=benign)
    pairs = [p for p in pairs if p.split == "train"]
    if not pairs:
        raise OpctError(f"{axis}: the families {', '.join(families)} make no training pairs")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_pairs(pairs, path)
    return path


def train_cell(tc: TrainConfig, log, what: str) -> tuple[str, str | None]:
    """Train (or resume, or skip when `final/` exists); return (model dir, adapter dir or None) to evaluate."""
    from opct.train.loop import train
    from opct.train.rundir import check_finished

    out = Path(tc.out)
    final = out / "final"
    if final.exists():  # trained by an earlier session: as this cell trains, on these pairs, or refused
        check_finished(out, dataclasses.replace(tc, resume=True), what)
    else:
        tc = dataclasses.replace(tc, resume=out.is_dir())
        log(f"  train {what}: {tc.max_steps} steps x {tc.batch_size}"
            + (f", replay {tc.replay_frac:g} {tc.replay_schedule}" if tc.replay_frac else "")
            + (" (resuming)" if tc.resume else ""))
        train(tc)
    if (final / "adapter_config.json").exists():
        return tc.model, str(final)
    return str(final), None


def check_not_past(run_dir: Path, steps: int, what: str, later: list[Path]) -> None:
    """Before a study continues its training run `run_dir` to `steps` to measure `what`: refuse, naming what to
    remove, when the run has trained past that step already (a result measured there was deleted after the run went
    on). Its earlier checkpoints are gone (the studies keep one), so the result can only be measured again by training
    the run again from its start (exact: the same run), after removing it and the results `later` measured on it."""
    from opct.train.checkpoint import checkpoint_step, latest_checkpoint

    latest = latest_checkpoint(run_dir)  # None for a run not started (no RUN/checkpoints)
    step = checkpoint_step(latest) if latest is not None else None
    if step is not None and step > steps:
        gone = ", ".join(str(p) for p in [run_dir, *later] if p.exists())
        raise OpctError(f"{what}: its result is missing, but the training run it is measured on, {run_dir}, has "
                        f"trained past it (to step {step}; this result is at step {steps}) and keeps no earlier "
                        f"checkpoint; to measure it again, remove {gone}, then run again (the run is trained again "
                        f"from its start: the same run, so the results kept are unchanged)")


def evaluate(model_dir: str, adapter: str | None, axes: list[str], ec: EvalConfig, trained: dict, seed: int,
             out: Path, log) -> dict:
    """Every axis in `axes` and capability on the model (sampled at ec.temperature, the attacker off); the metrics
    of all of them, from `out/done.json` when this evaluation is done already."""
    from opct.evals.run import run_eval
    from opct.policy import load_policy

    done = out / "done.json"
    if done.exists():  # emptied or cut since (a KeyError, or no metric a study names): evaluated again, resumed
        if metrics := _evaluated(done, model_dir, adapter):
            return metrics
    policy = load_policy(model_dir, adapter=adapter, dtype=ec.dtype, device=ec.device, progress=ec.progress)
    metrics: dict = {}
    for axis in [*axes, CAPABILITY]:
        cfg = dataclasses.replace(ec, model=model_dir, adapter=adapter, suite=axis, out=str(out / axis), seed=seed,
                                  trained=trained, attack=False)
        metrics.update(run_eval(policy, cfg, None, log=lambda m: None, resume="checked"))
    write_json_atomic(done, {"model": model_dir, "adapter": adapter, "metrics": metrics})
    return metrics


def _evaluated(done: Path, model_dir: str, adapter: str | None) -> dict | None:
    """The metrics `done` (an evaluation's done.json, `opct.shapes.read_done`) holds for this model and adapter, or
    None when they were removed or emptied since (evaluated again). Its `model` and `adapter` name directories (or a
    subject); one that differs from this evaluation's marks another cell's evaluation (a folder copied, moved or
    linked from it), an error, unless it no longer exists (the study moved as a whole: its paths all changed
    together) or holds the same weights (the same model at another path). Until 2026-12-08 they were type-checked
    only, so a copied evaluation was read as this one's."""
    from opct.shapes import read_done

    rec = read_done(done, "evaluation")
    if not rec.get("metrics"):
        return None
    for key, now in (("model", model_dir), ("adapter", adapter)):
        then = rec[key]
        if then == now or (then is not None and now is not None and _same_model(then, now)):
            continue
        raise OpctError(f"{done}: {key}: {then!r}, but this evaluation is of {now!r}: an evaluation copied, moved "
                        f"or linked from another cell; put it back, or remove {done.parent} to evaluate again")
    return rec["metrics"]


def _same_model(then: str, now: str) -> bool:
    """Whether the model or adapter `then` (recorded) is `now`: the same directory, or the same weights; or `then`
    is gone (no directory and no subject of that name)."""
    from opct.resume_check import _model_folder, weights_fingerprint

    was = _model_folder(then)
    if was is None or was.resolve() == (_model_folder(now) or Path(now)).resolve():
        return True
    fingerprint = weights_fingerprint(then)
    return fingerprint is not None and fingerprint == weights_fingerprint(now)


class UnknownMetric(ConfigError):
    """A metric a study config names that its evaluation did not compute (a group no probe has, an attacker's metric
    with the attacker off): the runner and a study run alone name the file and the study's block in front of it."""


def check_metrics(metrics: dict, names, field: str) -> None:
    """Every metric a study config names (`field`: its list, e.g. `metrics.sycophancy`) must be one the evaluation
    computes: an UnknownMetric naming the field and the index otherwise (the names are checked when the file is read,
    `check_metric_name`; this is what only the evaluation knows)."""
    missing = [(j, n) for j, n in enumerate(names) if n not in metrics]
    if missing:
        j, n = missing[0]
        known = sorted(k for k in metrics if k.split("[")[0] == n.split("[")[0]) or sorted(
            k for k in metrics if k.split(".")[0] == n.split(".")[0])
        raise UnknownMetric(f"{field}[{j}]", f"no metric {n!r} in the evaluation (known: {', '.join(known[:40])})")


def value_of(metrics: dict, name: str) -> float | None:
    m = metrics.get(name)
    v = m.get("value") if isinstance(m, dict) else None
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def row(study: str, method: str, axis: str, condition: str, x, metric: str, value, higher_is_better: bool) -> dict:
    return {"study": study, "method": method, "axis": axis, "condition": condition,
            "x": None if x is None else float(x), "metric": metric,
            "value": None if value is None else float(value), "higher_is_better": bool(higher_is_better)}


def metric_rows(study: str, method: str, axis: str, condition: str, x, metrics: dict, names) -> list[dict]:
    """One row per metric in `names`, with how many of its answers were unparsed, of how many (the report marks
    them; an unparsed answer is never hidden in a rate that counts it as a miss)."""
    from opct.report.unparsed import counts_of

    out = []
    for n in names:
        m = metrics.get(n) or {}
        r = row(study, method, axis, condition, x, n, value_of(metrics, n), bool(m.get("higher_is_better")))
        if isinstance(m, dict) and "n" in m:
            r["unparsed"], r["answers"] = counts_of([metrics], n)
        out.append(r)
    return out
