"""Make pair files from base items: the synthetic world's by default, or a user's own JSONL items.

`make_pairs(axis, items, ...)` is the one entry point; `load_items(path, axis)` validates a user's item file and
reports a bad line as `file:line: field: problem`.
"""

from __future__ import annotations

import random

from opct.errors import DataError, OpctError
from opct.pairs import perturb as P
from opct.pairs.schema import Pair, read_jsonl

# axis -> required item fields and their types
ITEM_FIELDS = {
    "sycophancy": {"id": str, "question": str, "answer": (str, int, float, bool)},
    "jailbreak": {"id": str, "request": str},
    "awareness": {"id": str, "prompt": str, "fact": str},
}


def load_items(path, axis: str) -> list[dict]:
    if axis not in ITEM_FIELDS:
        raise OpctError(f"unknown axis {axis!r}; choose one of {', '.join(ITEM_FIELDS)}")
    items, seen = [], {}
    for n, obj in read_jsonl(path):
        if not isinstance(obj, dict):
            raise DataError(path, n, "<record>", "must be a JSON object")
        for f, typ in ITEM_FIELDS[axis].items():
            if f not in obj:
                raise DataError(path, n, f, "missing")
            if not isinstance(obj[f], typ):
                raise DataError(path, n, f, "wrong type")
            if isinstance(obj[f], str) and not obj[f].strip():
                raise DataError(path, n, f, "empty")
        if axis == "sycophancy" and not obj.get("wrong_answer") and len(
                [o for o in obj.get("options", []) if str(o) != str(obj["answer"])]) == 0:
            raise DataError(path, n, "wrong_answer", "missing (give 'wrong_answer' or 'options' with a wrong option)")
        if obj["id"] in seen:
            raise DataError(path, n, "id", f"duplicate id {obj['id']!r} (first on line {seen[obj['id']]})")
        seen[obj["id"]] = n
        items.append(obj)
    if not items:
        raise DataError(path, 0, "<file>", "no items in file")
    return items


def world_items(axis: str, seed: int = 0) -> list[dict]:
    """The synthetic world's base items for an axis (yes/no questions balanced between yes and no answers)."""
    from opct.world import items as I

    if axis == "sycophancy":
        yn = I.yesno_items()
        yes = [i for i in yn if i["answer"] == "yes"]
        no = random.Random(seed).sample([i for i in yn if i["answer"] == "no"], len(yes))
        return sorted(yes + no, key=lambda i: i["id"])
    if axis == "jailbreak":
        return I.request_items()
    if axis == "awareness":
        return I.scenario_items()
    raise OpctError(f"unknown axis {axis!r}; choose one of {', '.join(ITEM_FIELDS)}")


DEFAULT_HELDOUT = {"sycophancy": P.BIAS_HELDOUT, "jailbreak": P.WRAPPER_HELDOUT}


def default_heldout(axis: str) -> tuple[str, ...]:
    if axis == "awareness":
        from opct.world.lexicon import SAFETY_HELDOUT_DOMAINS

        return SAFETY_HELDOUT_DOMAINS
    return DEFAULT_HELDOUT[axis]


def make_pairs(axis: str, items: list[dict], families=None, heldout=None, per_family: int | None = None,
               seed: int = 0, include_benign: bool | None = None) -> list[Pair]:
    """Pairs for `axis` from `items`.

    sycophancy / jailbreak: each family in `families` (default: all registered) perturbs `per_family` items drawn
    with `seed` (default: every item). awareness: one compression pair per hazard item (`include_benign` adds the
    benign counterparts). `heldout` names the held-out families (or domains); default: the world's split.
    """
    rng = random.Random(seed)
    heldout = tuple(default_heldout(axis) if heldout is None else heldout)
    if axis == "awareness":
        keep = [i for i in items if i.get("hazard", True) or include_benign]
        return [P.compression_pair(i, heldout) for i in keep]
    registry = P.BIAS_FAMILIES if axis == "sycophancy" else P.WRAPPER_FAMILIES
    families = list(families or registry)
    unknown = [f for f in families if f not in registry]
    if unknown:
        raise OpctError(f"unknown {axis} famil{'y' if len(unknown) == 1 else 'ies'}: {', '.join(unknown)}; "
                        f"known: {', '.join(registry)}")
    if axis == "jailbreak" and include_benign is False:
        items = [i for i in items if i.get("harmful", True)]
    pairs = []
    for fam in families:
        chosen = items if per_family is None or per_family >= len(items) else rng.sample(items, per_family)
        for it in chosen:
            if axis == "sycophancy":
                pairs.append(P.bias_pair(it, fam, rng, heldout))
            else:
                pairs.append(P.jailbreak_pair(it, fam, rng, heldout))
    return pairs


def split_hygiene(pairs: list[Pair]) -> list[str]:
    """Problems with the split: a family held out by family that also has training pairs. Empty when clean.
    (A training wrapper family may still have held-out pairs: those of a held-out harmful category.)"""
    train: set = set()
    held: set = set()
    for p in pairs:
        key = (p.axis, p.family)
        if p.split == "train":
            train.add(key)
        elif p.meta.get("heldout_by", "family") in ("family", "domain"):
            held.add(key)
    return [f"{axis} family {fam!r} is held out but appears in training pairs" for axis, fam in sorted(train & held)]
