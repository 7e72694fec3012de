"""`opct run [EXPERIMENT.yaml]`: the main job — arms x seeds of pairs -> train -> evaluate, then the report.

    opct run configs/demo.yaml                 # what `make demo` runs (also the defaults: `opct run`)
    opct run configs/paper.yaml                # every arm, three seeds, full item counts
    opct run configs/demo.yaml --arms base opct act --name my-demo
    opct run configs/robustness.yaml [--quick] # a file with `kind: robustness`: the studies of opct.robustness
    opct run configs/threats.yaml [--quick]    # a file with `kind: threats`: the cross-threat matrix (opct.threats)

Every flag is a field of `opct.experiment.ExperimentConfig` (see configs/demo.yaml for the file form; `train`,
`eval` and `attack` are mappings of TrainConfig / EvalConfig / AttackConfig fields and live in the file only, as do
an arm's own settings: `arms: {opct_topk: {method: opct, estimator: topk}}`). Results go to OUT/NAME/<arm>/<seed>/; finished cells are skipped, so running the same command again
resumes an interrupted experiment. `opct report OUT/NAME` rebuilds the report from those files alone.
"""

from __future__ import annotations

import argparse

from opct.errors import OpctError
from opct.flags import path_arg


def register(subparsers) -> None:
    from opct.config import add_dataclass_args
    from opct.experiment.config import ExperimentConfig

    p = subparsers.add_parser("run", help="run an experiment: base, OPCT and baselines trained and evaluated, "
                                          "then the report", description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", nargs="?", type=path_arg, default=None,
                   help="experiment file (YAML or JSON), a robustness file (kind: robustness) or a cross-threat file "
                        "(kind: threats); default: the demo")
    add_dataclass_args(p, ExperimentConfig)
    p.add_argument("--quick", action="store_true", default=argparse.SUPPRESS,
                   help="robustness and threats files only (kind: robustness / threats): their smaller QUICK "
                        "sizes, written under NAME-quick")
    p.set_defaults(func=run)


# The flags a robustness file (kind: robustness) takes; the other flags are an experiment's.
ROBUSTNESS_FLAGS = ("name", "model", "out", "seeds", "threads", "note", "report", "quick", "progress")


def run(args) -> int:
    from opct.experiment import load_experiment

    if args.experiment:
        from opct.config import load_config_file

        kind = load_config_file(args.experiment).get("kind")
        if kind is not None:
            from opct.robustness.runner import KIND as ROBUSTNESS
            from opct.threats.config import KIND as THREATS

            if kind == ROBUSTNESS:
                return run_robustness_file(args)
            if kind == THREATS:
                return run_threats_file(args)
            # an experiment file has no kind; a misspelt one is not an unknown field
            raise OpctError(f"{args.experiment}: kind: must be robustness or threats (got {kind!r}); an experiment "
                            "file has no kind")
    if "quick" in vars(args):
        raise OpctError("--quick is for robustness and threats files (kind: robustness / threats); an experiment has "
                        "no quick sizes")
    return run_and_report(load_experiment(args.experiment, args))


def run_threats_file(args) -> int:
    """`opct run FILE` where FILE says `kind: threats`: the cross-threat matrix (opct.threats), then its report."""
    from opct.threats.config import load_threats
    from opct.threats.report import build
    from opct.threats.runner import run_threats

    return _run_study_file(args, "threats", load_threats, run_threats, build, "threats run")


def run_robustness_file(args) -> int:
    """`opct run FILE` where FILE says `kind: robustness`: the studies x seeds of opct.robustness, then the report."""
    from opct.robustness.report import build
    from opct.robustness.runner import load_robustness, run_robustness

    return _run_study_file(args, "robustness", load_robustness, run_robustness, build, "robustness study")


def _run_study_file(args, kind: str, load, run_all, build, lock_what: str) -> int:
    """A robustness or threats file: only ROBUSTNESS_FLAGS apply; load it, run it under the run directory's lock,
    then write and print its report."""
    from pathlib import Path

    from opct.files import dir_lock

    other = sorted(k for k in vars(args) if k not in (*ROBUSTNESS_FLAGS, "experiment", "func", "command"))
    if other:
        given = ("--no-" if vars(args)[other[0]] is False else "--") + other[0].replace("_", "-")  # as typed
        raise OpctError(f"{given}: not a setting of a {kind} file (its flags: "
                        f"{', '.join('--' + f for f in ROBUSTNESS_FLAGS)})")
    flags = argparse.Namespace(**{k: v for k, v in vars(args).items() if k in ROBUSTNESS_FLAGS})
    cfg = load(args.experiment, flags)
    with dir_lock(Path(cfg.out) / cfg.run_name(), lock_what, kind=kind):
        root = run_all(cfg)
        if cfg.report:
            html, md = build(root)
            print((root / "results.md").read_text(encoding="utf-8"))
            print(f"report: {html}\n        {md}")
    return 0


def run_and_report(cfg) -> int:
    from pathlib import Path

    from opct.experiment import run_experiment
    from opct.files import dir_lock

    # a second `opct run` of the same experiment is refused, and so is a directory another command wrote
    with dir_lock(Path(cfg.out) / cfg.name, "experiment", kind="experiment"):
        return _run_and_report(cfg, run_experiment)


def _run_and_report(cfg, run_experiment) -> int:
    root = run_experiment(cfg)
    if cfg.report:
        from opct.report import build_report, load_run, summary_text

        loaded = load_run(root)  # read once, for the report and the printed table
        html, md = build_report(loaded)
        print(summary_text(loaded))
        print(f"report: {html}\n        {md}")
    return 0
