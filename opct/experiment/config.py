"""`ExperimentConfig`: one experiment = a model, the training pairs, the arms, the seeds and the budgets.

Its defaults ARE the README's demo (`make demo`): the shipped default organism; arms base, opct and bct; sycophancy
pairs from the suggested-answer family only, jailbreak pairs from the world's train wrappers, awareness pairs from
its train domains; one seed; every suite, the adaptive attacker included. `configs/demo.yaml` spells the same
values out; `configs/paper.yaml` runs every arm with three seeds and the full item counts.

A YAML/JSON file holds these fields. `train`, `arm_train`, `eval` and `attack` are mappings whose keys are fields of
`TrainConfig`, `EvalConfig` and `AttackConfig`; they are checked against those dataclasses before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

from opct.errors import OpctError

# Fields of the inner configs that the runner sets itself, per arm and seed.
RUNNER_TRAIN_FIELDS = ("method", "model", "pairs", "out", "seed", "resume")
RUNNER_EVAL_FIELDS = ("model", "adapter", "out", "seed", "train_families", "train_wrappers", "train_domains")
AXES = ("sycophancy", "jailbreak", "awareness")


def _f(default=None, help="", factory=None, **meta):
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help, **meta})
    return field(default=default, metadata={"help": help, **meta})


def _world_train(kind: str) -> list[str]:
    from opct.pairs import perturb as P
    from opct.world.lexicon import SAFETY, SAFETY_HELDOUT_DOMAINS

    if kind == "wrappers":
        return [w for w in P.WRAPPER_FAMILIES if w not in P.WRAPPER_HELDOUT]
    return [d for d in SAFETY if d not in SAFETY_HELDOUT_DOMAINS]


def demo_train() -> dict:
    """Training settings shared by every trained arm of the demo (measured to fit the 25-minute demo budget)."""
    return {"max_steps": 200, "batch_size": 8, "n_samples": 2, "lr": 1e-3, "max_new_tokens": 48,
            "lora_r": 16, "save_every": 50, "target_n": 1, "target_temperature": 0.0}


def demo_eval() -> dict:
    return {"n": 100}


@dataclass
class ExperimentConfig:
    name: str = _f("demo", "experiment name; everything is written under OUT/NAME/")
    model: str = _f("default", "'default' (the shipped organism), 'test' (a tiny organism built on the spot) or a "
                               "model directory written by save_pretrained")
    out: str = _f("runs", "root directory of experiments")
    arms: list[str] = _f(help="arms: base (no training) and methods of opct.methods.METHODS",
                         factory=lambda: ["base", "opct", "bct"])
    seeds: list[int] = _f(help="seeds; each arm runs once per seed", factory=lambda: [0])
    pairs: str = _f("", "your own training pairs (JSONL) instead of the world's; pairs whose meta.split is 'train' "
                        "are trained on, and the family lists below only label the evaluation's splits")
    sycophancy_families: list[str] = _f(help="bias families trained on (the others are held out)",
                                        factory=lambda: ["suggested_answer"])
    jailbreak_wrappers: list[str] = _f(help="jailbreak wrappers trained on (default: the world's train wrappers)",
                                       factory=lambda: _world_train("wrappers"))
    awareness_domains: list[str] = _f(help="safety domains trained on (default: the world's train domains)",
                                      factory=lambda: _world_train("domains"))
    per_family: Optional[int] = _f(None, "sycophancy and jailbreak items drawn per family (default: all)")
    benign: bool = _f(True, "also pair benign requests (jailbreak) and benign scenarios (awareness), so training "
                            "does not teach refusing or warning everywhere")
    train: dict = _f(help="TrainConfig fields shared by every trained arm", factory=demo_train, cli=False)
    arm_train: dict = _f(help="per-arm TrainConfig fields, e.g. {act: {lr: 1e-3}}", factory=dict, cli=False)
    eval: dict = _f(help="EvalConfig fields for every arm (suites, item counts, samples, ...)", factory=demo_eval,
                    cli=False)
    attack: dict = _f(help="AttackConfig fields (the adaptive attacker's budget)", factory=dict, cli=False)
    note: str = _f("The demo: smaller item counts and shorter training than configs/paper.yaml; one seed, so the "
                   "intervals are bootstrap intervals over items, not over seeds.",
                   "free text shown at the top of the report")
    report: bool = _f(True, "write report.html and results.md when every arm is done")
    threads: int = _f(0, "torch CPU threads (0: one thread for models under 100M parameters, which is faster for "
                         "these small, overhead-bound steps; else torch's default)")

    def __post_init__(self):
        from opct.methods import METHODS

        if not self.name or "/" in self.name:
            raise ValueError(f"name must be a non-empty directory name (got {self.name!r})")
        if not self.arms:
            raise ValueError("arms must name at least one arm")
        unknown = [a for a in self.arms if a != "base" and a not in METHODS]
        if unknown:
            raise ValueError(f"unknown arm(s) {', '.join(unknown)}; known: base, {', '.join(METHODS)}")
        if len(set(self.arms)) != len(self.arms) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("arms and seeds must not repeat")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        if self.per_family is not None and self.per_family < 1:
            raise ValueError(f"per_family must be >= 1 (got {self.per_family})")
        self._check_families()
        self._check_inner()

    def _check_families(self) -> None:
        from opct.pairs import perturb as P
        from opct.world.lexicon import SAFETY

        for name, known in (("sycophancy_families", P.BIAS_FAMILIES), ("jailbreak_wrappers", P.WRAPPER_FAMILIES),
                            ("awareness_domains", SAFETY)):
            bad = [x for x in getattr(self, name) if x not in known]
            if bad:
                raise ValueError(f"{name}: unknown {', '.join(bad)}; known: {', '.join(known)}")

    def _check_inner(self) -> None:
        from opct.evals.attack import AttackConfig
        from opct.evals.run import EvalConfig
        from opct.train.config import TrainConfig

        for name, cls, reserved in (("train", TrainConfig, RUNNER_TRAIN_FIELDS),
                                    ("eval", EvalConfig, RUNNER_EVAL_FIELDS), ("attack", AttackConfig, ())):
            _check_keys(name, getattr(self, name), cls, reserved)
        if not isinstance(self.arm_train, dict):
            raise ValueError("arm_train must map arm names to TrainConfig fields")
        for arm, values in self.arm_train.items():
            if arm not in self.arms:
                raise ValueError(f"arm_train: {arm!r} is not one of the arms ({', '.join(self.arms)})")
            _check_keys(f"arm_train.{arm}", values, TrainConfig, RUNNER_TRAIN_FIELDS)


def _check_keys(where: str, values, cls, reserved) -> None:
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be a mapping of {cls.__name__} fields")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{where}: unknown {cls.__name__} field(s) {', '.join(unknown)}")
    clash = sorted(set(values) & set(reserved))
    if clash:
        raise ValueError(f"{where}: {', '.join(clash)} {'is' if len(clash) == 1 else 'are'} set by the runner per "
                         f"arm and seed; remove {'it' if len(clash) == 1 else 'them'}")


def load_experiment(path=None, **overrides) -> ExperimentConfig:
    """Defaults < the file at `path` (YAML or JSON) < `overrides` (e.g. CLI flags)."""
    from opct.config import load_config_file

    data = load_config_file(path) if path else {}
    names = {f.name for f in fields(ExperimentConfig)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise OpctError(f"{path}: unknown experiment field(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    try:
        return ExperimentConfig(**{**data, **overrides})
    except (TypeError, ValueError) as e:
        raise OpctError(f"{path or 'experiment'}: {e}") from None
