"""`run_experiment(config)`: for each seed and arm, build pairs, train, evaluate every suite; then the report.

Everything lands under `OUT/NAME/` (DESIGN §1: stages talk only through files):

    experiment.json           the resolved ExperimentConfig (arms as a list of names, their settings in arm_specs)
    pairs/seed<S>.jsonl       the training pairs of seed S (shared by every arm of that seed)
    <arm>/<seed>/train/       `opct train`'s run directory (config.json, metrics.jsonl, checkpoints/, final/)
    <arm>/<seed>/eval/        `opct eval`'s run directory (records.jsonl, metrics.json, metrics.txt, run.json)
    <arm>/<seed>/done.json    written last: the cell is complete (seconds per stage)
    report.html, results.md   `opct report`

A cell with done.json is skipped, so an interrupted experiment resumes where it stopped (unless its evaluation's
files were removed or emptied since, `opct.evals.resume.finished_metrics`: then the cell runs again, its training
kept); a cell whose training was interrupted continues from its last checkpoint (`opct train --resume`), exactly.
Changing the experiment's configuration under an existing directory is an error (start a new name), because the
finished cells would no longer belong to it.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from pathlib import Path

from opct.config import changes, restart_allowed
from opct.errors import OpctError
from opct.experiment.config import TEACHER, UNTRAINED, ExperimentConfig
from opct.files import read_json, write_json_atomic
from opct.pairs.schema import Pair

# Fields that may differ when an experiment is resumed (they do not change any cell's result); arms and seeds may
# grow (an arm already run must keep its settings).
RESUMABLE = ("report", "note", "threads", "out", "name", "trust_remote_code", "arms", "seeds", "arm_specs", "progress",
             "log_with", "train.log_with", "train.tensorboard", "train.vllm_gpu_memory", "eval.log_with",
             "train.progress", "eval.progress")


def resolve_model(model: str) -> str:
    """The model directory of a subject (`opct.subjects`: default, test, ...) or of a save_pretrained directory."""
    from opct.subjects import resolve

    return resolve(model)[0]


def axis_items(cfg: ExperimentConfig) -> dict[str, str]:
    """Per axis, the items file of the experiment's subject (the world's items where it has none)."""
    from opct.subjects import SUBJECTS

    subject = SUBJECTS.get(cfg.model)
    return {axis: str(path) for axis, path in (subject.items if subject else {}).items()}


def make_training_pairs(cfg: ExperimentConfig, seed: int) -> list[Pair]:
    """The world's pairs for what the experiment trains on, axis by axis in registry order; everything else is held
    out (and not made)."""
    from opct.axes import AXES
    from opct.pairs.make import make_pairs

    own = axis_items(cfg)
    pairs: list[Pair] = []
    for name, axis in AXES.items():
        fams = cfg.trained.get(name)
        if not fams:
            continue
        held = [f for f in axis.families if f not in fams]
        items = axis.load_items(own[name], for_eval=False) if name in own else axis.world_items(seed)
        pairs += make_pairs(name, items, families=fams, heldout=held, per_family=cfg.per_family,
                            seed=seed, include_benign=cfg.benign, **cfg.pair_options.get(name, {}))
    # held-out harmful categories (and anything else marked held out) never reach training
    return [p for p in pairs if p.split == "train"]


def _previous_experiment(root: Path, resolved: dict) -> dict:
    """The experiment.json already in `root` ({} if none); an error if it was run with other settings."""
    path = root / "experiment.json"
    if not path.exists():
        return {}
    old = read_json(path, "experiment")
    if not isinstance(old, dict):
        raise OpctError(f"{path}: not an experiment (expected a JSON object); delete it to start the experiment again")
    from opct.report.rundir import check_lists

    check_lists(old, path)  # what this run extends: garbage there was a TypeError traceback, or written back
    from opct.config import block_defaults
    from opct.evals.attack import AttackConfig
    from opct.evals.run import EvalConfig
    from opct.train.config import TrainConfig

    # a field added to a block after the experiment started counts as its default: the experiment still resumes
    changed = changes(old, resolved, RESUMABLE,
                      block_defaults(old, train=TrainConfig, eval=EvalConfig, attack=AttackConfig))
    specs = old.get("arm_specs") or {}
    changed += [f"arm {a} ({specs[a]!r} -> {s!r})" for a, s in resolved["arm_specs"].items()
                if a in specs and specs[a] != s]
    if restart_allowed(root, path.name, changed):
        return {}
    if changed:
        raise OpctError(f"{path}: the experiment in {root} was started with other settings ({', '.join(changed)}); "
                        f"use another --name, or delete {root} to start again")
    return old


def cell_dir(root: Path, arm: str, seed: int) -> Path:
    return root / arm / str(seed)


def run_experiment(cfg: ExperimentConfig, log=print) -> Path:
    """Run every (seed, arm) cell not already done; write the report; return the experiment directory."""
    from opct.evals.resume import finished_metrics
    from opct.shapes import read_done
    from opct.modeldir import check_device
    from opct.policy import count_parameters, cpu_threads

    check_device(cfg.eval.device, "eval.device", "eval.device: cpu")  # before any cell runs
    from opct.train.loop import check_samplers

    check_samplers({f"arm {a}": cfg.arm_config(a) for a in cfg.arms if cfg.method(a) not in UNTRAINED})
    root = Path(cfg.out) / cfg.name
    from opct.run_inputs import check_not_nested

    check_not_nested(root)  # before anything is written into another run's folder
    from opct.evals.run import check_config

    try:  # what every cell's eval would refuse (lm-eval tasks, their folder, items files), before any cell runs
        check_config(dataclasses.replace(cfg.eval, out=str(root), axis_items=axis_items(cfg)))
    except OpctError as e:
        raise OpctError(f"eval: {e}") from None
    if cfg.pairs and any(cfg.method(a) not in UNTRAINED for a in cfg.arms):
        # checked before the base arm's eval, not when the first trained arm starts
        _user_pairs(Path(cfg.pairs), cfg.trained)
    model = resolve_model(cfg.model)
    from opct.modeldir import check_model_dir

    check_model_dir(model)  # before experiment.json is written: a mistyped path is one line, and nothing is kept
    resolved = cfg.resolved(model)
    old = _previous_experiment(root, resolved)
    # arms and seeds accumulate: adding an arm later keeps the cells already run in the report
    resolved["arms"] = list(dict.fromkeys([*old.get("arms", []), *cfg.arms]))
    resolved["seeds"] = list(dict.fromkeys([*old.get("seeds", []), *cfg.seeds]))
    resolved["arm_specs"] = {**(old.get("arm_specs") or {}), **resolved["arm_specs"]}
    from opct.run_inputs import check_run_inputs, experiment_inputs

    # what the cells already run were built on: a rerun on other pairs, items or weights is refused
    trains = any(cfg.method(a) not in UNTRAINED for a in cfg.arms)
    check_run_inputs(root, *experiment_inputs(model, dataclasses.replace(cfg.eval, axis_items=axis_items(cfg)),
                                              cfg.pairs if trains else ""), continuing=bool(old))
    check_trained_cells(cfg, root, model)
    write_json_atomic(root / "experiment.json", resolved)
    # one setting for the whole experiment: training and evaluation run in this process
    with cpu_threads(count_parameters(model), cfg.eval.device, cfg.threads or None):
        from opct.trackers import Trackers, metric_values

        with Trackers(cfg.log_with, root / "trackers", f"experiment-{cfg.name}",
                      {k: v for k, v in resolved.items() if not isinstance(v, (dict, list))}) as tracked:
            cells = [(seed, arm) for seed in cfg.seeds for arm in cfg.arms]
            t_start = time.time()
            for i, (seed, arm) in enumerate(cells, 1):
                d = cell_dir(root, arm, seed)
                if (d / "done.json").exists():
                    read_done(d / "done.json", "experiment", f"{arm}/{seed}", arm=arm, seed=seed)
                    if not (why := finished_metrics(d / "eval")[1]):
                        log(f"[{i}/{len(cells)}] {arm} seed {seed}: done already, skipped")
                        continue
                    # damaged since it was done: its training is kept (final/), its evaluation resumed or redone
                    log(f"[{i}/{len(cells)}] {arm} seed {seed}: done.json, but {why}: running it again")
                log(f"[{i}/{len(cells)}] {arm} seed {seed} ({time.time() - t_start:.0f} s into the experiment)")
                seconds = {}
                model_dir, adapter = model, None
                if cfg.method(arm) not in UNTRAINED:
                    t0 = time.time()
                    pairs_file = _pairs_file(cfg, root, seed, log, arm)
                    seconds["pairs"] = round(time.time() - t0, 1)
                    t0 = time.time()
                    model_dir, adapter = train_arm(cfg, arm, seed, model, pairs_file, d / "train", log)
                    seconds["train"] = round(time.time() - t0, 1)
                t0 = time.time()
                metrics = evaluate_arm(cfg, seed, model_dir, adapter, d / "eval", log,
                                       teacher_side=cfg.method(arm) == TEACHER)
                tracked.log(metric_values(metrics, prefix=f"{arm}/"), step=seed)
                seconds["eval"] = round(time.time() - t0, 1)
                write_json_atomic(d / "done.json", {"arm": arm, "seed": seed, "seconds": seconds,
                                                    "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
                log(f"[{i}/{len(cells)}] {arm} seed {seed}: done in {sum(seconds.values()):.0f} s "
                    f"({', '.join(f'{k} {v:.0f} s' for k, v in seconds.items())})")
        log(f"experiment {cfg.name}: {len(cells)} cells in {root} ({time.time() - t_start:.0f} s this run)")
        return root


def pairs_path(cfg: ExperimentConfig, root: Path, seed: int, arm: str) -> Path:
    """Where the arm's training pairs of `seed` are: the arm's own file when it adds benign replay pairs, else the
    user's `pairs` or the seed's world pairs (shared by every arm)."""
    if cfg.arms[arm].get("benign_replay", 0):
        return root / "pairs" / f"seed{seed}-{arm}.jsonl"
    return Path(cfg.pairs) if cfg.pairs else root / "pairs" / f"seed{seed}.jsonl"


def _pairs_file(cfg: ExperimentConfig, root: Path, seed: int, log, arm: str) -> Path:
    """The arm's training pairs (`pairs_path`): the seed's (shared by every arm), plus the arm's own benign replay
    pairs, made (or checked against what an earlier session made)."""
    from opct.pairs.make import replay_pairs
    from opct.pairs.schema import load_pairs, save_pairs

    shared = _shared_pairs_file(cfg, root, seed, log)
    n = cfg.arms[arm].get("benign_replay", 0)
    if not n:
        return shared
    path = pairs_path(cfg, root, seed, arm)
    replay = replay_pairs(n, seed)
    made = [*load_pairs(shared), *replay]
    if not path.exists():
        save_pairs(made, path)
        log(f"  pairs for {arm}: + {len(replay)} benign replay pairs -> {path}")
    else:
        check_made(path, made, seed)
    return path


def check_made(path: Path, pairs: list, seed: int) -> None:
    """An OpctError when the pairs file an earlier session of the experiment made (`path`) holds other pairs than
    it makes now (`pairs`): edited, cut short, or made by another version of opct. Its arms trained on what it held;
    an arm trained now on other pairs would be compared with them as if on the same."""
    from opct.pairs.schema import load_pairs

    if [p.to_json() for p in load_pairs(path)] != [p.to_json() for p in pairs]:
        raise OpctError(f"{path}: holds other pairs than the experiment makes for seed {seed} ({len(pairs)} pairs: "
                        f"the file was edited, or made by another version of opct); the arms already trained on it "
                        f"would not be comparable with new ones: put the original back, or run the experiment again "
                        f"under another --name")


def _user_pairs(path: Path, trained: dict[str, list[str]]) -> Path:
    """The user's own pairs file (`--pairs`), read and checked: every pair of a family of its axis (`check_families`,
    as `opct pairs check`), pairs to train on, and none of them of a family that `trained` holds out — the evaluation
    labels that family's probes held out, so training on it would put trained prompts in the held-out metrics."""
    from opct.errors import DataError
    from opct.pairs.make import check_families, trains_heldout
    from opct.pairs.schema import line_of, load_pairs

    pairs = load_pairs(path)
    check_families(pairs, path)
    if not any(p.split == "train" for p in pairs):
        raise OpctError(f"{path}: no pair has meta.split == 'train'")
    for p in trains_heldout(pairs, trained)[:1]:
        raise DataError(path, line_of(path, p.id), "meta.family",
                        f"{p.axis} family {p.family!r} is held out by the experiment's `trained` "
                        f"({', '.join(trained.get(p.axis, ())) or 'nothing of ' + p.axis} trained), but this "
                        f"pair trains on it; add it to `trained` or drop its pairs")
    return path


def _shared_pairs_file(cfg: ExperimentConfig, root: Path, seed: int, log) -> Path:
    from opct.pairs.schema import save_pairs

    if cfg.pairs:
        return _user_pairs(Path(cfg.pairs), cfg.trained)
    path = root / "pairs" / f"seed{seed}.jsonl"  # `pairs_path` of an arm without replay
    pairs = make_training_pairs(cfg, seed)
    if not pairs:
        raise OpctError("the experiment trains on nothing: every list in `trained` is empty (or give --pairs)")
    if not path.exists():
        save_pairs(pairs, path)
        counts = Counter(p.axis for p in pairs)
        log(f"  pairs: {len(pairs)} ({', '.join(f'{k} {v}' for k, v in counts.items())}) -> {path}")
    else:  # made by an earlier session of this experiment: the same pairs, or its arms would not compare
        check_made(path, pairs, seed)
    return path


def train_arm(cfg: ExperimentConfig, arm: str, seed: int, model: str, pairs_file: Path, out: Path,
              log) -> tuple[str, str | None]:
    """Train one arm (resuming an interrupted run); return (model dir, adapter dir or None) to evaluate."""
    from opct.train.loop import train

    final = out / "final"
    src = cfg.arms[arm].get("init_from")
    tc = _arm_train_config(cfg, arm, seed, model, pairs_file, out)
    if not final.exists():  # one trained by an earlier session was checked before any cell ran (check_trained_cells)
        if src and not (Path(tc.init_adapter) / "adapter_config.json").exists():
            raise OpctError(f"arm {arm}: init_from {src!r}, but {tc.init_adapter} holds no trained adapter (is the "
                            f"{src} cell of seed {seed} done?)")
        log(f"  train {arm} ({tc.method}): {tc.max_steps} steps x {tc.batch_size} pairs"
            + (f" x {tc.n_samples} samples" if tc.method == "opct" else "") + f", lr {tc.lr}, "
            + ("LoRA r=%d" % tc.lora_r if tc.lora else "full fine-tuning")
            + (f", from {src}'s adapter" if src else "") + (" (resuming)" if tc.resume else ""))
        train(tc)
    if (final / "adapter_config.json").exists():
        return model, str(final)
    return str(final), None


def _arm_train_config(cfg: ExperimentConfig, arm: str, seed: int, model: str, pairs_file: Path, out: Path):
    """The TrainConfig the arm trains its cell `out` with."""
    runner = {}
    src = cfg.arms[arm].get("init_from")
    if src:  # continue another arm's adapter (that arm ran earlier in this seed)
        runner["init_adapter"] = str(out.parent.parent.parent / src / str(seed) / "train" / "final")
    own = cfg.arms[arm].get("log_with", cfg.train.log_with)
    runner["log_with"] = list(dict.fromkeys([*own, *cfg.log_with]))
    runner["progress"] = cfg.progress and cfg.arms[arm].get("progress", cfg.train.progress)
    return cfg.arm_config(arm, model=model, pairs=str(pairs_file), out=str(out), seed=seed,
                          resume=out.is_dir(),  # also a run killed before its first checkpoint: started over
                          trust_remote_code=cfg.trust_remote_code, **runner)


def check_trained_cells(cfg: ExperimentConfig, root: Path, model: str) -> None:
    """Before experiment.json is rewritten or anything runs: every cell of this run already trained (final/) was
    trained as its arm trains now, on its pairs (`opct.train.rundir.check_finished`)."""
    from opct.shapes import read_done
    from opct.train.rundir import check_finished

    for seed in cfg.seeds:
        for arm in cfg.arms:
            out = cell_dir(root, arm, seed) / "train"
            if cfg.method(arm) in UNTRAINED or not (out / "final").exists():
                continue
            if (done := out.parent / "done.json").exists():  # a cell copied from another folder is named as that
                read_done(done, "experiment", f"{arm}/{seed}", arm=arm, seed=seed)
            check_finished(out, _arm_train_config(cfg, arm, seed, model, pairs_path(cfg, root, seed, arm), out),
                           f"the {arm} cell of seed {seed}")


def evaluate_arm(cfg: ExperimentConfig, seed: int, model_dir: str, adapter: str | None, out: Path, log,
                 teacher_side: bool = False) -> dict:
    """Every axis on the arm's model; `teacher_side`: the teacher side of every probe, without the attacker (the
    `teacher` arm)."""
    from opct.evals.run import run_eval
    from opct.policy import load_policy

    from opct.subjects import SUBJECTS

    subject = SUBJECTS.get(cfg.model)
    judge = subject.judge if cfg.eval.judge == "auto" and subject is not None and subject.judge else cfg.eval.judge
    ec = dataclasses.replace(cfg.eval, model=model_dir, adapter=adapter, out=str(out), seed=seed, judge=judge,
                             trained=cfg.trained, trust_remote_code=cfg.trust_remote_code,
                             pair_options=cfg.pair_options, axis_items=axis_items(cfg),
                             log_with=list(dict.fromkeys([*cfg.eval.log_with, *cfg.log_with])),
                             progress=cfg.progress and cfg.eval.progress,
                             **({"prompt_side": "teacher", "attack": False} if teacher_side else {}))
    policy = load_policy(ec.model, adapter=ec.adapter, dtype=ec.dtype, device=ec.device,
                         trust_remote_code=ec.trust_remote_code, progress=ec.progress)
    log(f"  eval: suite {ec.suite}" + (", teacher side" if teacher_side else ""))
    # a cell's eval killed part way continues (the experiment's own resume check compared the settings)
    return run_eval(policy, ec, cfg.attack, log=lambda m: log("  " + m), resume="checked")
