"""The replay study (issue 20, part 1): what on-model benign replay does to capability and to the trained behaviour.

Per seed: the base model is evaluated once; then every method x condition trains on the axis's pairs (the same
pairs for all) and is evaluated on the axis and on capability. A condition is a `replay_frac` and a
`replay_schedule` (`opct.train.replay`): `none` (replay_frac 0), `mixed` (replay from step 0, in every step) and
`sequential` (the method's steps first, then the replay rows alone). Rows: condition = the condition's name, x =
its replay_frac; metrics = the axis's (`metrics`) and capability's accuracy, accuracy among parsed answers,
unparsed rate and truncation rate (the SFT-lessons paper found capability lost through termination); the base model
is method `base`, condition `base`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from opct.config import ConfigError, option
from opct.evals.run import EvalConfig
from opct.files import is_dir_name
from opct.robustness import cells as C
from opct.train.config import TrainConfig

NAME = "replay"


def default_conditions() -> dict[str, dict]:
    return {"none": {"replay_frac": 0.0},
            "mixed": {"replay_frac": 0.25, "replay_schedule": "mixed"},
            "sequential": {"replay_frac": 0.25, "replay_schedule": "sequential"}}


@dataclass
class Config:
    CONFIG_LABEL: ClassVar[str] = "replay study"

    model: str = option("default", "the model directory (the runner sets it from the study file's `model`)",
                        cli=False)
    methods: list[str] = option(["opct", "bct"], "methods to train (keys of opct.methods.METHODS)", nonempty=True)
    axes: list[str] = option(help="axes to train on, one at a time (each method x condition x axis is one training "
                                  "run on that axis's pairs; default: the first pair axis)", factory=C.default_axes,
                             nonempty=True)
    trained: dict[str, list[str]] = option(help="per axis, the families trained on (default: the axis's default "
                                                "training set); every other family is held out", factory=dict)
    conditions: dict[str, dict] = option(help="name -> {replay_frac, replay_schedule}", factory=default_conditions,
                                         nonempty=True)
    metrics: dict[str, list[str]] = option(help="per axis, the metrics reported (default: the axis's summary "
                                                "metrics; capability's are always added)", factory=dict)
    per_family: int = option(0, "items per family in the training pairs (0: all)", ge=0)
    train: TrainConfig = option(help="TrainConfig fields shared by every training run", factory=C.study_train)
    method_train: dict[str, dict] = option(help="per method, TrainConfig overrides (e.g. {act: {lr: 0.003}})",
                                           factory=dict)
    eval: EvalConfig = option(help="EvalConfig fields of every evaluation (n, samples, max_new_tokens, ...)",
                              factory=C.study_eval)

    def __post_init__(self):
        C.check_blocks(self)
        for name, spec in self.conditions.items():
            if not is_dir_name(name):  # OUT/<method>-<axis>-<condition>/: 'a/../..' trained outside the run
                raise ConfigError("conditions", f"a condition name must be a non-empty directory name (got {name!r})")
            if not isinstance(spec, dict):
                raise ConfigError(f"conditions.{name}", f"must be a mapping {{replay_frac, replay_schedule}} "
                                                        f"(got {spec!r})")
            bad = sorted(set(spec) - {"replay_frac", "replay_schedule"})
            if bad:
                raise ConfigError(f"conditions.{name}", f"unknown key(s) {', '.join(bad)}; known: replay_frac, "
                                                        f"replay_schedule")
            try:
                TrainConfig(**spec)
            except ConfigError as e:
                raise e.under(f"conditions.{name}") from None
        self.metrics = {a: self.metrics.get(a) or C.default_metrics(a) for a in self.axes}
        missing = [a for a, v in self.metrics.items() if not v]
        if missing:
            raise ConfigError(f"metrics.{missing[0]}", "name the metrics to report for this axis")


QUICK = {"methods": ["opct", "bct"], "train": {"max_steps": 60, "save_every": 30}, "eval": {"n": 40}}


def run(cfg: Config, seed: int, out: Path, log) -> list[dict]:
    trained = C.trained_of(cfg)
    base = C.evaluate(cfg.model, None, cfg.axes, cfg.eval, trained, seed, out / "base" / "eval", log)
    rows = []
    for axis in cfg.axes:
        C.check_metrics(base, cfg.metrics[axis], f"metrics.{axis}")
        names = [*cfg.metrics[axis], *C.CAPABILITY_METRICS]
        rows += C.metric_rows(NAME, "base", axis, "base", None, base, names)
        pairs = C.axis_pairs(axis, trained[axis], seed, out / f"pairs-{axis}.jsonl", cfg.per_family or None)
        for method in cfg.methods:
            for cond, spec in cfg.conditions.items():
                d = out / f"{method}-{axis}-{cond}"
                tc = C.train_config(cfg, method, model=cfg.model, pairs=str(pairs), out=str(d / "train"), seed=seed,
                                    **spec)
                model_dir, adapter = C.train_cell(tc, log, f"{method} on {axis}, {cond}")
                m = C.evaluate(model_dir, adapter, cfg.axes, cfg.eval, trained, seed, d / "eval", log)
                rows += C.metric_rows(NAME, method, axis, cond, tc.replay_frac, m, names)
    return rows


if __name__ == "__main__":
    import sys

    from opct.robustness import replay as study  # this module under its own name, not __main__
    from opct.robustness.standalone import main

    sys.exit(main(study))
