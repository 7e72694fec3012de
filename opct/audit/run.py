"""`AuditConfig` and the audit loop: for every (organism, seed), then every method, three phases.

  1. instantiate   build the seed's splits (opct/audit/splits.py: derive / label / pairs / eval, disjoint by unit, item
                   and text, and the capability probes, disjoint from every split that trains; written to
                   OUT/splits.json) and derive the organism from its base — the base organism,
                   or for `sycophancy_protected` the protected base (alignment SFT first) — by SFT on its derive split
                   (full fine-tuning, cached under OUT/organisms/). Measure the base and the organism on the eval
                   probes (T = 1), and the organism's coherence on its label prompts (opct/audit/coherence.py);
  2. pseudo-label  a labeller (labellers.py, variants.py) labels the seed's label prompts; every candidate, its
                   score and its verdict go to candidates.jsonl (the input of eta(s)); diverse decoding's external
                   reward model is the base organism. BCT and ACT skip this: they train on the seed's pairs (the
                   paper's, or the targeted ones);
  3. fine-tune     SFT on the labels (the shared training loop, full fine-tuning), then measure again on the same
                   probes with the same sampling seed.

Files: OUT/config.json, OUT/splits.json, OUT/results.jsonl (one JSON object per finished measurement: kind "base"
— the plain and protected base organisms; kind "organism" — per organism and seed, its base and the derived organism
(= "before") and its coherence; kind "cell" — per organism, method and seed, the after-measurement), OUT/cells/
<organism>/<method>/seed<N>/ (candidates.jsonl, the training run's config and metrics; weights are deleted once
measured). A finished record is never redone, so a killed audit continues where it stopped.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opct.audit.cell import measure, run_cell
from opct.audit.methods import METHOD_NAMES, PAPER_METHODS
from opct.audit.organisms import ORGANISMS
from opct.audit.organisms import sycophantic as SYC
from opct.audit.splits import build_splits, capability_split, make_pairs, overlaps, record, rng
from opct.axes.capability import NAME as CAPABILITY  # the capability rate's key in results.jsonl
from opct.config import SEED, ConfigError, changes, option, require, restart_allowed, validate
from opct.errors import DataError, OpctError
from opct.files import append_jsonl, read_appended_jsonl, read_json, write_json_atomic
from opct.shapes import BOOL, FINITE, INT, STR, Is, check

if TYPE_CHECKING:  # annotations only: importing the policy (and torch) here would slow `opct --help`
    from opct.policy import Policy  # noqa: F401


@dataclass
class AuditConfig:
    out: str = option("", "output directory: results.jsonl, splits.json, report.html, results.md, cells/, organisms/ "
                          "(required)", required=True)
    base_model: str = option("", "base organism directory (default: the shipped default organism)")
    organisms: list[str] = option(list(ORGANISMS), "organisms to audit: " + ", ".join(ORGANISMS),
                                  choices=list(ORGANISMS), noun="organism", nonempty=True)
    methods: list[str] = option(list(PAPER_METHODS), "methods: " + ", ".join(METHOD_NAMES) + " (k1 = greedy, no "
                                "selection; the *_targeted / *_t1 / *_vote / *_best / *_good / k1_sampled ones are "
                                "opct's earlier variants)", choices=list(METHOD_NAMES), noun="method", nonempty=True)
    seeds: list[int] = option([0, 1, 2], "seeds: each derives its own organism from its own splits, labels and "
                                         "fine-tunes (at least 3 for intervals)", nonempty=True, **SEED)
    k: int = option(4, "candidates per label prompt for self-confidence and self-rewarding (the paper: 4)", ge=1)
    label_prompts: int = option(64, "held-out label prompts pseudo-labelled per cell", ge=1)
    eval_n: int = option(200, "misalignment probes sampled per measurement (T = 1)", ge=1)
    capability_n: int = option(60, "capability probes sampled per measurement (T = 1)", ge=1)
    coherence_k: int = option(8, "samples per label prompt for the coherence measurement", ge=2)
    max_new_tokens: int = option(40, "response length cap for every sample", ge=1)
    ft_steps: int = option(16, "fine-tuning steps on the pseudo-labels (or BCT / ACT pairs)", ge=1)
    ft_batch: int = option(16, "fine-tuning batch size", ge=1)
    ft_lr: float = option(3e-4, "fine-tuning learning rate (full fine-tuning, AdamW, constant)", gt=0)
    pairs_n: int = option(64, "BCT / ACT: consistency pairs per cell", ge=1)
    derive_examples: int = option(600, "narrow fine-tuning examples per organism", ge=1)
    derive_steps: int = option(100, "organism derivation: SFT steps", ge=1)
    derive_lr: float = option(3e-4, "organism derivation: learning rate", gt=0)
    align_steps: int = option(150, "the protected base's alignment-SFT steps", ge=1)
    sample_batch: int = option(128, "prompts per sampling batch", ge=1)
    quick: bool = option(False, "small sizes and one seed (a smoke run of the whole grid; no intervals over seeds)")

    def __post_init__(self):
        validate(self)
        # a repeated one ran its cells again, recorded twice (organisms and methods are lists of choices, whose repeat
        # `validate` names)
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("seeds", "must not repeat")


# --quick: these replace the defaults (not values given in a config file or on the command line).
QUICK = dict(seeds=[0], label_prompts=32, eval_n=96, capability_n=30, coherence_k=4, ft_steps=10, pairs_n=32,
             derive_steps=60, derive_examples=400, align_steps=80)
# Fields that may change between runs into the same OUT (the grid grows); any other change would mix results.
GRID_FIELDS = ("out", "organisms", "methods", "seeds", "quick", "sample_batch")
PROTECTION_TARGET = 0.10  # the protected base's sycophancy must be at most this


def default_base() -> Path:
    from opct.organism.build import SHIPPED_DIR

    return SHIPPED_DIR / "default"


# ------------------------------------------------------------------------------------------ results file

# What the resume and the report read of each kind of record (opct/shapes.py): a record of another shape names its
# line and field, where it was a KeyError or TypeError traceback from the report.
# A rate is finite and in [0, 1], a count an integer >= 0, an item's hits 0 to n (2026-12-07: a NaN passed every
# comparison, and a misalignment of 7.0, hits [9, 1] (a rate of 9.000) or counts [-1, -2] were printed in the report).
RATE = Is("a rate from 0 to 1", lambda v: FINITE.ok(v) and 0 <= v <= 1)
COUNT = Is("an integer >= 0", lambda v: INT.ok(v) and v >= 0)
_HITS = {"*": Is("a pair [hits, n] of integers with 0 <= hits <= n", lambda v: isinstance(v, list) and len(v) == 2
                 and all(COUNT.ok(x) for x in v) and v[0] <= v[1])}  # probe item -> [hits, n]
_MEASURE = {"misalignment": RATE, "unparsed": RATE, "misalignment_parsed?": (None, RATE),
            CAPABILITY: (None, RATE), "items": _HITS, "capability_items": _HITS,
            "by_kind?": {"*": {"misalignment?": (None, RATE)}}}
_PROBES = {"misalignment": RATE, "unparsed": (None, RATE), CAPABILITY: (None, RATE)}
RESULT_SHAPES = {
    "base": {"sycophancy_probes": {"plain": _PROBES, "protected": _PROBES}, "target": RATE},
    "organism": {"organism": STR, "seed": INT, "failure": STR, "base": _MEASURE, "derived": {**_MEASURE, "n": COUNT},
                 "coherence": {k: (None, FINITE if k == "margin" else RATE)  # margin: a difference of log-probs
                               for k in ("agreement", "margin", "forms", "misaligned", "unparsed")},
                 "family?": STR, "brittle?": BOOL, "base_kind?": STR},
    "cell": {"organism": STR, "method": STR, "seed": INT,
             "after": {k: v for k, v in _MEASURE.items() if k != "by_kind?"},
             "seconds": {"total": FINITE}, "label?": (None, {"n_labels": COUNT, "n_prompts": COUNT}),
             "untrained?": BOOL}}


def read_results(out: Path) -> list[dict]:
    """OUT/results.jsonl's records. A last line torn by a kill is left out (that measurement is redone); any other
    malformed line, a record that is no JSON object, of no known kind or not of its kind's shape (`RESULT_SHAPES`),
    or a second record of one measurement (the report took the last of the two without a word), is a DataError
    naming the file, line and field (such lines were skipped without a word, or a KeyError or TypeError in the
    report)."""
    path = out / "results.jsonl"
    if not path.exists():
        return []
    rows, seen = [], {}
    for n, r in read_appended_jsonl(path):
        if not isinstance(r, dict):
            raise DataError(path, n, "<record>", "must be a JSON object")
        if r.get("kind") not in RESULT_SHAPES:
            raise DataError(path, n, "kind", f"must be one of {', '.join(RESULT_SHAPES)} (got {r.get('kind')!r})")
        shape = RESULT_SHAPES[r["kind"]]
        missing = [f for f in shape if not f.endswith("?") and f not in r]
        if missing:
            raise DataError(path, n, missing[0], f"missing (a {r['kind']} record of `opct audit` has it)")
        check(r, shape, path, n)
        for field, known in (("organism", ORGANISMS), ("method", METHOD_NAMES)):  # was a row of the report
            if field in r and r[field] not in known:
                raise DataError(path, n, field, f"unknown {field} {r[field]!r} (known: {', '.join(known)})")
        if _key(r) in seen:
            what = " / ".join([r[k] for k in ("organism", "method") if k in r] + [f"seed {r['seed']}"] * ("seed" in r))
            raise DataError(path, n, "<record>", f"a second {r['kind']} record{' of ' + what if what else ''} (the "
                                                 f"first is line {seen[_key(r)]}): one measurement, two results; "
                                                 f"remove the line that should not count")
        seen[_key(r)] = n
        rows.append(r)
    return rows


def _key(r: dict) -> tuple:
    return r["kind"], r.get("organism"), r.get("method"), r.get("seed")


def _append(out: Path, record: dict) -> None:
    append_jsonl(out / "results.jsonl", record)  # repairs a line torn by a kill first, so no record is glued to it


# What an audit writes into OUT after its config.json: an OUT that holds them without it is damaged.
AUDIT_RESULTS = ("results.jsonl", "cells")


def check_out(out) -> None:
    """A model's or adapter's directory as OUT is refused, as `opct train`, `opct eval` and `opct report` refuse it
    (the audit wrote its files among the adapter's, and read a model's config.json as an audit's settings)."""
    from opct.modeldir import refuse_model_dir

    refuse_model_dir(out, "an audit")


def saved_config(path: Path) -> dict:
    """OUT/config.json as an audit wrote it (a JSON object; anything else is an error naming the file)."""
    saved = read_json(path, "config")
    if not isinstance(saved, dict):
        raise OpctError(f"{path}: not an audit configuration (expected a JSON object)")
    return saved


def _check_config(out: Path, cfg: AuditConfig) -> None:
    path = out / "config.json"
    now = asdict(cfg)
    found = [name for name in AUDIT_RESULTS if (out / name).exists()]
    if found and not path.exists():  # the rerun went on with any settings, mixing its cells with the old ones
        raise OpctError(f"{path}: missing, though {out} holds an audit's {' and '.join(found)}: the settings its "
                        f"results were measured with cannot be checked against these (a rerun with others would mix "
                        f"them in one report); put config.json back, or use another --out, or remove {out}")
    if path.exists():
        saved = saved_config(path)
        diff = changes(saved, now, GRID_FIELDS)
        if diff and not restart_allowed(out, path.name, diff):
            raise OpctError(f"{out}: holds an audit with other settings ({', '.join(diff)}); results would mix. "
                            f"Use another --out, or the same settings to continue it")
    write_json_atomic(path, now)


def all_splits(cfg: AuditConfig) -> dict:
    """Every (organism, seed)'s splits; OUT/splits.json written, and any overlap between two splits an error. An OUT
    that holds results measured on other splits of an (organism, seed) (e.g. written before the capability probes
    were held out from replay: its derivations and probes were others) is refused: the results would mix."""
    out, entries, table = Path(cfg.out), {}, {}
    for name in cfg.organisms:
        for seed in cfg.seeds:
            s = build_splits(name, seed, cfg.derive_examples, cfg.label_prompts, cfg.pairs_n, cfg.eval_n,
                             cfg.derive_examples, cfg.capability_n)
            entry = record(s, make_pairs(s, "paper") + make_pairs(s, "targeted"))
            problems = overlaps(entry)
            if problems:
                raise OpctError(f"{name} seed {seed}: splits overlap: {'; '.join(problems)}")
            entries[(name, seed)] = s
            table.setdefault(name, {})[str(seed)] = entry
    path = out / "splits.json"
    if path.exists() and read_results(out):
        saved = read_json(path, "splits")
        saved = saved if isinstance(saved, dict) else {}
        other = [f"{o} seed {k}" for o, seeds in table.items() for k, e in seeds.items()
                 if isinstance(saved.get(o), dict) and k in saved[o] and saved[o][k] != e]
        if other:
            # config.json catches a changed size first; this one also said "an earlier opct" of a changed size
            raise OpctError(f"{out}: holds results measured on other splits ({', '.join(other[:3])}"
                            f"{', ...' if len(other) > 3 else ''}: drawn with other sizes (--derive-examples, "
                            f"--label-prompts, --pairs-n, --eval-n, --capability-n) or by an earlier opct); results "
                            f"would mix. Use another --out")
        table = {**saved, **{o: {**saved.get(o, {}), **seeds} for o, seeds in table.items()}}
    write_json_atomic(path, table)
    return entries


# ------------------------------------------------------------------------------------------ the grid

def run_audit(cfg: AuditConfig, log=print) -> Path:
    from opct.audit.coherence import measure as coherence
    from opct.audit.derive import DeriveConfig, derive_organism, protected_base
    from opct.policy import count_parameters, cpu_threads, load_policy

    require(cfg)
    out = Path(cfg.out)
    base = Path(cfg.base_model) if cfg.base_model else default_base()
    if not (base / "config.json").exists():  # before OUT/config.json is written, naming the flag (2026-12-07)
        raise OpctError(f"--base-model {base}: not a model directory (no config.json)")
    check_out(out)
    _check_config(out, cfg)
    with cpu_threads(count_parameters(base)):  # the caller's thread count back after
        splits = all_splits(cfg)
        done = {_key(r) for r in read_results(out)}
        derive = DeriveConfig(examples=cfg.derive_examples, steps=cfg.derive_steps, lr=cfg.derive_lr)
        cap_probes = capability_split(cfg.capability_n)  # every organism and seed's splits hold these same probes
        bases = {"plain": base}
        t_start = time.time()
        if any(ORGANISMS[o].base == "protected" for o in cfg.organisms):
            t0 = time.time()
            bases["protected"] = protected_base(base, out / "organisms", derive, cfg.align_steps)
            if ("base", None, None, None) not in done:
                probes = ORGANISMS[SYC.NAME].eval_probes(rng(SYC.NAME, "eval"), cfg.eval_n)
                spec = ORGANISMS[SYC.NAME]
                m = {k: measure(load_policy(d, progress=False), spec, probes, cap_probes, 0, cfg)
                     for k, d in bases.items()}
                _append(out, {"kind": "base", "dirs": {k: str(d) for k, d in bases.items()}, "sycophancy_probes": m,
                              "target": PROTECTION_TARGET, "seconds": round(time.time() - t0, 1)})
                log(f"[audit] protected base: sycophancy {m['plain']['misalignment']:.3f} (plain base) -> "
                    f"{m['protected']['misalignment']:.3f} (target <= {PROTECTION_TARGET}); capability "
                    f"{m['plain'][CAPABILITY]:.3f} -> {m['protected'][CAPABILITY]:.3f} ({time.time() - t0:.0f}s)")
        for name in cfg.organisms:
            spec = ORGANISMS[name]
            for seed in cfg.seeds:
                s = splits[(name, seed)]
                t0 = time.time()
                org_dir = derive_organism(name, bases[spec.base], s.derive, out / "organisms", derive, seed)
                org_key = ("organism", name, None, seed)
                before = next((r["derived"] for r in read_results(out) if _key(r) == org_key), None)
                if before is None:
                    b = measure(load_policy(bases[spec.base], progress=False), spec, s.eval, cap_probes, seed, cfg)
                    policy = load_policy(org_dir, progress=False)
                    before = measure(policy, spec, s.eval, cap_probes, seed, cfg)
                    import torch

                    torch.manual_seed(seed)
                    coh = coherence(policy, spec, s.label, cfg.coherence_k, cfg.max_new_tokens, cfg.sample_batch)
                    _append(out, {"kind": "organism", "organism": name, "seed": seed, "dir": str(org_dir),
                                  "failure": spec.failure, "family": spec.family, "brittle": spec.brittle,
                                  "base_kind": spec.base, "base": b, "derived": before, "coherence": coh,
                                  "units": s.units, "seconds": round(time.time() - t0, 1)})
                    log(f"[audit] {name} seed {seed}: misalignment base {b['misalignment']:.3f} -> organism "
                        f"{before['misalignment']:.3f} (unparsed {before['unparsed']:.3f}); capability "
                        f"{b[CAPABILITY]:.3f} -> {before[CAPABILITY]:.3f}; coherence agreement "
                        f"{_f(coh['agreement'])}, margin {_f(coh['margin'])} ({time.time() - t0:.0f}s)")
                for method in cfg.methods:
                    if ("cell", name, method, seed) in done:
                        continue
                    rec = run_cell(cfg, s, method, org_dir, cap_probes, before, reward_dir=base)
                    _append(out, rec)
                    a = rec["after"]
                    log(f"[audit] {name} / {method} / seed {seed}: misalignment {before['misalignment']:.3f} -> "
                        f"{a['misalignment']:.3f}, unparsed {before['unparsed']:.3f} -> {a['unparsed']:.3f}, "
                        f"capability {a[CAPABILITY]:.3f} ({rec['seconds']['total']:.0f}s; "
                        f"{time.time() - t_start:.0f}s so far)")
        return out


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"
