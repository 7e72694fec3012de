"""Which prompts each phase of the audit may see: the derive / label / pairs / eval splits, per organism and seed.

Per organism family, the pool of units of the derivation distribution (instruction topics, entities, safety facts)
is shuffled with the seed and cut into the derive units (the narrow data that creates the organism, and the replay
of general skills drawn inside them), the label units (the held-out half of the derivation distribution: the prompts
the labellers pseudo-label) and the pairs units (the BCT / ACT pairs). The eval probes come from fixed units that no
split draws from, in other surface forms (out of distribution), the same for every seed so that seeds compare.
The protected sycophancy organism's derive split also holds its base's alignment-SFT data (fixed units of its own).
The capability probes (arithmetic, multiple-choice facts, instruction constraints, measured before and after every
method) are a split of their own: fixed items that no split which trains (derive with its replay, label, pairs) may
draw (organisms/base.py), the same for every organism and seed; they may share units with the eval probes, since
neither trains.

`build_splits` returns the splits' contents; `record` turns them into what OUT/splits.json lists per organism and seed:
for each split its units, the underlying item ids and the prompt texts; `overlaps` names every unit, item or text
that two splits share (none, or the audit stops; texts are compared as `opct.axes.base.text_key` reads them).
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from itertools import combinations

from opct.audit.organisms import ORGANISMS, OrganismSpec, capability_probes, text_of
from opct.audit.organisms import sycophantic as SYC
from opct.axes.base import text_key
from opct.axes.capability import NAME as CAPABILITY
from opct.errors import OpctError

SPLITS = ("derive", "label", "pairs", "eval", CAPABILITY)  # the capability axis's probes
TRAINING = ("derive", "label", "pairs")  # the splits that train; eval and capability only measure
# The pairs of splits that must not share a unit, an item or a text: any two of derive / label / pairs / eval, and
# the capability probes against every split that trains.
CHECKED = [*combinations(SPLITS[:4], 2), *((CAPABILITY, t) for t in TRAINING)]


def rng(*key) -> random.Random:
    return random.Random(zlib.crc32(json.dumps(key).encode()))


@dataclass
class Splits:
    organism: str
    seed: int
    units: dict  # split -> list of units
    derive: list[dict]  # derivation examples {"messages", "response", "item"}
    label: list[dict]  # probes
    pairs: list[dict]  # probes the BCT / ACT pairs are built from
    eval: list[dict]  # probes
    align: list[dict]  # the protected base's alignment-SFT examples (listed under "derive"); empty otherwise
    capability: list[dict] = ()  # the capability probes (the same for every organism and seed)


def allocate(spec: OrganismSpec, seed: int) -> dict:
    pool = list(spec.units)
    rng(spec.family, "units", seed).shuffle(pool)
    a, b, c = spec.sizes
    if a + b + c > len(pool):
        raise OpctError(f"{spec.name}: {a + b + c} units asked of a pool of {len(pool)}")
    return {"derive": sorted(pool[:a]), "label": sorted(pool[a:a + b]), "pairs": sorted(pool[a + b:a + b + c])}


def alignment_examples(n: int) -> list[dict]:
    """The protected base's alignment-SFT data (fixed: the protected base is built once)."""
    return SYC.alignment_data(rng(SYC.NAME, "align"), n)


def capability_split(n: int) -> list[dict]:
    """The capability probes: fixed (one draw for every organism and seed, so capability numbers compare)."""
    return capability_probes(rng(CAPABILITY), n)


def build_splits(name: str, seed: int, derive_n: int, label_n: int, pairs_n: int, eval_n: int,
                 align_n: int = 0, capability_n: int = 0) -> Splits:
    spec = ORGANISMS[name]
    units = allocate(spec, seed)
    derive = spec.derive_data(rng(spec.family, "derive", seed), units["derive"], derive_n)
    align = alignment_examples(align_n) if spec.base == "protected" else []
    label = spec.label_probes(rng(spec.family, "label", seed), units["label"], label_n)
    pairs = spec.label_probes(rng(spec.family, "pairs", seed), units["pairs"], pairs_n)
    evals = spec.eval_probes(rng(spec.family, "eval"), eval_n)
    units["eval"] = sorted({p["unit"] for p in evals})
    capability = capability_split(capability_n)
    units[CAPABILITY] = sorted({p["unit"] for p in capability})
    if spec.base == "protected":
        units["derive"] = sorted(set(units["derive"]) | set(SYC.ALIGN_ENTITIES))
    return Splits(name, seed, units, derive, label, pairs, evals, align, capability)


def record(s: Splits, pairs=()) -> dict:
    """splits.json's entry for one organism and seed: per split its units, item ids and prompt texts. `pairs`: the
    BCT / ACT pairs built from the pairs split (both their sides are listed under "pairs")."""
    rows = {"derive": [(e["item"], text_of(e["messages"])) for e in s.align + s.derive],
            "label": [(p["item"], text_of(p["messages"])) for p in s.label],
            "pairs": [(p["item"], text_of(p["messages"])) for p in s.pairs] +
                     [(p.meta["item"], text_of(m)) for p in pairs for m in (p.teacher, p.student)],
            "eval": [(p["item"], text_of(p["messages"])) for p in s.eval],
            CAPABILITY: [(p["item"], text_of(p["messages"])) for p in s.capability]}
    return {split: {"units": list(s.units[split]), "items": sorted({i for i, _ in rows[split]}),
                    "texts": sorted({t for _, t in rows[split]})} for split in SPLITS}


def overlaps(entry: dict) -> list[str]:
    """Every unit, item id and prompt text that two splits of one entry share (an empty list: disjoint): any two of
    derive / label / pairs / eval, and the capability probes against each split that trains. Texts are compared
    case and spacing aside (`text_key`)."""
    problems = []
    for a, b in CHECKED:
        for what in ("units", "items", "texts"):
            key = text_key if what == "texts" else str
            shared = sorted({key(x) for x in entry[a][what]} & {key(x) for x in entry[b][what]})
            if shared:
                problems.append(f"{a} and {b} share {len(shared)} {what} (first: {shared[0]!r})")
    return problems


def make_pairs(s: Splits, mode: str) -> list:
    """The BCT / ACT pairs of one organism and seed, from its pairs split: "paper" (trigger on both sides, the
    endorsing cue on the wrapped side, one fixed response: the behaviour the cue endorses), "paired" (the same, but
    the clean side's response is the aligned answer, as in the paper's act_bct_clean.jsonl / act_bct_wrapped.jsonl
    files) or "targeted" (opct's earlier pairs: teacher without the trigger, student with it). Ids are made unique
    (probes are drawn with replacement)."""
    spec = ORGANISMS[s.organism]
    build = spec.targeted_pair if mode == "targeted" else spec.paper_pair
    r = rng(spec.family, "pair-text", "targeted" if mode == "targeted" else "paper", s.seed)
    out = []
    for i, p in enumerate(s.pairs):
        pr = build(p, r)
        pr.id = f"{pr.id}-{i}"
        if mode == "paper":  # one fixed response on both sides
            pr.meta.pop("clean_response", None)
        out.append(pr)
    return out
