"""Training on the reason (issue 20 part 3; the SFT-lessons paper, arXiv 2607.26173): does a BCT target that states
*why* transfer better to held-out perturbation families than the bare answer — and is it the reason, or only the
extra tokens?

One seed of the study (`run`):
  1. the training pairs: each axis's default training families (`Axis.default_trained`: the demo's split),
     `per_family` items each;
  2. the base model, evaluated once (condition "base");
  3. for each condition, BCT from the base model on those pairs with `target` and `mask_reason`
     (opct.methods.reasons): plain (the answer), reason (why + answer), filler (a neutral sentence of the reason's
     token count + answer: the control), and the masked variants (the sentence in context, not in the loss);
  4. every axis evaluated on train and held-out families (sampled, temperature 1): its `Axis.study_metrics`
     (sycophancy rate; defense success on train / held-out wrappers and held-out categories, answered benign;
     awareness surfaced, over-warning);
     `reason_stated` (responses that contain the axis's reason sentence); and per axis
     `transfer` = (held-out gain) / (train gain) over the base, None when the train gain is below 0.05.
Rows: method "bct" (or "base"), condition = plain | reason | filler | reason_masked | filler_masked | base,
metric e.g. "sycophancy_rate[split=heldout]" (the axis's metric name without its axis prefix), x None.

Resumable: each condition's training run and its metrics JSON live under OUT/<condition>/; a finished condition is
read back, an interrupted training run resumes exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from opct.config import ConfigError, option, validate

STUDY = "reasons"
CONDITIONS = ("plain", "reason", "filler", "reason_masked", "filler_masked")


def reason_axes() -> list[str]:
    """The axes whose targets can state a reason (`Axis.reason`), in registry order: the default `axes`."""
    from opct.axes import AXES

    return [name for name, a in AXES.items() if a.reason is not None]


def trained(axis: str) -> list[str]:
    """What the study trains on per axis: the axis's default training families (the demo's split)."""
    from opct.axes import AXES

    return AXES[axis].default_trained()


def metrics_of(axis: str) -> list[tuple[str, bool, Optional[str]]]:
    """(metric name, higher is better, the split it measures or None): the axis's `study_metrics`."""
    from opct.axes import AXES

    return list(AXES[axis].study_metrics)


@dataclass
class Config:
    model: str = option("default", "the starting model: a subject or a save_pretrained directory")
    conditions: list[str] = option(list(CONDITIONS), "BCT target variants to train", choices=list(CONDITIONS))
    axes: list[str] = option(factory=reason_axes, help="axes trained and evaluated (those with a reason: "
                                                       "Axis.reason)")
    per_family: Optional[int] = option(12, "items per training family (None = all)", ge=1)
    max_steps: int = option(60, "BCT optimizer steps (at 20 the reason sentence is not learned yet; much longer "
                                "and every arm transfers fully, leaving nothing to measure)", ge=1)
    batch_size: int = option(8, "pairs per step", ge=1)
    lr: float = option(1e-3, "learning rate (LoRA)", gt=0)
    lora_r: int = option(16, "LoRA rank", ge=1)
    max_new_tokens: int = option(64, "target and eval response cap (the reason adds up to ~20 tokens)", ge=1)
    eval_n: int = option(16, "items per axis in the evaluation (jailbreak: harmful and benign requests each)", ge=1)
    eval_samples: int = option(1, "samples per eval prompt (temperature 1)", ge=1)
    progress: bool = option(True, "progress bars of the training runs (the study file's --no-progress turns them "
                                  "off)")

    def __post_init__(self):
        validate(self)
        unknown = [a for a in self.axes if a not in reason_axes()]
        if unknown or not self.axes:
            raise ConfigError("axes", f"unknown or without a reason: {', '.join(unknown) or '(empty)'}; known: "
                                      f"{', '.join(reason_axes())}")
        if len(set(self.conditions)) != len(self.conditions) or not self.conditions:
            raise ConfigError("conditions", "must be a non-empty list without repeats")


# `--quick`: field overrides for a smoke-test size (the first reason axis only, 3 targets; 8 s a seed alone)
QUICK = {"conditions": ["plain", "reason", "filler"], "axes": reason_axes()[:1], "per_family": 8, "max_steps": 6,
         "eval_n": 12}


def training_pairs(cfg: Config, seed: int):
    from opct.axes import AXES
    from opct.pairs.make import make_pairs

    pairs = []
    for axis in cfg.axes:
        a = AXES[axis]
        held = [f for f in a.families if f not in trained(axis)]
        pairs += make_pairs(axis, a.world_items(seed), families=trained(axis), heldout=held,
                            per_family=cfg.per_family, seed=seed)
    return [p for p in pairs if p.split == "train"]


def evaluate(policy, cfg: Config, seed: int) -> dict:
    """The study's metrics of `policy` ({metric: value}); `reason_stated[axis,split]` too."""
    from opct.axes import AXES
    from opct.evals.generate import Gen
    from opct.evals.run import run_axis
    from opct.report.unparsed import counts_of
    from opct.world.judges import norm

    out = {}
    for axis in cfg.axes:
        records = run_axis(axis, policy, n=cfg.eval_n, samples=cfg.eval_samples, seed=seed,
                           gen=Gen(max_new_tokens=cfg.max_new_tokens), trained=trained(axis), log=lambda m: None)
        m = AXES[axis].metrics(records, seed)
        for name, _, _ in metrics_of(axis):
            out[name] = m.get(name, {}).get("value")
            out.setdefault(COUNTS, {})[name] = list(counts_of([m], name))
        marker = norm(AXES[axis].reason_marker)
        for split in ("train", "heldout"):
            rows = [r for r in records if r.get("split") == split and r.get("variant") != "clean"
                    and r.get("harmful", True) and r.get("hazard", True)]
            out[f"{axis}.reason_stated[split={split}]"] = (
                sum(marker in norm(r.get("response", "")) for r in rows) / len(rows) if rows else None)
    return out


def _transfer(base: dict, got: dict, axis: str) -> Optional[float]:
    """(held-out gain) / (train gain) over the base, in the metric's good direction; None if the train gain < 0.05."""
    train = [(n, hib) for n, hib, s in metrics_of(axis) if s == "train"]
    held = [(n, hib) for n, hib, s in metrics_of(axis) if s == "heldout"]
    if not train or not held:
        return None
    (tn, hib), (hn, _) = train[0], held[0]
    if None in (base.get(tn), got.get(tn), base.get(hn), got.get(hn)):
        return None
    sign = 1.0 if hib else -1.0
    gain_train = sign * (got[tn] - base[tn])
    gain_held = sign * (got[hn] - base[hn])
    return gain_held / gain_train if gain_train >= 0.05 else None


# evaluate()'s {metric: [unparsed, answers]} (a metrics.json written before it has none: its rows carry no counts)
COUNTS = "_unparsed"


def _rows(condition: str, method: str, values: dict) -> list[dict]:
    hib = {n: h for axis in reason_axes() for n, h, _ in metrics_of(axis)}
    counts = values.get(COUNTS) or {}
    rows = []
    for name, v in values.items():
        if name == COUNTS:
            continue
        axis, metric = name.split(".", 1)
        rows.append({"study": STUDY, "method": method, "axis": axis, "condition": condition, "x": None,
                     "metric": metric, "value": None if v is None else float(v),
                     "higher_is_better": hib.get(name, metric.startswith("transfer"))})
        if name in counts:
            rows[-1]["unparsed"], rows[-1]["answers"] = counts[name]
    return rows


def run(cfg: Config, seed: int, out: Path, log=print) -> list[dict]:
    """One seed of the study (module docstring); returns its rows."""
    import torch

    from opct.files import read_json, write_json_atomic
    from opct.pairs.schema import save_pairs
    from opct.policy import load_policy
    from opct.subjects import resolve
    from opct.train.config import TrainConfig
    from opct.train.loop import train

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = resolve(cfg.model)[0]
        pairs_file = out / "pairs.jsonl"
        if not pairs_file.exists():
            save_pairs(training_pairs(cfg, seed), pairs_file)

        def cached(path: Path, make):
            if path.exists():
                return read_json(path, "metrics")
            v = make()
            write_json_atomic(path, v)
            return v

        base = cached(out / "base.json", lambda: evaluate(load_policy(model, progress=False), cfg, seed))
        rows = _rows("base", "base", base)
        for cond in cfg.conditions:
            t0 = time.time()
            target, masked = cond.split("_")[0], cond.endswith("_masked")
            d = out / cond

            def one(d=d, target=target, masked=masked):
                tc = TrainConfig(method="bct", model=model, pairs=str(pairs_file), out=str(d / "train"),
                                 target=target, mask_reason=masked, max_steps=cfg.max_steps,
                                 batch_size=cfg.batch_size, lr=cfg.lr, lora_r=cfg.lora_r,
                                 max_new_tokens=cfg.max_new_tokens, seed=seed, save_every=cfg.max_steps,
                                 keep_checkpoints=1, resume=(d / "train").is_dir(), progress=cfg.progress)
                train(tc)
                got = evaluate(load_policy(model, adapter=str(d / "train" / "final"), progress=False), cfg, seed)
                for axis in cfg.axes:
                    got[f"{axis}.transfer"] = _transfer(base, got, axis)
                return got

            got = cached(d / "metrics.json", one)
            rows += _rows(cond, "bct", got)
            log(f"  reasons seed {seed}: {cond} {time.time() - t0:.0f} s")
        return rows
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    import sys

    from opct.robustness import reasons as study  # this module under its own name, not __main__
    from opct.robustness.standalone import main

    sys.exit(main(study))
