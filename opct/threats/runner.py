"""`run_threats(config)`: per seed, the base model, the benign-SFT control and every threat x method cell, each
trained (where it gets a signal) and evaluated on every axis; resumable cell by cell; then `cross_threat.json`.

A cell is done when its `done.json` exists (written last, holding the evaluation's metrics); an interrupted
training run resumes from its last checkpoint (`opct train --resume`). The resolved settings are in threats.json;
rerunning with other settings is refused (seeds, threats and methods may be added: finished cells stay valid).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from opct.config import block_defaults, changes, restart_allowed
from opct.errors import OpctError
from opct.files import read_json, write_json_atomic
from opct.resume_check import check_extended
from opct.threats.config import KIND, ThreatsConfig, no_signal_methods

SETTINGS = "threats.json"
CONTROL = "control"
BASE = "base"
# Settings that may differ on a rerun: they do not change any finished cell.
RESUMABLE = ("seeds", "threats", "methods", "name", "out", "note", "report", "threads", "progress", "model_dir",
             "trained", "method_train")
NO_SIGNAL = "no signal by construction"


def resolved(cfg: ThreatsConfig, model_dir: str) -> dict:
    out = dataclasses.asdict(cfg)
    out.update(kind=KIND, name=cfg.run_name(), model_dir=model_dir,
               trained={t: cfg.families(t) for t in cfg.threats}, eval_trained=cfg.eval_trained(),
               no_signal={t: [m for m in cfg.methods if m in no_signal_methods(t)] for t in cfg.threats})
    return out


def _previous(root: Path, now: dict) -> dict:
    """threats.json of an earlier run in `root` ({} if none); an error naming what changed if its settings differ."""
    path = root / SETTINGS
    if not path.exists():
        return {}
    old = read_json(path, "threats run")
    if not isinstance(old, dict) or old.get("kind") != KIND:
        raise OpctError(f"{path}: not a threats run's settings; use another --name or delete {root}")
    check_extended(old, path, seeds="seeds", threats="names", methods="names", trained="mapping",
                   method_train="mapping", no_signal="mapping")  # what this run extends
    from opct.evals.run import EvalConfig
    from opct.train.config import TrainConfig

    # `changes` names a block's field by its path (train.lr); a field added after the run started is its default
    changed = changes(old, now, RESUMABLE + ("no_signal", "eval_trained", "train.log_with", "train.progress",
                                             "eval.log_with", "eval.progress"),
                      block_defaults(old, train=TrainConfig, eval=EvalConfig))
    for t, fams in now["trained"].items():  # a threat already run keeps its families
        if t in old.get("trained", {}) and old["trained"][t] != fams:
            changed.append(f"trained.{t} ({old['trained'][t]!r} -> {fams!r})")
    # a method run before trains as it did: an override added to it, dropped or changed is a change (one that had
    # none counts as {}; until 2026-12-07 adding one went through, and a cell mixed seeds trained both ways)
    for m in [m for m in now.get("methods", []) if m in old.get("methods", [])]:
        was, over = old.get("method_train", {}).get(m, {}), now["method_train"].get(m, {})
        if was != over:
            changed.append(f"method_train.{m} ({was!r} -> {over!r})")
    if old.get("eval_trained") not in (None, now["eval_trained"]):
        changed.append("eval_trained (the evaluated split: the families of some axis changed)")
    if restart_allowed(root, path.name, changed):
        return {}
    if changed:
        raise OpctError(f"{path}: the threats run in {root} was started with other settings ({', '.join(changed)}); "
                        f"use another --name, or delete {root} to start again")
    return old


def cells_of(cfg: ThreatsConfig) -> list[tuple[int, str, str]]:
    """(seed, threat, method) in run order: per seed the base ("", base), the control ("", control), then every
    threat x method."""
    out = []
    for seed in cfg.seeds:
        out += [(seed, "", BASE), (seed, "", CONTROL)]
        out += [(seed, t, m) for t in cfg.threats for m in cfg.methods]
    return out


def cell_dir(root: Path, seed: int, threat: str, method: str) -> Path:
    return root / f"seed{seed}" / threat / method if threat else root / f"seed{seed}" / method


def run_threats(cfg: ThreatsConfig, log=print) -> Path:
    """Run every cell not already done; write cross_threat.json; return the run directory."""
    from opct.experiment.runner import resolve_model
    from opct.policy import count_parameters, cpu_threads
    from opct.threats.matrix import done_metrics, write_matrix
    from opct.train.loop import check_samplers

    check_samplers({f"method {m}": cfg.train_config(m) for m in cfg.methods})  # before any cell runs
    root = Path(cfg.out) / cfg.run_name()
    from opct.run_inputs import check_not_nested

    check_not_nested(root)  # before anything is written into another run's folder
    from opct.evals.run import check_config

    try:  # what every cell's eval would refuse (lm-eval tasks, their folder, items files), before any cell runs
        check_config(dataclasses.replace(cfg.eval, suite="all", out=str(root), axis_items=_items(cfg)))
    except OpctError as e:
        raise OpctError(f"eval: {e}") from None
    model = resolve_model(cfg.model)
    now = resolved(cfg, model)
    old = _previous(root, now)
    for key in ("seeds", "threats", "methods"):  # they accumulate: cells already run stay in the matrix
        now[key] = list(dict.fromkeys([*old.get(key, []), *now[key]]))
    for key in ("trained", "method_train", "no_signal"):
        now[key] = {**old.get(key, {}), **now[key]}
    from opct.run_inputs import check_run_inputs, experiment_inputs

    # what the cells already run were built on: a rerun on other items or weights is refused
    check_run_inputs(root, *experiment_inputs(model, dataclasses.replace(cfg.eval, suite="all",
                                                                         axis_items=_items(cfg))),
                     continuing=bool(old))
    write_json_atomic(root / SETTINGS, now, indent=2)
    with cpu_threads(count_parameters(model), cfg.eval.device, cfg.threads or None):

        cells = cells_of(cfg)
        t_start = time.time()
        for i, (seed, threat, method) in enumerate(cells, 1):
            d = cell_dir(root, seed, threat, method)
            what = f"{method} on {threat}" if threat else method
            tag = f"[{i}/{len(cells)}] seed {seed} {what}"
            if threat and method in no_signal_methods(threat):
                log(f"{tag}: {NO_SIGNAL}, not trained")
                continue
            if (d / "done.json").exists():
                if done_metrics(d / "done.json", "threats", d.relative_to(root).as_posix(), seed=seed, threat=threat,
                                method=method):
                    log(f"{tag}: done already, skipped")
                    continue
                # emptied since (`matrix.build_matrix` lists it as damaged): its training kept, its evaluation resumed
                log(f"{tag}: done.json holds no metrics: running it again")
            log(f"{tag} ({time.time() - t_start:.0f} s into the run)")
            seconds = {}
            model_dir, adapter = model, None
            if method != BASE:
                t0 = time.time()
                if method == CONTROL:
                    pairs = control_pairs(cfg, seed, d / "pairs.jsonl")
                    tc = cfg.train_config("sft", model=model, pairs=str(pairs), out=str(d / "train"), seed=seed,
                                          target_n=1, target_temperature=0.0)
                else:
                    pairs = threat_pairs(cfg, threat, seed, d.parent / "pairs.jsonl")
                    tc = cfg.train_config(method, model=model, pairs=str(pairs), out=str(d / "train"), seed=seed)
                model_dir, adapter = train_cell(tc, log, what)
                seconds["train"] = round(time.time() - t0, 1)
            t0 = time.time()
            metrics = evaluate(cfg, model_dir, adapter, seed, d / "eval", log)
            seconds["eval"] = round(time.time() - t0, 1)
            write_json_atomic(d / "done.json", {"seed": seed, "threat": threat, "method": method, "seconds": seconds,
                                                "metrics": metrics, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
            log(f"{tag}: done in {sum(seconds.values()):.0f} s "
                f"({', '.join(f'{k} {v:.0f} s' for k, v in seconds.items())})")
        write_matrix(root)
        log(f"threats {cfg.run_name()}: {len(cells)} cells in {root} ({time.time() - t_start:.0f} s this run)")
        return root


def _items(cfg: ThreatsConfig) -> dict[str, str]:
    from opct.subjects import SUBJECTS

    subject = SUBJECTS.get(cfg.model)
    return {axis: str(path) for axis, path in (subject.items if subject else {}).items()}


def threat_pairs(cfg: ThreatsConfig, threat: str, seed: int, path: Path) -> Path:
    """The threat's training pairs (its families; every other family held out and not made; the subject's own items
    where it has them), written once and shared by the threat's methods."""
    from opct.axes import AXES
    from opct.pairs.make import make_pairs

    a, fams, own = AXES[threat], cfg.families(threat), _items(cfg)
    items = a.load_items(own[threat], for_eval=False) if threat in own else a.world_items(seed)
    pairs = make_pairs(threat, items, families=fams, heldout=[f for f in a.families if f not in fams],
                       per_family=cfg.per_family or None, seed=seed, include_benign=cfg.benign)
    pairs = [p for p in pairs if p.split == "train"]
    if not pairs:
        raise OpctError(f"threats: {threat}: the families {', '.join(fams)} make no training pairs")
    _save_or_check(pairs, path, seed)
    return path


def _save_or_check(pairs: list, path: Path, seed: int) -> None:
    """Write the pairs, or check that the file an earlier session wrote holds them (its cells trained on it; until
    2026-12-07 an edited file was trained on by the cells added later, unchecked)."""
    from opct.experiment.runner import check_made
    from opct.pairs.schema import save_pairs

    if path.exists():
        check_made(path, pairs, seed)
    else:
        save_pairs(pairs, path)


def control_rows(cfg: ThreatsConfig) -> int:
    """Rows the control trains on per run: what every method trains on (steps x rows per step)."""
    return cfg.train.max_steps * cfg.train.batch_size * cfg.train.grad_accum


def control_pairs(cfg: ThreatsConfig, seed: int, path: Path) -> Path:
    """The control's benign prompts (teacher = student): `control_prompts` of them, else one per row trained (capped
    at the pool); the loop cycles them for max_steps x rows."""
    from opct.pairs.make import replay_pairs

    pairs = replay_pairs(cfg.control_prompts or control_rows(cfg), seed)
    if not pairs:
        raise OpctError("threats: the world has no benign prompts for the control")
    _save_or_check(pairs, path, seed)
    return path


def train_cell(tc, log, what: str) -> tuple[str, str | None]:
    """Train (or resume, or skip when `final/` exists); return (model dir, adapter dir or None) to evaluate."""
    from opct.train.loop import train
    from opct.train.rundir import check_finished

    out = Path(tc.out)
    final = out / "final"
    if final.exists():  # trained by an earlier session: as this cell trains, on these pairs, or refused
        check_finished(out, dataclasses.replace(tc, resume=True), what)
    else:
        tc = dataclasses.replace(tc, resume=out.is_dir())
        log(f"  train {what} ({tc.method}): {tc.max_steps} steps x {tc.batch_size * tc.grad_accum} rows, lr {tc.lr}"
            + (" (resuming)" if tc.resume else ""))
        train(tc)
    if (final / "adapter_config.json").exists():
        return tc.model, str(final)
    return str(final), None


def evaluate(cfg: ThreatsConfig, model_dir: str, adapter: str | None, seed: int, out: Path, log) -> dict:
    """Every axis of the registry (capability included) on the model, the attacker off, the run's one split."""
    from opct.evals.run import run_eval
    from opct.policy import load_policy
    from opct.subjects import SUBJECTS

    subject = SUBJECTS.get(cfg.model)
    judge = subject.judge if cfg.eval.judge == "auto" and subject is not None and subject.judge else cfg.eval.judge
    ec = dataclasses.replace(cfg.eval, model=model_dir, adapter=adapter, suite="all", out=str(out), seed=seed,
                             judge=judge, trained=cfg.eval_trained(), attack=False, axis_items=_items(cfg),
                             progress=cfg.progress and cfg.eval.progress)
    policy = load_policy(ec.model, adapter=ec.adapter, dtype=ec.dtype, device=ec.device, progress=ec.progress)
    return run_eval(policy, ec, None, log=lambda m: None, resume="checked")  # the run's own check compared them
