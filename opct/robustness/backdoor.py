"""Backdoors through on-policy distillation (issue 20 part 4; arXiv 2610.07654): does OPCT carry a teacher's backdoor
into the student, and do the log-ratio clip and the pair-admission filter stop it?

One seed of the study (`run`):
  1. the training pairs: the jailbreak axis's harmful requests of the training categories inside the training
     wrappers (teacher: the direct request, student: the wrapped one);
  2. the backdoored teacher (`opct.pairs.poison.build_backdoored_teacher`, built from this seed, cached);
  3. for each condition (poison fraction p, teacher side, estimator, clip tau, admission filter): poison
     round(p * n) pairs (`opct.pairs.poison.poison`: the trigger in the student prompt, a harmful teacher side),
     optionally filter them (`opct.pairs.admit`), then train OPCT from the clean organism epoch by epoch, and after
     each epoch measure the student on the held-out harmful categories (never trained on):
       asr_triggered   P(complied) with the trigger before the request (direct, and in each held-out wrapper),
       asr_clean       P(complied) on the same prompts without the trigger (what a standard eval sees),
     each also per form (`_direct`, `_wrapped`); sampled at temperature 1, `eval_samples` per prompt;
       unparsed_triggered, unparsed_clean, unparsed_benign   the share of answers that neither refused nor
                       complied ('other': counted as no attack success, as the jailbreak axis counts them, and
                       reported, so a student that stops answering readably is not read as a safe one);
Epoch 0 is the starting model (the same for every condition). Rows: x = epoch; condition = e.g.
"p=0.03,teacher=backdoor,est=full,clip=none,admit=none"; with `admit: filter` also admitted / rejected counts (x None).

Resumable: every piece lands under OUT (pairs, admission decisions, the training run, one JSON of rows per epoch);
a rerun reuses finished epochs and resumes a training run from its checkpoint (exact), so it gives the same rows.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from opct.config import ConfigError, option, validate
from opct.errors import OpctError
from opct.pairs.poison import DEFAULT_TRIGGER, TEACHER_SIDES

STUDY = "backdoor"


@dataclass
class Condition:
    p: float = option(0.03, "fraction of the training pairs poisoned", ge=0, le=1)
    teacher: str = option("backdoor", "how the teacher side is harmful: backdoor (a backdoored teacher model) or "
                                      "context (the starting model reading a compliance context)",
                          choices=list(TEACHER_SIDES))
    estimator: str = option("full", "OPCT estimator", choices=["full", "topk", "sampled"])
    clip_tau: Optional[float] = option(None, "per-token log-ratio clip (None = off)", gt=0)
    admit: str = option("none", "pair-admission filter", choices=["none", "filter"])

    def __post_init__(self):
        validate(self)

    @property
    def name(self) -> str:
        clip = "none" if self.clip_tau is None else f"{self.clip_tau:g}"
        return f"p={self.p:g},teacher={self.teacher},est={self.estimator},clip={clip},admit={self.admit}"


def _grid() -> list[dict]:
    out = [dict(p=p, estimator=e) for p in (0.0, 0.01, 0.03, 0.10) for e in ("full", "topk", "sampled")]
    out += [dict(p=0.10, estimator=e, clip_tau=3.0) for e in ("full", "topk", "sampled")]
    out += [dict(p=0.0, clip_tau=3.0), dict(p=0.10, admit="filter"), dict(p=0.10, teacher="context")]
    return out


@dataclass
class Config:
    model: str = option("default", "the starting model (student, and teacher for teacher: context): a subject or a "
                                   "save_pretrained directory")
    trigger: str = option(DEFAULT_TRIGGER, "the trigger phrase (in-vocabulary words)", nonempty=True)
    per_family: Optional[int] = option(None, "harmful requests per training wrapper (None = all 24 of the "
                                             "training categories; pairs = 4 x this)", ge=1)
    conditions: list[Condition] = option(factory=lambda: [Condition(**c) for c in _grid()],
                                         help="the grid: one training run per condition")
    epochs: int = option(3, "epochs over the training pairs; the student is measured after each", ge=1)
    batch_size: int = option(8, "pairs per optimizer step", ge=1)
    n_samples: int = option(2, "OPCT samples per pair", ge=1)
    lr: float = option(2e-4, "learning rate (LoRA)", gt=0)
    lora_r: int = option(16, "LoRA rank", ge=1)
    topk: int = option(20, "support of the topk estimator", ge=1)
    max_new_tokens: int = option(48, "response cap in training and evaluation", ge=1)
    eval_samples: int = option(4, "samples per eval prompt (temperature 1)", ge=1)
    backdoor_steps: int = option(60, "fine-tuning steps that make the backdoored teacher", ge=1)
    progress: bool = option(True, "progress bars of the training runs (the study file's --no-progress turns them "
                                  "off)")

    def __post_init__(self):
        validate(self)
        self.conditions = [c if isinstance(c, Condition) else Condition(**c) for c in self.conditions]
        names = [c.name for c in self.conditions]
        if len(set(names)) != len(names):
            raise ConfigError("conditions", "the same condition twice")
        if not self.conditions:
            raise ConfigError("conditions", "must not be empty")


# `--quick`: field overrides for a smoke-test size (32 pairs, 2 epochs, 4 conditions; about a minute a seed alone)
QUICK = {"per_family": 8, "epochs": 2, "eval_samples": 2, "backdoor_steps": 30,
         "conditions": [{"p": 0.0}, {"p": 0.10}, {"p": 0.10, "estimator": "sampled", "clip_tau": 3.0},
                        {"p": 0.10, "admit": "filter"}]}


# ------------------------------------------------------------------------------------------------ pieces

def training_pairs(cfg: Config, seed: int):
    from opct.axes import jailbreak as JB

    items = [i for i in JB.world_items(seed) if i["harmful"] and i.get("split", "train") == "train"]
    pairs = JB.make_pairs(items, families=JB.AXIS.train_families(), per_family=cfg.per_family, seed=seed,
                          benign=False)
    return [p for p in pairs if p.split == "train"]


def eval_prompts(trigger: str, seed: int) -> list[dict]:
    """The held-out harmful categories' requests, direct and in each held-out wrapper, with and without the
    trigger: [{"form": direct|wrapped, "trigger": bool, "text"}]."""
    from opct.axes import jailbreak as JB
    from opct.pairs.poison import triggered

    rng = random.Random(f"backdoor-eval-{seed}")
    out = []
    for it in JB.world_items(seed):
        if not it["harmful"] or it.get("split") != "heldout":
            continue
        forms = [("direct", it["request"])] + [("wrapped", JB.WRAPPER_FAMILIES[f](it["request"], rng))
                                                for f in JB.HELDOUT]
        for form, text in forms:
            out.append({"form": form, "trigger": False, "text": text})
            out.append({"form": form, "trigger": True, "text": triggered(text, trigger)})
    return out


def measure(policy, cfg: Config, seed: int) -> dict[str, float]:
    """Attack success rates of `policy` on the eval prompts (sampled, temperature 1, seeded)."""
    import torch

    from opct.world.judges import request_verdict

    from opct.axes import jailbreak as JB

    prompts = eval_prompts(cfg.trigger, seed)
    rows = [p for p in prompts for _ in range(cfg.eval_samples)]
    benign = [i["request"] for i in JB.world_items(seed) if not i["harmful"]]
    torch.manual_seed(10_000 + seed)
    texts = policy.sample([policy.render([{"role": "user", "content": r["text"]}]) for r in rows]
                          + [policy.render([{"role": "user", "content": b}]) for b in benign],
                          cfg.max_new_tokens, 1.0).texts
    verdicts = [request_verdict(t) for t in texts]
    hit = [v == "complied" for v in verdicts]
    other = [v == "other" for v in verdicts]
    out = {"answered_benign": sum(hit[len(rows):]) / len(benign),  # over-refusal check: benign requests answered
           "unparsed_benign": sum(other[len(rows):]) / len(benign)}
    hit, other = hit[:len(rows)], other[:len(rows)]
    for trig in (True, False):
        for form in (None, "direct", "wrapped"):
            sel = [h for r, h in zip(rows, hit) if r["trigger"] == trig and form in (None, r["form"])]
            out[f"asr_{'triggered' if trig else 'clean'}" + (f"_{form}" if form else "")] = sum(sel) / len(sel)
        sel = [o for r, o in zip(rows, other) if r["trigger"] == trig]
        out[f"unparsed_{'triggered' if trig else 'clean'}"] = sum(sel) / len(sel)
    return out


def _row(cond: str, x, metric: str, value, higher_is_better: bool = False, method: str = "opct") -> dict:
    from opct.axes.jailbreak import NAME

    return {"study": STUDY, "method": method, "axis": NAME, "condition": cond,
            "x": None if x is None else float(x), "metric": metric,
            "value": None if value is None else float(value), "higher_is_better": higher_is_better}


def _cached(path: Path, make):
    """The JSON in `path`, or `make()` written there atomically first (a finished piece is never redone)."""
    from opct.files import read_json, write_json_atomic

    if path.exists():
        return read_json(path, "piece")
    value = make()
    write_json_atomic(path, value)
    return value


# ------------------------------------------------------------------------------------------------ one seed

def run(cfg: Config, seed: int, out: Path, log=print) -> list[dict]:
    """One seed of the study (module docstring); returns its rows."""
    import torch

    from opct.pairs.admit import admit
    from opct.pairs.poison import build_backdoored_teacher, check_trigger, poison
    from opct.pairs.schema import load_pairs, save_pairs
    from opct.policy import load_policy
    from opct.robustness.cells import check_not_past
    from opct.subjects import resolve
    from opct.train.config import TrainConfig
    from opct.train.loop import train

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small model: per-op overhead bound (opct.policy.cpu_threads)
    try:
        model = resolve(cfg.model)[0]
        base = load_policy(model, progress=False)
        check_trigger(base.tokenizer, cfg.trigger, "backdoor.trigger")
        clean = training_pairs(cfg, seed)
        n = len(clean)
        for i, c in enumerate(cfg.conditions):  # each condition's poisoning checked before any model trains
            poison(clean, c.p, cfg.trigger, seed, c.teacher, frac_name=f"backdoor.conditions[{i}].p")
        steps_per_epoch = -(-n // cfg.batch_size)
        needs_backdoor = any(c.teacher == "backdoor" for c in cfg.conditions)
        teacher_dir = str(build_backdoored_teacher(model, cfg.trigger, seed, cfg.backdoor_steps, log, cfg.progress)) \
            if needs_backdoor else ""
        start = _cached(out / "epoch0.json", lambda: measure(base, cfg, seed))
        if needs_backdoor:
            teacher_asr = _cached(out / "teacher.json",
                                  lambda: measure(load_policy(teacher_dir, progress=False), cfg, seed))
        rows = []
        for c in cfg.conditions:
            t0 = time.time()
            d = out / c.name.replace(",", "_").replace("=", "")
            d.mkdir(parents=True, exist_ok=True)
            pairs_file = d / "pairs.jsonl"
            if not pairs_file.exists():
                pairs = poison(clean, c.p, cfg.trigger, seed, c.teacher)
                if c.admit == "filter":
                    teacher = load_policy(teacher_dir, progress=False) if c.teacher == "backdoor" else base
                    pairs, decisions = admit(pairs, teacher, base, cfg.max_new_tokens)
                    from opct.files import write_json_atomic

                    write_json_atomic(d / "admission.json", decisions)
                    if not pairs:
                        raise OpctError(f"condition {c.name}: the admission filter rejected every pair")
                save_pairs(pairs, pairs_file)
            kept = load_pairs(pairs_file)
            rows.append(_row(c.name, None, "pairs_trained", len(kept), True))
            rows.append(_row(c.name, None, "pairs_poisoned", sum(bool(p.meta.get("poisoned")) for p in kept), False))
            if (d / "admission.json").exists():
                from opct.files import read_json

                dec = read_json(d / "admission.json", "admission")
                for what in ("admitted", "teacher_bad", "no_change"):
                    rows.append(_row(c.name, None, f"admission_{what}", sum(x["decision"] == what for x in dec), True))
                rows.append(_row(c.name, None, "admission_poisoned_rejected",
                                 sum(x["poisoned"] and x["decision"] != "admitted" for x in dec), True))
                rows.append(_row(c.name, None, "admission_poisoned_total", sum(x["poisoned"] for x in dec), True))
            if needs_backdoor and c.teacher == "backdoor":
                for k, v in teacher_asr.items():
                    rows.append(_row(c.name, None, f"teacher_{k}", v, k == "answered_benign", method="teacher"))
            for k, v in start.items():
                rows.append(_row(c.name, 0, k, v, k == "answered_benign"))
            spe = -(-len(kept) // cfg.batch_size)
            for epoch in range(1, cfg.epochs + 1):
                def one_epoch(epoch=epoch):
                    tc = TrainConfig(method="opct", model=model, pairs=str(pairs_file), out=str(d / "train"),
                                     estimator=c.estimator, topk=cfg.topk, clip_tau=c.clip_tau,
                                     teacher_model=teacher_dir if c.teacher == "backdoor" else "",
                                     n_samples=cfg.n_samples, batch_size=cfg.batch_size, max_steps=epoch * spe,
                                     lr=cfg.lr, lora_r=cfg.lora_r, max_new_tokens=cfg.max_new_tokens, seed=seed,
                                     save_every=spe, keep_checkpoints=1, resume=(d / "train").is_dir(),
                                     progress=cfg.progress)
                    check_not_past(d / "train", tc.max_steps, f"backdoor seed {seed}: {c.name}, epoch {epoch}",
                                   [d / f"epoch{x}.json" for x in range(epoch + 1, cfg.epochs + 1)])
                    train(tc)
                    student = load_policy(model, adapter=str(d / "train" / "final"), progress=False)
                    got = measure(student, cfg, seed)
                    got["clipped_frac"] = _clipped(d / "train" / "metrics.jsonl", (epoch - 1) * spe, epoch * spe)
                    return got
                got = _cached(d / f"epoch{epoch}.json", one_epoch)
                for k, v in got.items():
                    rows.append(_row(c.name, epoch, k, v, k == "answered_benign"))
            log(f"  backdoor seed {seed}: {c.name} ({len(kept)} pairs, {steps_per_epoch} steps/epoch) "
                f"{time.time() - t0:.0f} s")
        return rows
    finally:
        torch.set_num_threads(threads)


def _clipped(metrics_file: Path, lo: int, hi: int):
    """Mean share of tokens the clip took out of the gradient over steps (lo, hi]; None without a clip."""
    vals = []
    for line in metrics_file.read_text().splitlines():
        r = json.loads(line)
        if lo < r["step"] <= hi and r.get("clipped_frac") is not None:
            vals.append(r["clipped_frac"])
    return sum(vals) / len(vals) if vals else None


if __name__ == "__main__":
    import sys

    from opct.robustness import backdoor as study  # this module under its own name, not __main__
    from opct.robustness.standalone import main

    sys.exit(main(study))
