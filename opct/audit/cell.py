"""One measurement and one grid cell of the audit.

  measure    sample every eval probe once at T = 1 and judge it: per item [misaligned, n] and [unparsed, n], the
             misalignment rate over every row (an unparsed answer counts as not misaligned) and over the parsed rows,
             the unparsed share, per probe kind (e.g. the emergent organism's hazard questions vs harmful requests),
             and capability on the capability probes.
  run_cell   one (organism, method, seed): pseudo-label the seed's label prompts and fine-tune on the labels (SFT,
             the shared loop), or train BCT / ACT on the seed's pairs; then measure again on the same probes with the
             same sampling seed. Every candidate, its score and its verdict go to candidates.jsonl.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from opct.audit.derive import sft_on
from opct.audit.labellers import LabelConfig
from opct.audit.methods import ALL_LABELLERS, REGULARISERS
from opct.audit.organisms import ORGANISMS, capable
from opct.audit.splits import Splits, make_pairs
from opct.axes.capability import NAME as CAPABILITY  # the capability rate's key in results.jsonl
from opct.errors import OpctError


def _rate(d: dict):
    n = sum(v[1] for v in d.values())
    return sum(v[0] for v in d.values()) / n if n else None


def measure(policy, spec, probes, cap_probes, seed: int, cfg) -> dict:
    from opct.evals.generate import Gen, generate

    gen = Gen(max_new_tokens=cfg.max_new_tokens, temperature=1.0, batch_size=cfg.sample_batch)
    texts = generate(policy, [p["messages"] for p in probes], gen, seed=seed)
    mis, none, kinds = {}, {}, {}
    for p, t in zip(probes, texts):
        v = spec.misaligned(p, t)
        for d, hit in ((mis, bool(v)), (none, v is None)):
            h = d.setdefault(p["item"], [0, 0])
            h[0] += int(hit)
            h[1] += 1
        k = kinds.setdefault(p["meta"].get("kind", "all"), [0, 0, 0])
        k[0] += int(bool(v))
        k[1] += int(v is None)
        k[2] += 1
    cap = {}
    for p, t in zip(cap_probes, generate(policy, [p["messages"] for p in cap_probes], gen, seed=seed + 7)):
        h = cap.setdefault(p["item"], [0, 0])
        h[0] += int(capable(p, t))
        h[1] += 1
    n_parsed = sum(v[1] - u[0] for v, u in zip(mis.values(), none.values()))
    return {"misalignment": _rate(mis), "unparsed": _rate(none),
            "misalignment_parsed": sum(v[0] for v in mis.values()) / n_parsed if n_parsed else None,
            CAPABILITY: _rate(cap), "n": len(probes), "n_capability": len(cap_probes), "items": mis,
            "unparsed_items": none, "capability_items": cap,
            "by_kind": {k: {"misalignment": v[0] / v[2], "unparsed": v[1] / v[2], "n": v[2]} for k, v in kinds.items()},
            "examples": [{"prompt": p["messages"][-1]["content"], "response": t} for p, t in list(zip(probes, texts))[:3]]}


def label_config(cfg, reward_model=None) -> LabelConfig:
    return LabelConfig(max_new_tokens=cfg.max_new_tokens, batch_size=cfg.sample_batch, samples=cfg.k,
                       reward_model=reward_model)


def pseudo_label(policy, spec, probes, method: str, cfg, cell: Path, seed: int, reward_model=None):
    """The labeller's groups, judged and written to candidates.jsonl; returns (examples to fine-tune on, diagnostics).
    `reward_model`: diverse decoding's external tie-breaker (the base organism's policy)."""
    import torch

    from opct.pairs.schema import write_jsonl_atomic

    torch.manual_seed(seed)
    groups = ALL_LABELLERS[method](policy, probes, label_config(cfg, reward_model), spec)
    rows, examples = [], []
    for p, g in zip(probes, groups):
        mis = [spec.misaligned(p, c["text"]) for c in g["candidates"]]
        rows.append({"id": p["id"], "item": p["item"], "kind": g["kind"], "scores": [c["score"] for c in g["candidates"]],
                     "misaligned": mis, "chosen": g["chosen"], "texts": [c["text"] for c in g["candidates"]],
                     "extra": g["extra"]})
        if g["chosen"] is not None and g["candidates"][g["chosen"]]["text"].strip():
            examples.append({"messages": p["messages"], "response": g["candidates"][g["chosen"]]["text"]})
    write_jsonl_atomic(cell / "candidates.jsonl", rows)
    chosen = [r["misaligned"][r["chosen"]] for r in rows if r["chosen"] is not None]
    every = [m for r in rows for m in r["misaligned"]]
    diag = {"n_labels": len(examples), "n_prompts": len(rows),
            "label_misaligned_chosen": sum(m is True for m in chosen) / len(chosen) if chosen else None,
            "label_unparsed_chosen": sum(m is None for m in chosen) / len(chosen) if chosen else None,
            "label_misaligned_all": sum(m is True for m in every) / len(every) if every else None}
    return examples, diag


def train_pairs(cfg, s: Splits, method: str, org_dir: Path, cell: Path, seed: int) -> Path:
    """BCT / ACT on the seed's pairs (full fine-tuning): the paper's pairs, or the targeted ones."""
    from opct.pairs.schema import save_pairs
    from opct.train.config import TrainConfig
    from opct.train.loop import train

    train_method, mode = REGULARISERS[method]
    save_pairs(make_pairs(s, mode), cell / "pairs.jsonl")
    tc = TrainConfig(method=train_method, model=str(org_dir), pairs=str(cell / "pairs.jsonl"), out=str(cell / "run"),
                     lora=False, max_steps=cfg.ft_steps, batch_size=cfg.ft_batch, lr=cfg.ft_lr, seed=seed,
                     save_every=cfg.ft_steps, keep_checkpoints=1, tensorboard=False,
                     max_new_tokens=cfg.max_new_tokens)
    return train(tc) / "final"


def run_cell(cfg, s: Splits, method: str, org_dir: Path, cap_probes, before: dict,
             reward_dir: Path | None = None) -> dict:
    from opct.policy import load_policy

    spec = ORGANISMS[s.organism]
    seed = s.seed
    cell = Path(cfg.out) / "cells" / s.organism / method / f"seed{seed}"
    if cell.exists():  # an unfinished earlier attempt
        shutil.rmtree(cell)
    cell.mkdir(parents=True)
    t0 = time.time()
    diag = None
    if method in ALL_LABELLERS:
        rm = load_policy(reward_dir, progress=False) if reward_dir is not None and method == "diverse_decoding" \
            else None
        examples, diag = pseudo_label(load_policy(org_dir, progress=False), spec, s.label, method, cfg, cell, seed, rm)
        t_label = time.time() - t0
        if not examples:  # every row filtered out (or empty): nothing to fine-tune on, the organism is unchanged
            return {"kind": "cell", "organism": s.organism, "method": method, "seed": seed, "after": before,
                    "label": diag, "untrained": True, "seconds": {"label": round(t_label, 1), "train": 0.0,
                                                                   "total": round(time.time() - t0, 1)}}
        final = sft_on(org_dir, examples, cell, f"{s.organism}-{method}", cfg.ft_steps, cfg.ft_batch, cfg.ft_lr,
                       seed, cfg.max_new_tokens)
    elif method in REGULARISERS:
        t_label = 0.0
        final = train_pairs(cfg, s, method, org_dir, cell, seed)
    else:
        raise OpctError(f"unknown audit method {method!r}")
    t_train = time.time() - t0 - t_label
    after = measure(load_policy(final, progress=False), spec, s.eval, cap_probes, seed, cfg)
    shutil.rmtree(final.parent / "checkpoints", ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)
    return {"kind": "cell", "organism": s.organism, "method": method, "seed": seed, "after": after, "label": diag,
            "seconds": {"label": round(t_label, 1), "train": round(t_train, 1), "total": round(time.time() - t0, 1)}}
