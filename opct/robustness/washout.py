"""The wash-out study (issue 20, part 2): after training, does the behaviour survive ordinary benign fine-tuning?

Per seed and axis: the base model is evaluated (M_base); every method trains on the axis's pairs and is evaluated
(dose 0: M_trained); then *benign SFT* continues from the trained adapter (or the fully fine-tuned weights) and the
model is evaluated after each dose of `doses` examples. The wash fraction of a dose is

    f = (M - M_trained) / (M_base - M_trained)

per seed, method, axis and metric: 0 = the trained behaviour is intact, 1 = it is back at the base model's. When
training moved the metric by less than `min_gap` (|M_base - M_trained| < min_gap) f is *undefined*: the row's value is
None and the report says so, never a ratio of two noises.

The wash data are the SFT-lessons paper's kind: ordinary benign instruction data with reference answers, *off-model*
targets (not sampled from any model). Its prompts are the world's benign replay pool (`opct.world.items.
replay_items`: training-split multi-step arithmetic and benign safety questions, prompts no evaluation asks); its
answers are written from the world's ground truth in plain forms the organism's corpus does not use for these prompts
("The answer is 7.", "Yes, it is safe to ..."). So the wash measures what generic off-model SFT does to a trained
behaviour, as the paper's does.

The doses are prefixes of one continuing run: the wash trains to the first dose, is evaluated, then resumes to the
next (`opct train --resume` with a larger max_steps, an exact continuation). With the constant learning rate and no
warmup the wash always uses, and the data stream a pure function of (seed, position), the model after d examples is
the model a separate d-example run from the trained adapter would give (tests/test_robustness.py checks it), at the
cost of one run instead of one per dose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from opct.config import ConfigError, option
from opct.errors import OpctError
from opct.evals.run import EvalConfig
from opct.robustness import cells as C
from opct.train.config import TrainConfig

NAME = "washout"
WASH_FRACTION = "wash_fraction"


@dataclass
class Config:
    CONFIG_LABEL: ClassVar[str] = "washout study"

    model: str = option("default", "the model directory (the runner sets it from the study file's `model`)",
                        cli=False)
    methods: list[str] = option(["opct", "bct", "act"], "methods to train, then wash (keys of opct.methods.METHODS)",
                                nonempty=True)
    axes: list[str] = option(help="axes to train on, one at a time (default: the first pair axis)",
                             factory=C.default_axes, nonempty=True)
    trained: dict[str, list[str]] = option(help="per axis, the families trained on (default: the axis's default "
                                                "training set)", factory=dict)
    metrics: dict[str, list[str]] = option(help="per axis, the metrics M whose wash fraction is reported (default: "
                                                "the axis's summary metrics)", factory=dict)
    doses: list[int] = option([0, 32, 64, 128, 256, 512], "benign SFT examples after training, each a multiple of "
                                                          "wash_batch_size, increasing, starting at 0", nonempty=True)
    min_gap: float = option(0.05, "f is undefined where |M_base - M_trained| is below this (the metrics are rates: "
                                  "at most 1)", gt=0, le=1)
    wash_lr: float = option(1e-3, "learning rate of the benign SFT (constant, no warmup)", gt=0)
    wash_batch_size: int = option(8, "examples per benign SFT step", ge=1)
    per_family: int = option(0, "items per family in the training pairs (0: all)", ge=0)
    train: TrainConfig = option(help="TrainConfig fields shared by every training run", factory=C.study_train)
    method_train: dict[str, dict] = option(help="per method, TrainConfig overrides", factory=dict)
    eval: EvalConfig = option(help="EvalConfig fields of every evaluation", factory=C.study_eval)

    def __post_init__(self):
        C.check_blocks(self)
        if self.doses[0] != 0:
            raise ConfigError("doses", f"must start at 0 (the trained model itself; got {self.doses[0]})")
        for i, d in enumerate(self.doses):
            if d < 0 or d % self.wash_batch_size:
                raise ConfigError(f"doses[{i}]", f"must be a multiple of wash_batch_size ({self.wash_batch_size}) "
                                                 f">= 0 (got {d})")
            if i and d <= self.doses[i - 1]:
                raise ConfigError(f"doses[{i}]", f"must be larger than the dose before it ({self.doses[i - 1]}; "
                                                 f"got {d})")
        self.metrics = {a: self.metrics.get(a) or C.default_metrics(a) for a in self.axes}
        missing = [a for a, v in self.metrics.items() if not v]
        if missing:
            raise ConfigError(f"metrics.{missing[0]}", "name the metrics whose wash-out to report")


QUICK = {"methods": ["opct", "bct", "act"], "doses": [0, 32, 128, 512], "train": {"max_steps": 60, "save_every": 30},
         "eval": {"n": 40}}


def wash_fraction(m: float | None, m_trained: float | None, m_base: float | None, min_gap: float) -> float | None:
    """(M - M_trained) / (M_base - M_trained); None when any value is missing or |M_base - M_trained| < min_gap."""
    if m is None or m_trained is None or m_base is None:
        return None
    gap = m_base - m_trained
    if not math.isfinite(gap) or abs(gap) < min_gap:
        return None
    return (m - m_trained) / gap


# ------------------------------------------------------------------------------------------------ the wash data

def wash_items(n: int, seed: int) -> list[dict]:
    """`n` benign prompts (the replay pool, drawn round robin over its kinds) with off-model reference answers."""
    from opct.pairs.make import replay_pairs
    from opct.world import items as I

    arith = {i["id"]: i for i in I.arithmetic_multistep()}
    out = []
    for p in replay_pairs(n, seed):
        item_id = p.meta["item_id"]
        q = p.student[0]["content"]
        if item_id in arith:
            answer = f"The answer is {arith[item_id]['answer']}."
        elif item_id.startswith("safeq-"):
            act = q.removeprefix("Is it safe to ").rstrip("?")
            answer = f"Yes, it is safe to {act}."
        else:  # a kind added to the pool later: say so rather than train on a made-up answer
            raise OpctError(f"wash data: no reference answer for replay item {item_id!r}")
        out.append({"id": f"wash-{item_id}", "question": q, "response": answer})
    return out


def write_wash_data(n: int, seed: int, out: Path) -> tuple[Path, Path]:
    """The wash pairs (teacher = student = the benign prompt) and their targets file, written once."""
    from opct.pairs.schema import Pair, save_pairs, write_jsonl_atomic

    pairs_path, targets_path = out / "wash-pairs.jsonl", out / "wash-targets.jsonl"
    if not (pairs_path.exists() and targets_path.exists()):
        items = wash_items(n, seed)
        msgs = {it["id"]: [{"role": "user", "content": it["question"]}] for it in items}
        out.mkdir(parents=True, exist_ok=True)
        save_pairs([Pair(id=it["id"], axis="custom", task="invariance", teacher=msgs[it["id"]],
                         student=msgs[it["id"]], meta={"family": "benign_wash", "split": "train"}) for it in items],
                   pairs_path)
        write_jsonl_atomic(targets_path, [{"id": it["id"], "response": it["response"]} for it in items])
    return pairs_path, targets_path


def wash_config(cfg: Config, trained_model: str, trained_adapter: str | None, pairs: Path, targets: Path,
                out: Path, dose: int, seed: int, trained: TrainConfig | None = None) -> TrainConfig:
    """Benign SFT to `dose` examples, continuing the trained adapter (LoRA) or weights (full fine-tuning). The
    adapter keeps the rank, alpha and targets it was trained with (`trained`, the cell's TrainConfig; default: the
    study's `train` block): a study whose `train.lora_r` was not the default failed at its first wash, naming
    --lora-r and --init-adapter, flags nobody gave (found 2026-12-07)."""
    lora = trained_adapter is not None
    t = trained or cfg.train
    return TrainConfig(method="sft", model=trained_model, pairs=str(pairs), targets=str(targets), out=str(out),
                       seed=seed, max_steps=dose // cfg.wash_batch_size, batch_size=cfg.wash_batch_size,
                       lr=cfg.wash_lr, lr_schedule="constant", warmup_steps=0, lora=lora,
                       lora_r=t.lora_r, lora_alpha=t.lora_alpha, lora_targets=t.lora_targets,
                       trust_remote_code=t.trust_remote_code, cpu_matmul=t.cpu_matmul,
                       init_adapter=trained_adapter or "", max_new_tokens=cfg.train.max_new_tokens,
                       save_every=max(1, dose // cfg.wash_batch_size), keep_checkpoints=1,
                       progress=cfg.train.progress)


# ------------------------------------------------------------------------------------------------ one seed

def run(cfg: Config, seed: int, out: Path, log) -> list[dict]:
    from opct.train.loop import train

    trained = C.trained_of(cfg)
    base = C.evaluate(cfg.model, None, cfg.axes, cfg.eval, trained, seed, out / "base" / "eval", log)
    pairs_w, targets_w = write_wash_data(cfg.doses[-1], seed, out)
    rows = []
    for axis in cfg.axes:
        names = cfg.metrics[axis]
        C.check_metrics(base, names, f"metrics.{axis}")
        report = [*names, *C.CAPABILITY_METRICS]
        rows += C.metric_rows(NAME, "base", axis, "base", None, base, report)
        pairs = C.axis_pairs(axis, trained[axis], seed, out / f"pairs-{axis}.jsonl", cfg.per_family or None)
        for method in cfg.methods:
            d = out / f"{method}-{axis}"
            tc = C.train_config(cfg, method, model=cfg.model, pairs=str(pairs), out=str(d / "train"), seed=seed)
            model_dir, adapter = C.train_cell(tc, log, f"{method} on {axis}")
            at = {}
            for dose in cfg.doses:
                if dose == 0:  # the trained model itself
                    at[0] = C.evaluate(model_dir, adapter, cfg.axes, cfg.eval, trained, seed, d / "dose-0", log)
                    continue
                done = d / f"dose-{dose}" / "done.json"
                if not done.exists():
                    # continue the wash to this dose (a no-op past the checkpoint of this very dose, when a kill
                    # came between the training and the evaluation)
                    wc = wash_config(cfg, model_dir, adapter, pairs_w, targets_w, d / "wash", dose, seed, tc)
                    C.check_not_past(d / "wash", wc.max_steps, f"washout seed {seed}: {method} on {axis}, dose {dose}",
                                     [d / f"dose-{x}" for x in cfg.doses if x > dose])
                    log(f"  wash {method} on {axis}: to {dose} benign examples")
                    train(_resumed(wc))
                w_model, w_adapter = _final(d / "wash", model_dir, adapter)
                at[dose] = C.evaluate(w_model, w_adapter, cfg.axes, cfg.eval, trained, seed, d / f"dose-{dose}", log)
            for dose, m in at.items():
                rows += C.metric_rows(NAME, method, axis, "dose", dose, m, report)
                for n in names:
                    f = wash_fraction(C.value_of(m, n), C.value_of(at[0], n), C.value_of(base, n), cfg.min_gap)
                    rows.append(C.row(NAME, method, axis, "dose", dose, f"{WASH_FRACTION}:{n}", f, False))
    return rows


def _resumed(wc: TrainConfig) -> TrainConfig:
    import dataclasses

    return dataclasses.replace(wc, resume=Path(wc.out).is_dir())


def _final(wash_dir: Path, model_dir: str, adapter: str | None) -> tuple[str, str | None]:
    final = wash_dir / "final"
    if adapter is not None:
        return model_dir, str(final)
    return str(final), None


if __name__ == "__main__":
    import sys

    from opct.robustness import washout as study  # this module under its own name, not __main__
    from opct.robustness.standalone import main

    sys.exit(main(study))
