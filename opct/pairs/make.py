"""Make pair files from base items: the synthetic world's by default, or a user's own JSONL items. Each axis
(`opct.axes`) says how its items become pairs; this module is the loop over them that `opct pairs make` and the
experiment runner share.

`make_pairs(axis, items, ...)` is the one entry point; `load_items(path, axis)` validates a user's item file and
reports a bad line as `file:line: field: problem`.
"""

from __future__ import annotations

from opct.axes import AXES, get, pair_axes
from opct.errors import OpctError
from opct.flags import first_repeat
from opct.pairs.schema import Pair


def _pair_axis(axis: str):
    a = get(axis)
    if a.make_pairs is None:
        raise OpctError(f"axis {axis!r} is only evaluated; it makes no pairs (pair axes: {', '.join(pair_axes())})")
    return a


def load_items(path, axis: str) -> list[dict]:
    return _pair_axis(axis).load_items(path, for_eval=False)


def world_items(axis: str, seed: int = 0) -> list[dict]:
    """The synthetic world's base items for an axis."""
    return _pair_axis(axis).world_items(seed)


def default_heldout(axis: str) -> tuple[str, ...]:
    return tuple(get(axis).heldout)


def make_pairs(axis: str, items: list[dict], families=None, heldout=None, per_family: int | None = None,
               seed: int = 0, include_benign: bool | None = None, **options) -> list[Pair]:
    """Pairs for `axis` from `items`: each family in `families` (default: all of the axis's) perturbs `per_family`
    items drawn with `seed` (default: every item); `heldout` names the held-out families (default: the axis's);
    `include_benign` keeps or drops the benign items (each axis's default when None); `options` are the axis's
    pair options (`Axis.pair_options`, e.g. awareness: teacher=guideline)."""
    a = _pair_axis(axis)
    for k, v in options.items():
        if k not in a.pair_options:
            raise OpctError(f"{axis} pairs take no option {k!r} (options: {', '.join(a.pair_options) or 'none'})")
        if v not in a.pair_options[k]:
            raise OpctError(f"{axis} pair option {k}: must be one of {', '.join(a.pair_options[k])} (got {v!r})")
    if per_family is not None and per_family < 1:
        raise OpctError(f"--per-family must be at least 1 (got {per_family})")
    for flag, names in (("", families), ("held-out ", heldout)):  # twice: its pairs made twice, with the same ids
        twice = first_repeat(names or ())
        if twice is not None:
            raise OpctError(f"{axis} {flag}families name {twice!r} twice (got {', '.join(map(str, names))})")
    for flag, names in (("", families), ("held-out ", heldout)):  # a misspelt held-out family would hold out nothing
        unknown = [f for f in names or () if f not in a.families]
        if unknown and not a.open_families:
            raise OpctError(f"unknown {flag}{axis} famil{'y' if len(unknown) == 1 else 'ies'}: {', '.join(unknown)}; "
                            f"known: {', '.join(a.families)}")
    pairs = a.make_pairs(items, families=families, heldout=a.heldout if heldout is None else tuple(heldout),
                         per_family=per_family, seed=seed, benign=include_benign, **options)
    if a.open_families:  # families of the user's items: a name no item has is a typo, not a family
        made = {p.meta.get("family") for p in pairs}
        for flag, names in (("", families), ("held-out ", heldout)):
            unknown = [f for f in names or () if f not in made and f not in a.families]
            if unknown:
                every = {p.meta.get("family") for p in a.make_pairs(items, benign=True, **options)} - {None}
                raise OpctError(f"{flag}{axis} famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}: no "
                                f"item has {'it' if len(unknown) == 1 else 'them'}; the items' families: "
                                f"{', '.join(sorted(every | set(a.families)))}")
    return pairs


def replay_pairs(n: int, seed: int = 0) -> list[Pair]:
    """`n` benign anchor pairs (teacher = student = a benign prompt no evaluation asks, `opct.world.items.
    replay_items`), drawn with `seed`: under BCT, the model's own greedy answers at weight 1 (benign
    regularisation); under OPCT, a KL to the starting model on benign prompts."""
    import random

    from opct.world.items import replay_items

    rng = random.Random(seed)
    kinds: dict[str, list] = {}
    for it in replay_items():
        kinds.setdefault(it["kind"], []).append(it)
    for pool in kinds.values():
        rng.shuffle(pool)
    # as many of each kind as there are of the others (round robin), so the large arithmetic pool does not dominate
    chosen = [pool[i] for i in range(max(map(len, kinds.values()))) for pool in kinds.values() if i < len(pool)][:n]
    return [Pair(id=f"replay-{it['id']}", axis="custom", task="invariance",
                 teacher=[{"role": "user", "content": it["question"]}],
                 student=[{"role": "user", "content": it["question"]}],
                 meta={"family": "benign_replay", "split": "train", "item_id": it["id"]}) for it in chosen]


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


def check_families(pairs: list[Pair], path) -> None:
    """A DataError naming the first pair of `pairs` (loaded from `path`) whose family is none of its axis's
    (`Axis.pair_families`), with the axis's families. An axis whose families a user's items bring (awareness), one
    without families (capability) and the `custom` axis take any family. Until 2026-12 `opct pairs check` and `opct run --pairs` took such a pair: a
    misspelt family ('suggested-answer') escaped the held-out check, which compares known families only."""
    bad = [p for p in pairs if p.axis in AXES and AXES[p.axis].families and not AXES[p.axis].open_families
           and p.family not in AXES[p.axis].pair_families()]
    if bad:
        from opct.errors import DataError
        from opct.pairs.schema import line_of

        p, more = bad[0], f" ({len(bad)} pairs of unknown families in all)" if len(bad) > 1 else ""
        raise DataError(path, line_of(path, p.id), "meta.family", f"{p.axis} has no family {p.family!r}{more}; "
                                                                   f"known: {', '.join(AXES[p.axis].pair_families())}")


def trained_on(pairs: list[Pair]) -> dict[str, list[str]]:
    """Per registered axis, the families of its own that `pairs` train on (meta.split == 'train'): what `opct eval
    --trained` should be told about a model trained on them."""
    out: dict[str, list[str]] = {}
    for p in pairs:
        a = AXES.get(p.axis)
        if p.split == "train" and a is not None and p.family in a.families and p.family not in out.get(p.axis, []):
            out.setdefault(p.axis, []).append(p.family)
    return {axis: sorted(fams) for axis, fams in out.items()}


def trains_heldout(pairs: list[Pair], trained: dict[str, list[str]] | None) -> list[Pair]:
    """The training pairs of a family that an evaluation told `trained` labels held out (None: `opct eval`'s default,
    each axis's world train families): training on them puts trained prompts in the held-out metrics."""
    def train_families(axis):
        return AXES[axis].train_families() if trained is None else trained.get(axis, ())

    return [p for p in pairs if p.split == "train" and p.axis in AXES and p.family in AXES[p.axis].families
            and p.family not in train_families(p.axis)]


__all__ = ["AXES", "load_items", "world_items", "default_heldout", "make_pairs", "split_hygiene", "check_families",
           "trained_on", "trains_heldout"]
