"""`ExperimentConfig`: one experiment = a model, the training pairs, the arms, the seeds and the budgets.

Its defaults ARE the README's demo (`make demo`): the shipped default organism; arms base, opct and bct; on every
axis that makes pairs, what `opct.axes` says the default experiment trains on (sycophancy: the suggested-answer
family; jailbreak and awareness: the world's training wrappers and domains); one seed; every axis evaluated, the
adaptive attacker included. `configs/demo.yaml` spells the same values out; `configs/paper.yaml` runs every arm with
three seeds and the full item counts.

Arms are named variants of a method: `arms: {opct: {method: opct}, opct_topk: {method: opct, estimator: topk},
bct: {method: bct}}`; every key but the arm keys below is a TrainConfig field that overrides the shared `train`
block for that arm. The list form `arms: [base, opct, bct]` is shorthand for arms named after their methods.
Methods that train nothing: `base` (the starting model) and `teacher` (the starting model answering the *teacher*
side of every probe: the OPCT paper's oracle ceiling). Arm keys besides TrainConfig's (`ARM_KEYS`):
  method          base, teacher, or a key of opct.methods.METHODS;
  init_from       another arm (earlier in the list) whose trained adapter this arm starts from, the teacher staying
                  the starting model (the paper's SFT+OPCT: `{method: opct, init_from: bct}`);
  benign_replay   that many benign anchor pairs (teacher = student = a benign prompt of the world that no evaluation
                  asks) mixed into this arm's training pairs: for BCT, the model's own greedy answers to benign
                  prompts at weight 1 (the paper's benign-regularised BCT). The pairs go through the *method's own*
                  loss (under OPCT: a KL to the starting model on the benign prompt; under ACT: an activation
                  distance), so what they regularise depends on the method. The method-independent form is the
                  TrainConfig field `replay_frac` (with `replay_schedule: mixed | sequential`), usable in `train` or
                  in any arm: the same pool of prompts (`opct.pairs.make.replay_pairs`), answered greedily by the
                  starting model and trained with an SFT loss beside any method's (`opct.train.replay`). For BCT
                  the two are the same objective; `benign_replay: N` counts pairs, `replay_frac` a share of examples.

`train`, `eval` and `attack` are TrainConfig, EvalConfig and AttackConfig; in a file they are mappings of those
fields, checked by type and range with the rest of the file before anything runs (`opct.config`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from typing import ClassVar, Optional

from opct.config import SEED, ConfigError, construct, option, validate
from opct.errors import OpctError
from opct.evals.attack import AttackConfig
from opct.evals.run import EvalConfig
from opct.evals.trained import check_pair_options, check_trained, parse_trained
from opct.files import is_dir_name
from opct.trackers import PACKAGES as TRACKERS
from opct.train.config import TrainConfig, check_method, check_used

# Fields of the inner configs that the runner sets itself, per arm and seed.
RUNNER_TRAIN_FIELDS = ("method", "model", "pairs", "out", "seed", "resume")
RUNNER_EVAL_FIELDS = ("model", "adapter", "out", "seed", "trained", "pair_options", "prompt_side", "axis_items")
BASE = "base"  # the arm that trains nothing
TEACHER = "teacher"  # trains nothing; evaluated on the teacher side of every probe
UNTRAINED = (BASE, TEACHER)
ARM_KEYS = ("method", "init_from", "benign_replay")


def demo_train() -> TrainConfig:
    """Training settings shared by every trained arm of the demo (measured to fit the demo's time budget)."""
    return TrainConfig(max_steps=200, batch_size=8, n_samples=2, lr=1e-3, max_new_tokens=48, lora_r=16,
                       save_every=50, target_n=1, target_temperature=0.0)


def demo_eval() -> EvalConfig:
    return EvalConfig(n=100)


def default_trained() -> dict[str, list[str]]:
    from opct.axes import AXES

    # an axis whose default is to train on nothing (prefill) is left out: not named means the same
    return {name: a.default_trained() for name, a in AXES.items() if a.task is not None and a.default_trained()}


def _arm_names(values: list[str]) -> list[str]:
    return list(values)


# configs/demo.yaml's note, which `opct demo` shows; not the default note, as its "one seed" is not true of others
DEMO_NOTE = ("The demo: smaller item counts and shorter training than configs/paper.yaml; one seed, so the intervals "
             "are bootstrap intervals over items, not over seeds.")


@dataclass
class ExperimentConfig:
    CONFIG_LABEL: ClassVar[str] = "experiment"

    name: str = option("demo", "experiment name; everything is written under OUT/NAME/")
    model: str = option("default", "a subject (opct.subjects: 'default', the shipped organism; 'test', a tiny one "
                                   "built on the spot; ...) or a model directory written by save_pretrained",
                        nonempty=True)
    out: str = option("runs", "root directory of experiments", nonempty=True)
    arms: dict[str, dict] = option(help="arms: a list of method names (base = no training), or a mapping of arm "
                                        "names to {method: ..., TrainConfig overrides}; on the command line, names "
                                        "of the file's arms or of methods", factory=lambda: ["base", "opct", "bct"],
                                   flag_parse=_arm_names, metavar="ARM")
    seeds: list[int] = option(help="seeds; each arm runs once per seed", factory=lambda: [0], nonempty=True, **SEED)
    pairs: str = option("", "your own training pairs (JSONL) instead of the world's; pairs whose meta.split is "
                            "'train' are trained on, and `trained` labels the evaluation's splits (a train pair of a "
                            "family it holds out is refused)")
    trained: dict[str, list[str]] = option(
        help="what goes to training, per axis: {axis: [families]} (on the command line AXIS=F1,F2); every other "
             "family, and every axis not named, is held out", factory=default_trained, metavar="AXIS=FAMILIES",
        flag_parse=parse_trained)
    per_family: Optional[int] = option(None, "items drawn per family on axes that perturb items (default: all)", ge=1)
    benign: bool = option(True, "also pair benign requests (jailbreak) and benign scenarios (awareness), so training "
                                "does not teach refusing or warning everywhere")
    pair_options: dict[str, dict] = option(help="per axis, options of its pairs, e.g. {awareness: {teacher: guideline}} "
                                                "(the paper's system-message teacher); the teacher arm's probes follow "
                                                "them", factory=dict, cli=False)
    train: TrainConfig = option(help="TrainConfig fields shared by every trained arm", factory=demo_train, cli=False)
    arm_train: dict[str, dict] = option(help="per-arm TrainConfig overrides, e.g. {act: {lr: 1e-3}} (the same as "
                                             "giving them in the arm's mapping)", factory=dict, cli=False)
    eval: EvalConfig = option(help="EvalConfig fields for every arm (axes, item counts, samples, ...)",
                              factory=demo_eval, cli=False)
    attack: AttackConfig = option(help="AttackConfig fields (the adaptive attacker's budget)", factory=AttackConfig,
                                  cli=False)
    note: str = option("", "free text shown at the top of the report (none by default: the report says itself how "
                           "its intervals are made, from the seeds that finished)")
    report: bool = option(True, "write report.html and results.md when every arm is done")
    threads: int = option(0, "torch CPU threads (0: one thread for models under 100M parameters, which is faster for "
                             "these small, overhead-bound steps; else torch's default)", ge=0, threads=True)
    log_with: list[str] = option([], "trackers (tensorboard, wandb, ...; opct/trackers.py) for every cell's training "
                                     "and evaluation, and the experiment's finished cells", choices=list(TRACKERS))
    progress: bool = option(True, "progress bars of every cell's training and evaluation (--no-progress: none; "
                                  "train.progress / eval.progress turn off one of them)")
    trust_remote_code: bool = option(False, "run the model directory's own Python code, in training and evaluation "
                                            "(a flag only: never from a file; prints a warning)", file=False)

    def __post_init__(self):
        self.arms = _normalise_arms(self.arms)
        for fname, cls, reserved in (("train", TrainConfig, RUNNER_TRAIN_FIELDS),
                                     ("eval", EvalConfig, RUNNER_EVAL_FIELDS), ("attack", AttackConfig, ())):
            if isinstance(getattr(self, fname), dict):
                setattr(self, fname, construct(cls, getattr(self, fname), fname, reserved))
        validate(self)
        if not is_dir_name(self.name):
            raise ConfigError("name", f"must be a non-empty directory name (got {self.name!r})")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("seeds", "arms and seeds must not repeat")
        check_trained(self.trained)
        check_pair_options(self.pair_options)
        for arm, values in self.arm_train.items():
            if arm not in self.arms:
                raise ConfigError("arm_train", f"{arm!r} is not one of the arms ({', '.join(self.arms)})")
            self.arms[arm] = {**self.arms[arm], **values}
        self.arm_train = {}
        for i, (arm, spec) in enumerate(self.arms.items()):
            _check_arm(arm, spec, self.train, list(self.arms)[:i], self.arms)
        _check_read(self)

    def arm_config(self, arm: str, **runner: object) -> TrainConfig:
        """The arm's TrainConfig: the shared `train` block, the arm's overrides, then what the runner sets."""
        spec = {k: v for k, v in self.arms[arm].items() if k not in ARM_KEYS}
        return dataclasses.replace(self.train, **{**spec, **runner}, method=self.arms[arm]["method"])

    def method(self, arm: str) -> str:
        return self.arms[arm]["method"]

    def resolved(self, model_dir: str) -> dict:
        """What experiment.json records: every setting, the arms as a list of names plus their specs."""
        out = asdict(self)
        out["arm_specs"] = out.pop("arms")
        out["arms"] = list(self.arms)
        out["model_dir"] = model_dir
        return out


def _normalise_arms(arms) -> dict:
    """A list of names -> {name: {method: name}}; a mapping's values -> {method: ..., overrides} (method defaults to
    the arm's name)."""
    if isinstance(arms, (list, tuple)):
        for i, a in enumerate(arms):  # `[base, {x: {method: bct}}]` was a TypeError traceback (2026-12-07)
            if not isinstance(a, str):
                raise ConfigError(f"arms[{i}]", f"must be a method name (got {json.dumps(a, default=str)[:60]}); to "
                                                "give arms settings, write arms as a mapping: {base: {}, x: {method: "
                                                "bct, ...}}")
        if len(set(map(str, arms))) != len(arms):
            raise ConfigError("arms", "arms and seeds must not repeat")
        arms = {a: None for a in arms}
    if not isinstance(arms, dict):
        raise ConfigError("arms", f"must be a list of method names or a mapping of arm names to settings "
                                  f"(got {json.dumps(arms, default=str)}"
                                  + ("; write [base, opct, bct], or leave it out for those)" if arms is None else
                                     f"; write [{arms}] for one arm)"))
    if not arms:
        raise ConfigError("arms", "must name at least one arm")
    out = {}
    for name, spec in arms.items():
        if not is_dir_name(name):  # OUT/NAME/<arm>/<seed>
            raise ConfigError("arms", f"an arm name must be a non-empty directory name (got {name!r})")
        if spec is None:
            spec = {}
        if not isinstance(spec, dict):
            raise ConfigError(f"arms.{name}", f"must be a mapping of settings, e.g. {{method: opct}} (got {spec!r})")
        out[name] = {"method": name, **spec}
    return out


def _check_arm(arm: str, spec: dict, train: TrainConfig, earlier: list[str], arms: dict) -> None:
    from opct.methods import METHODS

    method = spec.get("method")
    if method not in UNTRAINED and method not in METHODS:
        raise ConfigError(f"arms.{arm}.method" if method != arm else "arms",
                          f"unknown arm(s) {method}; known: {', '.join(UNTRAINED)}, {', '.join(METHODS)}")
    overrides = {k: v for k, v in spec.items() if k not in ARM_KEYS}
    extra = {k: v for k, v in spec.items() if k in ARM_KEYS and k != "method"}
    if method in UNTRAINED and (overrides or extra):
        raise ConfigError(f"arms.{arm}", f"the {method} arm trains nothing; remove "
                                         f"{', '.join(sorted({**overrides, **extra}))}")
    if "init_from" in extra:
        src = extra["init_from"]
        if src not in earlier or arms[src]["method"] in UNTRAINED:
            raise ConfigError(f"arms.{arm}.init_from", f"must name a trained arm listed before {arm!r} (got {src!r})")
        if not arms[src].get("lora", train.lora) or not spec.get("lora", train.lora):
            raise ConfigError(f"arms.{arm}.init_from", "continues a LoRA adapter: both arms must train LoRA")
    if "benign_replay" in extra:
        n = extra["benign_replay"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ConfigError(f"arms.{arm}.benign_replay", f"must be an integer >= 0 (got {n!r})")
        from opct.world.items import replay_items

        if n > (pool := len(replay_items())):  # was cut to the pool, experiment.json saying n (2026-12-07)
            raise ConfigError(f"arms.{arm}.benign_replay", f"must be at most {pool}, the world's benign prompts "
                                                           f"(got {n})")
    try:
        tc = construct(TrainConfig, {**_given(train), **overrides}, reserved=RUNNER_TRAIN_FIELDS)
        if method not in UNTRAINED:  # its method's rules; an arm's own setting its method ignores (the shared
            tc = dataclasses.replace(tc, method=method)  # block's are for any arm)
            check_method(tc)
            check_used(tc, overrides)
    except ConfigError as e:
        raise e.under(f"arms.{arm}") from None


def _check_read(cfg: ExperimentConfig) -> None:
    """A ConfigError for a setting no cell reads, as `opct eval` refuses its flags (`opct.evals.used`): every cell
    evaluates `eval.suite` (the teacher arm without the attacker), so the shared eval and attack blocks are checked
    against it; `pair_options.AXIS` is read only where AXIS is trained on or evaluated (accepted and ignored until
    2026-12-07). `trained` must give training something when an arm trains."""
    from opct.config import unread
    from opct.evals.run import suite_names
    from opct.evals.used import check_attack_used, check_used

    for block, check in (("eval", lambda: check_used(cfg.eval)),
                         ("attack", lambda: check_attack_used(cfg.eval, cfg.attack))):
        try:
            check()
        except ConfigError as e:
            raise e.under(block) from None
    # `pairs` and a trained axis's pair_options are not refused where no arm trains: `opct run FILE --arms base`
    # picks the base arm of a file whose other arms read them
    trains = [a for a in cfg.arms if cfg.method(a) not in UNTRAINED]
    if trains and not cfg.pairs and not any(cfg.trained.values()):
        raise ConfigError("trained", f"trains on nothing (every list is empty), but arm {trains[0]} trains: name the "
                                     f"families to train on, e.g. {{sycophancy: [suggested_answer]}}, or give pairs")
    read = set(suite_names(cfg.eval.suite)) | {a for a, f in cfg.trained.items() if f}
    for axis in cfg.pair_options:
        if axis not in read:
            raise unread(f"pair_options.{axis}", f"eval.suite {cfg.eval.suite}, no arm training on {axis}",
                         f"the {axis} axis", f"add {axis} to eval.suite or to trained, or remove it")


def _given(train: TrainConfig) -> dict:
    """The fields of `train` that differ from TrainConfig's defaults (and that an arm may set)."""
    d = TrainConfig()
    return {f.name: getattr(train, f.name) for f in dataclasses.fields(TrainConfig)
            if getattr(train, f.name) != getattr(d, f.name) and f.name not in RUNNER_TRAIN_FIELDS}


def _legacy_trained(data: dict, path) -> dict:
    """Experiment files written before `trained` existed name one list per axis (`sycophancy_families`, ...): turn
    them into `trained`, each list checked under the name the file gave it."""
    from opct.axes import AXES

    given = {}
    for name, a in AXES.items():
        for key in a.legacy_keys[:1]:
            if key in data:
                fams = data.pop(key)
                if not isinstance(fams, list):
                    raise OpctError(f"{path}: {key}: must be a list (got {fams!r})")
                bad = [f for f in fams if f not in a.families]
                if bad and not a.open_families:
                    raise OpctError(f"{path}: {key}: unknown {', '.join(map(str, bad))}; known: "
                                    f"{', '.join(a.families)}")
                given[name] = fams
    if given:
        if "trained" in data:
            raise OpctError(f"{path}: give either `trained` or the older per-axis lists "
                            f"({', '.join(a.legacy_keys[0] for a in AXES.values() if a.legacy_keys)}), not both")
        data["trained"] = {**default_trained(), **given}
    return data


def load_experiment(path=None, args=None, **overrides) -> ExperimentConfig:
    """Defaults < the file at `path` (YAML or JSON) < the flags given in `args` < `overrides`."""
    from opct.config import build_config, flag_values, load_config_file

    data = _legacy_trained(load_config_file(path), path) if path else None
    flags = flag_values(ExperimentConfig, args)
    if "arms" in flags and data is not None and data.get("arms") is not None and "arms" not in overrides:
        # --arms picks arms of the file by name (its list or its mapping: a list was refused as "must be a mapping",
        # so the README's `opct run configs/demo.yaml --arms base opct act` failed until 2026-12-07); a name the file
        # does not define is the method of that name. The file's arm_train of an arm not picked is left with it.
        try:
            file_arms = _normalise_arms(data["arms"])
        except ConfigError as e:
            raise OpctError(f"{path}: {e}") from None
        from opct.flags import first_repeat

        if (twice := first_repeat(flags["arms"])) is not None:
            raise OpctError(f"--arms: {twice} named twice")
        overrides["arms"] = {a: file_arms.get(a) for a in flags["arms"]}
        if isinstance(data.get("arm_train"), dict) and "arm_train" not in overrides:
            for a in data["arm_train"]:
                if a not in file_arms:
                    raise OpctError(f"{path}: arm_train: {a!r} is not one of the arms ({', '.join(file_arms)})")
            overrides["arm_train"] = {a: v for a, v in data["arm_train"].items() if a in flags["arms"]}
    return build_config(ExperimentConfig, args, path, data, **overrides)
