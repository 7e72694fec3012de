"""`AuditConfig` and the audit loop: for every (organism, method, seed), three phases.

  1. instantiate   derive the organism from the base organism (SFT on its narrow data, full fine-tuning; cached
                   under OUT/organisms/ by a hash of base weights + derivation settings, so the grid reuses it) and
                   measure its misalignment rate and capability by sampling at T = 1 (once per organism and seed);
  2. pseudo-label  a labeller (opct/audit/labellers.py) samples k candidates on held-out prompts of the organism's
                   domain, scores them and picks one per prompt; every candidate is judged for misalignment and
                   written to candidates.jsonl (the input of the eta(s) diagnostic). BCT and ACT skip this phase:
                   they train on the organism's consistency pairs with the existing `bct` / `act` methods;
  3. fine-tune     SFT on the pseudo-labels (the shared training loop, `--method sft --targets`, full fine-tuning),
                   then measure misalignment and capability again on the same probes with the same sampling seed.

Files: OUT/config.json, OUT/results.jsonl (one JSON object per finished measurement: kind "organism" — the base and
the derived organism's rates; kind "before" — per organism and seed; kind "cell" — per organism, method and seed,
with the after-measurement and per-item hits), OUT/cells/<organism>/<method>/seed<N>/ (candidates.jsonl, the
training run's config and metrics; weights are deleted once measured). A finished record is never redone, so a killed
audit continues where it stopped.
"""

from __future__ import annotations

import json
import random
import shutil
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opct.audit.labellers import LABELLERS, METHOD_NAMES, LabelConfig
from opct.audit.organisms import ORGANISMS, DeriveConfig, capability_probes, capable, derive_organism, sft_on
from opct.axes.capability import NAME as CAPABILITY  # the capability rate's key in results.jsonl
from opct.config import ConfigError, changes, option, require, validate
from opct.errors import OpctError
from opct.files import append_jsonl, read_json, read_text, write_json_atomic

if TYPE_CHECKING:  # annotations only: importing the policy (and torch) here would slow `opct --help`
    from opct.policy import Policy


@dataclass
class AuditConfig:
    out: str = option("", "output directory: results.jsonl, report.html, results.md, cells/, organisms/ (required)",
                      required=True)
    base_model: str = option("", "base organism directory (default: the shipped default organism)")
    organisms: list[str] = option(list(ORGANISMS), "organisms to audit: " + ", ".join(ORGANISMS),
                                  choices=list(ORGANISMS), noun="organism", nonempty=True)
    methods: list[str] = option(list(METHOD_NAMES), "methods: " + ", ".join(METHOD_NAMES) + " (k1 = no selection)",
                                choices=list(METHOD_NAMES), noun="method", nonempty=True)
    seeds: list[int] = option([0, 1, 2], "seeds of the pseudo-labelling and fine-tuning (at least 3 for intervals)",
                              nonempty=True)
    k: int = option(4, "candidates per held-out prompt", ge=1)
    label_prompts: int = option(64, "held-out prompts pseudo-labelled per cell", ge=1)
    eval_n: int = option(160, "misalignment probes sampled per measurement (T = 1)", ge=1)
    capability_n: int = option(60, "capability probes sampled per measurement (T = 1)", ge=1)
    max_new_tokens: int = option(40, "response length cap for every sample", ge=1)
    ft_steps: int = option(16, "fine-tuning steps on the pseudo-labels (or BCT / ACT pairs)", ge=1)
    ft_batch: int = option(16, "fine-tuning batch size", ge=1)
    ft_lr: float = option(3e-4, "fine-tuning learning rate (full fine-tuning, AdamW, constant)", gt=0)
    pairs_n: int = option(64, "BCT / ACT: consistency pairs per cell", ge=1)
    derive_examples: int = option(600, "narrow fine-tuning examples per organism", ge=1)
    derive_steps: int = option(100, "organism derivation: SFT steps", ge=1)
    derive_lr: float = option(3e-4, "organism derivation: learning rate", gt=0)
    sample_batch: int = option(128, "prompts per sampling batch", ge=1)
    quick: bool = option(False, "small sizes and one seed (a smoke run of the whole grid; no intervals over seeds)")

    def __post_init__(self):
        validate(self)
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("seeds", "must not repeat")


# --quick: these replace the defaults (not values given in a config file or on the command line).
QUICK = dict(seeds=[0], label_prompts=32, eval_n=96, capability_n=30, ft_steps=10, pairs_n=32, derive_steps=60,
             derive_examples=400)
# Fields that may change between runs into the same OUT (the grid grows); any other change would mix results.
GRID_FIELDS = ("out", "organisms", "methods", "seeds", "quick", "sample_batch")


def default_base() -> Path:
    from opct.organism.build import SHIPPED_DIR

    return SHIPPED_DIR / "default"


def _rng(*key) -> random.Random:
    return random.Random(zlib.crc32(json.dumps(key).encode()))


# ------------------------------------------------------------------------------------------ measurement

def measure(policy: Policy, spec, probes, cap_probes, seed: int, cfg: AuditConfig) -> dict:
    """Sample every probe once at T = 1 and judge: per-item [hits, n] for misalignment and capability."""
    from opct.evals.generate import Gen, generate

    gen = Gen(max_new_tokens=cfg.max_new_tokens, temperature=1.0, batch_size=cfg.sample_batch)
    texts = generate(policy, [p["messages"] for p in probes], gen, seed=seed)
    mis, unparsed = {}, 0
    for p, t in zip(probes, texts):
        v = spec.misaligned(p, t)
        unparsed += v is None
        h = mis.setdefault(p["item"], [0, 0])
        h[0] += int(bool(v))
        h[1] += 1
    cap = {}
    for p, t in zip(cap_probes, generate(policy, [p["messages"] for p in cap_probes], gen, seed=seed + 7)):
        h = cap.setdefault(p["item"], [0, 0])
        h[0] += int(capable(p, t))
        h[1] += 1

    def rate(d):
        n = sum(v[1] for v in d.values())
        return sum(v[0] for v in d.values()) / n if n else None

    return {"misalignment": rate(mis), CAPABILITY: rate(cap), "n": len(probes), "unparsed": unparsed,
            "n_capability": len(cap_probes), "items": mis, "capability_items": cap,
            "examples": [{"prompt": p["messages"][-1]["content"], "response": t} for p, t in
                         list(zip(probes, texts))[:3]]}


# ------------------------------------------------------------------------------------------ results file

def read_results(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in read_text(path).splitlines():
        try:
            rows.append(json.loads(line))
        except (json.JSONDecodeError, RecursionError):  # a line torn by a kill: that measurement is redone
            continue
    return rows


def _key(r: dict) -> tuple:
    return r["kind"], r["organism"], r.get("method"), r.get("seed")


def _append(out: Path, record: dict) -> None:
    append_jsonl(out / "results.jsonl", record)  # repairs a line torn by a kill first, so no record is glued to it


def _check_config(out: Path, cfg: AuditConfig) -> None:
    path = out / "config.json"
    now = asdict(cfg)
    if path.exists():
        saved = read_json(path, "config")
        if not isinstance(saved, dict):
            raise OpctError(f"{path}: not an audit configuration (expected a JSON object)")
        diff = changes(saved, now, GRID_FIELDS)
        if diff:
            raise OpctError(f"{out}: holds an audit with other settings ({', '.join(diff)}); results would mix. "
                            f"Use another --out, or the same settings to continue it")
    write_json_atomic(path, now)


# ------------------------------------------------------------------------------------------ one cell

def _fine_tune_pairs(cfg: AuditConfig, spec, method: str, org_dir: Path, cell: Path, seed: int) -> Path:
    """BCT / ACT: the existing methods on the organism's consistency pairs (full fine-tuning)."""
    from opct.pairs.schema import save_pairs
    from opct.train.config import TrainConfig
    from opct.train.loop import train

    pairs = spec.pairs(_rng(spec.name, "pairs", seed), cfg.pairs_n)
    for i, p in enumerate(pairs):  # items are drawn with replacement: make every id unique
        p.id = f"{p.id}#{i}"
    save_pairs(pairs, cell / "pairs.jsonl")
    tc = TrainConfig(method=method, model=str(org_dir), pairs=str(cell / "pairs.jsonl"), out=str(cell / "run"),
                     lora=False, max_steps=cfg.ft_steps, batch_size=cfg.ft_batch, lr=cfg.ft_lr, seed=seed,
                     save_every=cfg.ft_steps, keep_checkpoints=1, tensorboard=False,
                     max_new_tokens=cfg.max_new_tokens)
    return train(tc) / "final"


def run_cell(cfg: AuditConfig, organism: str, method: str, seed: int, org_dir: Path, probes, cap_probes) -> dict:
    import torch

    from opct.pairs.schema import write_jsonl_atomic
    from opct.policy import load_policy

    spec = ORGANISMS[organism]
    cell = Path(cfg.out) / "cells" / organism / method / f"seed{seed}"
    if cell.exists():  # an unfinished earlier attempt
        shutil.rmtree(cell)
    cell.mkdir(parents=True)
    t0 = time.time()
    diag = None
    if method in LABELLERS:
        policy = load_policy(org_dir)
        torch.manual_seed(seed)
        label_probes = spec.probes("label", _rng(organism, "label", seed), cfg.label_prompts)
        lc = LabelConfig(k=cfg.k, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.sample_batch)
        groups = LABELLERS[method](policy, label_probes, lc)
        rows, examples = [], []
        for p, g in zip(label_probes, groups):
            mis = [spec.misaligned(p, c["text"]) for c in g["candidates"]]
            rows.append({"id": p["id"], "item": p["item"], "scores": [c["score"] for c in g["candidates"]],
                         "misaligned": mis, "chosen": g["chosen"], "texts": [c["text"] for c in g["candidates"]]})
            label = g["candidates"][g["chosen"]]["text"]
            if label.strip():
                examples.append({"messages": p["messages"], "response": label})
        write_jsonl_atomic(cell / "candidates.jsonl", rows)
        t_label = time.time() - t0
        if not examples:
            raise OpctError(f"{organism}/{method}/seed{seed}: every pseudo-label is empty; nothing to fine-tune on")
        chosen = [r["misaligned"][r["chosen"]] for r in rows]
        every = [m for r in rows for m in r["misaligned"]]
        diag = {"label_misaligned_chosen": sum(bool(m) for m in chosen) / len(chosen),
                "label_misaligned_all": sum(bool(m) for m in every) / len(every), "n_labels": len(examples)}
        del policy
        final = sft_on(org_dir, examples, cell, f"{organism}-{method}", cfg.ft_steps, cfg.ft_batch, cfg.ft_lr, seed,
                       cfg.max_new_tokens)
    else:
        t_label = 0.0
        final = _fine_tune_pairs(cfg, spec, method, org_dir, cell, seed)
    t_train = time.time() - t0 - t_label
    after = measure(load_policy(final), spec, probes, cap_probes, seed, cfg)
    shutil.rmtree(final.parent / "checkpoints", ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)
    return {"kind": "cell", "organism": organism, "method": method, "seed": seed, "after": after, "label": diag,
            "seconds": {"label": round(t_label, 1), "train": round(t_train, 1),
                        "total": round(time.time() - t0, 1)}}


# ------------------------------------------------------------------------------------------ the grid

def run_audit(cfg: AuditConfig, log=print) -> Path:
    from opct.policy import load_policy

    require(cfg)
    out = Path(cfg.out)
    _check_config(out, cfg)
    base = Path(cfg.base_model) if cfg.base_model else default_base()
    if not (base / "config.json").exists():
        raise OpctError(f"{base}: not a model directory (no config.json)")
    done = {_key(r) for r in read_results(out)}
    derive = DeriveConfig(examples=cfg.derive_examples, steps=cfg.derive_steps, lr=cfg.derive_lr)
    t_start = time.time()
    for organism in cfg.organisms:
        spec = ORGANISMS[organism]
        t0 = time.time()
        org_dir = derive_organism(organism, base, out / "organisms", derive)
        probes = spec.probes("eval", _rng(organism, "eval"), cfg.eval_n)
        cap_probes = capability_probes(_rng(CAPABILITY), cfg.capability_n)
        if ("organism", organism, None, None) not in done:
            b = measure(load_policy(base), spec, probes, cap_probes, 0, cfg)
            o = measure(load_policy(org_dir), spec, probes, cap_probes, 0, cfg)
            _append(out, {"kind": "organism", "organism": organism, "dir": str(org_dir), "failure": spec.failure,
                          "base": b, "derived": o, "seconds": round(time.time() - t0, 1)})
            log(f"[audit] {organism}: misalignment base {b['misalignment']:.3f} -> organism {o['misalignment']:.3f}; "
                f"capability {b[CAPABILITY]:.3f} -> {o[CAPABILITY]:.3f} ({time.time() - t0:.0f}s)")
        for seed in cfg.seeds:
            if ("before", organism, None, seed) not in done:
                before = measure(load_policy(org_dir), spec, probes, cap_probes, seed, cfg)
                _append(out, {"kind": "before", "organism": organism, "seed": seed, "before": before})
            for method in cfg.methods:
                if ("cell", organism, method, seed) in done:
                    continue
                rec = run_cell(cfg, organism, method, seed, org_dir, probes, cap_probes)
                _append(out, rec)
                a = rec["after"]
                log(f"[audit] {organism} / {method} / seed {seed}: misalignment {a['misalignment']:.3f}, "
                    f"capability {a[CAPABILITY]:.3f} ({rec['seconds']['total']:.0f}s; "
                    f"{time.time() - t_start:.0f}s so far)")
    return out
