"""`ThreatsConfig`: the settings of a cross-threat run (a file with `kind: threats`; see `opct.threats`).

Sizes. The full file (configs/threats.yaml) trains 40 steps x 8 rows per cell and evaluates 40 items per axis,
three seeds; `--quick` (`QUICK`) keeps the first seed, 16 steps and 16 items per axis, and writes under NAME-quick.
The timings behind those sizes are in configs/threats.yaml.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import ClassVar

from opct.config import SEED, ConfigError, check_keys, construct, option, validate
from opct.evals.run import EvalConfig
from opct.files import is_dir_name
from opct.train.config import TrainConfig, check_per_method

KIND = "threats"
CONTROLS = ("benign_sft",)
# Fields the runner sets itself, per cell (an error when a file gives them).
RUNNER_TRAIN_FIELDS = ("method", "model", "pairs", "out", "seed", "resume", "init_adapter", "targets")
RUNNER_EVAL_FIELDS = ("model", "adapter", "out", "seed", "trained", "suite", "items", "axis_items", "pair_options",
                      "prompt_side", "attack")
# What makes the control sample-matched: a method may not change them (they are the shared `train` block's).
SAMPLE_FIELDS = ("max_steps", "batch_size", "grad_accum", "replay_frac", "replay_schedule")
# What the control is matched on besides: a method's overrides may change none of these either (the README's "LoRA,
# lr and schedule"; until 2026-12-07 only SAMPLE_FIELDS were refused, and a method at lr 0.5 was read against a
# control at 0.001 under a report line saying every cell trained at 0.001)
MATCHED_FIELDS = SAMPLE_FIELDS + ("lora", "lora_r", "lora_alpha", "lora_targets", "lr", "lr_schedule", "warmup_steps")
DEFAULT_METHODS = ("opct", "bct", "act", "mlpct", "attct")
# --quick: the first seed only (no interval over seeds: cells read "(n=1)"), fewer steps and items.
QUICK = {"seeds": 1, "train": {"max_steps": 16, "save_every": 8}, "eval": {"n": 16}}


def default_threats() -> list[str]:
    """Every axis that trains on pairs, in registry order (an axis registered later joins by itself)."""
    from opct.axes import pair_axes

    return pair_axes()


def threats_train() -> TrainConfig:
    """The demo's training settings (opct.experiment.config.demo_train) at 40 steps: the demo's per-step budget."""
    from opct.experiment.config import demo_train

    return dataclasses.replace(demo_train(), max_steps=40, save_every=20)


def threats_eval() -> EvalConfig:
    return EvalConfig(n=40, attack=False, progress=False)


def families_of(axis: str, trained: dict) -> list[str]:
    """What training on `axis` means: the config's families for it, else the axis's default training set (what the
    default experiment trains on), else its train families (prefill trains on nothing by default: its 6 training
    prefills here)."""
    from opct.axes import AXES

    a = AXES[axis]
    return list(trained.get(axis) or a.default_trained() or a.train_families())


def no_signal_methods(axis: str) -> tuple:
    """Methods that get no training signal from the axis's pairs by construction: `Axis.no_signal_methods`, or a
    module-level NO_SIGNAL_METHODS in the module that defines the axis's `run`."""
    from opct.axes import AXES

    a = AXES[axis]
    own = tuple(getattr(a, "no_signal_methods", ()) or ())
    module = sys.modules.get(getattr(a.run, "__module__", ""), None)
    return own or tuple(getattr(module, "NO_SIGNAL_METHODS", ()) or ())


@dataclass
class ThreatsConfig:
    CONFIG_LABEL: ClassVar[str] = "threats"

    kind: str = option(KIND, "what the file is: `threats` (an `opct run` file without `kind` is an experiment)",
                       choices=[KIND])
    name: str = option("threats", "run name; everything is written under OUT/NAME/ (--quick adds -quick)")
    model: str = option("default", "a subject ('default', the shipped organism; 'test'; ...) or a model directory",
                        nonempty=True)
    out: str = option("runs", "root directory", nonempty=True)
    seeds: list[int] = option([0, 1, 2], "seeds; every cell runs once per seed (the interval is over seeds)",
                              nonempty=True, **SEED)
    threats: list[str] = option(help="the axes trained on, one at a time (default: every axis that makes pairs, in "
                                     "registry order); every axis in opct.axes.AXES is evaluated",
                                factory=default_threats, nonempty=True)
    trained: dict[str, list[str]] = option(help="per threat, the families trained on (default: the axis's default "
                                                "training set, else its train families)", factory=dict)
    methods: list[str] = option(list(DEFAULT_METHODS), "methods trained on each threat (opct.methods.METHODS)",
                                nonempty=True)
    control: str = option("benign_sft", "the reference every cell is read against: benign_sft = SFT for the same "
                                        "steps x rows on benign prompts, the starting model's greedy answers as "
                                        "targets (opct.threats)", choices=list(CONTROLS))
    control_prompts: int = option(0, "distinct benign prompts of the control (0: steps x rows per step, capped at "
                                     "the world's benign pool)", ge=0)
    benign: bool = option(True, "the threats' training pairs include their benign anchors (as the experiment's)")
    per_family: int = option(0, "items per family in the training pairs (0: all)", ge=0)
    train: TrainConfig = option(help="TrainConfig fields of every training run, the control's included",
                                factory=threats_train)
    method_train: dict[str, dict] = option(help="per method, TrainConfig overrides (e.g. {act: {act_weight: 1e-4}}); "
                                                "not max_steps, batch_size, grad_accum or replay (sample matching)",
                                           factory=dict)
    eval: EvalConfig = option(help="EvalConfig fields of every evaluation (n, axis_n, samples, ...; the attacker is "
                                   "always off)", factory=threats_eval)
    quick: bool = option(False, "smaller sizes (QUICK: the first seed, fewer steps and items)")
    threads: int = option(0, "torch CPU threads (0: opct's default for the model's size)", ge=0, threads=True)
    progress: bool = option(True, "progress bars of the training cells (--no-progress: none, transformers' loading "
                                  "bars included; the evaluations run without unless eval.progress); "
                                  "train.progress turns the training's off too")
    note: str = option("", "free text shown at the top of the report")
    report: bool = option(True, "write results.md and report.html at the end")

    def __post_init__(self):
        from opct.axes import AXES
        from opct.methods import METHODS

        # a file's `train` / `eval` block overrides the defaults above key by key; --quick's sizes go on top
        if isinstance(self.train, dict):
            check_keys(TrainConfig, self.train, "train", RUNNER_TRAIN_FIELDS)
            self.train = construct(TrainConfig, _given(threats_train(), self.train, "train", self.quick), "train",
                                   RUNNER_TRAIN_FIELDS)
        elif self.quick:
            self.train = dataclasses.replace(self.train, **QUICK["train"])
        if isinstance(self.eval, dict):
            check_keys(EvalConfig, self.eval, "eval", RUNNER_EVAL_FIELDS)
            self.eval = construct(EvalConfig, _given(threats_eval(), self.eval, "eval", self.quick), "eval",
                                  RUNNER_EVAL_FIELDS)
        elif self.quick:
            self.eval = dataclasses.replace(self.eval, **QUICK["eval"])
        self.eval = dataclasses.replace(self.eval, attack=False)  # never the attacker: every cell evaluates the same
        validate(self)
        if not is_dir_name(self.name):
            raise ConfigError("name", f"must be a non-empty directory name (got {self.name!r})")
        for field, values in (("seeds", self.seeds), ("threats", self.threats), ("methods", self.methods)):
            if len(set(values)) != len(values):
                raise ConfigError(field, "must not repeat")
        if self.quick:
            self.seeds = self.seeds[:QUICK["seeds"]]
        from opct.world.items import replay_items

        if self.control_prompts > (pool := len(replay_items())):  # was cut to the pool unsaid (2026-12-07)
            raise ConfigError("control_prompts", f"must be at most {pool}, the world's benign prompts (got "
                                                 f"{self.control_prompts}; 0 takes steps x rows, capped at {pool})")
        pair = [n for n, a in AXES.items() if a.task is not None]
        for i, t in enumerate(self.threats):
            if t not in pair:
                raise ConfigError(f"threats[{i}]", f"must be an axis that trains on pairs ({', '.join(pair)}); "
                                                   f"got {t!r}")
        for a, fams in self.trained.items():
            if a not in self.threats:
                raise ConfigError(f"trained.{a}", f"not one of the threats ({', '.join(self.threats)})")
            if not isinstance(fams, list) or not fams:
                raise ConfigError(f"trained.{a}", f"must be a non-empty list of families (got {fams!r})")
            if len(set(map(str, fams))) != len(fams):  # as an experiment's: the family's pairs were made twice
                raise ConfigError(f"trained.{a}", "families must not repeat")
            bad = [f for f in fams if f not in AXES[a].families]
            if bad and not AXES[a].open_families:
                raise ConfigError(f"trained.{a}", f"unknown {', '.join(map(str, bad))}; known: "
                                                  f"{', '.join(AXES[a].families)}")
        for i, m in enumerate(self.methods):
            if m not in METHODS:
                raise ConfigError(f"methods[{i}]", f"unknown method {m!r}; known: {', '.join(METHODS)}")
        for m, over in self.method_train.items():
            if m not in self.methods:
                raise ConfigError(f"method_train.{m}", f"not one of the methods ({', '.join(self.methods)})")
            if not isinstance(over, dict):
                raise ConfigError(f"method_train.{m}", f"must be a mapping of TrainConfig fields (got {over!r})")
            fixed = [k for k in over if k in MATCHED_FIELDS]
            if fixed:
                raise ConfigError(f"method_train.{m}.{fixed[0]}", "is the shared train block's: every method and "
                                                                  "the control take the same steps x rows, LoRA, lr "
                                                                  "and schedule")
            try:
                construct(TrainConfig, {**over}, reserved=RUNNER_TRAIN_FIELDS)
            except ConfigError as e:
                raise e.under(f"method_train.{m}") from None
        check_per_method(self.train, [*self.methods, "sft"], self.method_train)  # the control (sft) included

    def run_name(self) -> str:
        return self.name + ("-quick" if self.quick and not self.name.endswith("-quick") else "")

    def train_config(self, method: str, **runner) -> TrainConfig:
        """The shared `train` block, the method's own overrides, then what the runner sets (and no bars without
        `progress`)."""
        fields = {**self.method_train.get(method, {}), **runner}
        fields["progress"] = self.progress and fields.get("progress", self.train.progress)
        return dataclasses.replace(self.train, **fields, method=method)

    def families(self, axis: str) -> list[str]:
        return families_of(axis, self.trained)

    def eval_trained(self) -> dict[str, list[str]]:
        """The split every evaluation of the run uses (the same for base, control and every cell, so a delta
        compares the same probes): per pair axis, the families training on it would use."""
        from opct.axes import pair_axes

        return {a: self.families(a) for a in pair_axes()}


def _given(default, block: dict, key: str, quick: bool) -> dict:
    """The default block's non-default fields, the file's block over them, then QUICK's sizes when quick."""
    from opct.config import defaults_of

    base = defaults_of(type(default))
    reserved = RUNNER_TRAIN_FIELDS if key == "train" else RUNNER_EVAL_FIELDS
    own = {f.name: getattr(default, f.name) for f in dataclasses.fields(default)
           if getattr(default, f.name) != base.get(f.name) and f.name not in reserved}
    return {**own, **block, **(QUICK[key] if quick else {})}


def load_threats(path, args=None, **overrides) -> ThreatsConfig:
    from opct.config import build_config

    return build_config(ThreatsConfig, args, path, None, **overrides)
