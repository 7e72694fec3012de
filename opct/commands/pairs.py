"""`opct pairs make|check`: build contrastive-pair files from base items, and validate pair files."""

from __future__ import annotations

from collections import Counter

from opct.errors import OpctError


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _positive(text: str) -> int:
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer (got {text!r})") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {n})")
    return n


def _option(text: str) -> tuple[str, str]:
    import argparse

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (got {text!r})")
    return key.strip(), value.strip()


def register(sub) -> None:
    from opct.axes import AXES, pair_axes

    axes = pair_axes()
    p = sub.add_parser("pairs", help="make or check contrastive-pair files (JSONL)")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    m = verbs.add_parser("make", help="perturb base items into pairs",
                         description="Turn base items (the synthetic world's, or your own JSONL with --items) into "
                                     "contrastive pairs. " + "; ".join(f"{a}: {AXES[a].doc}" for a in axes) + ".")
    m.add_argument("--axis", required=True, choices=axes)
    m.add_argument("--out", required=True, help="output JSONL (written atomically)")
    m.add_argument("--items", default=None,
                   help="your own items JSONL (" + "; ".join(f"{a}: {AXES[a].items_help}" for a in axes) + ")")
    m.add_argument("--families", type=_csv, default=None, help="comma-separated families (default: all)")
    m.add_argument("--heldout", type=_csv, default=None,
                   help="comma-separated held-out families (awareness: domains); default: the world's split")
    m.add_argument("--per-family", type=_positive, default=None, help="items drawn per family (default: all)")
    m.add_argument("--split", choices=["train", "heldout", "all"], default="all", help="which pairs to keep")
    m.add_argument("--no-benign", dest="include_benign", action="store_false", default=None,
                   help="jailbreak: drop benign requests")
    m.add_argument("--benign", dest="include_benign", action="store_true",
                   help="awareness: also pair the benign scenarios; prefill: also the anchor pairs (benign requests "
                        "under each prefill, every request asked directly)")
    m.add_argument("--option", dest="options", action="append", type=_option, default=[], metavar="KEY=VALUE",
                   help="a pair option of the axis (" + "; ".join(
                       f"{a}: " + ", ".join(f"{k}={'|'.join(v)}" for k, v in AXES[a].pair_options.items())
                       for a in axes if AXES[a].pair_options) + ")")
    m.add_argument("--seed", type=int, default=0)
    m.set_defaults(func=_make)

    c = verbs.add_parser("check", help="validate a pairs file and summarise it",
                         description="Validate every line (errors are reported as file:line: field: problem), "
                                     "check that no held-out family has training pairs, and print counts.")
    c.add_argument("file")
    c.set_defaults(func=_check)


def _make(args) -> int:
    from opct.pairs.make import load_items, make_pairs, world_items
    from opct.pairs.schema import save_pairs

    items = load_items(args.items, args.axis) if args.items else world_items(args.axis, args.seed)
    pairs = make_pairs(args.axis, items, families=args.families, heldout=args.heldout,
                       per_family=args.per_family, seed=args.seed, include_benign=args.include_benign,
                       **dict(args.options))
    if args.split != "all":
        pairs = [p for p in pairs if p.split == args.split]
    if not pairs:
        raise OpctError("no pairs made (check --families, --split and your items)")
    save_pairs(pairs, args.out)
    _summary(pairs)
    print(args.out)
    return 0


def _check(args) -> int:
    from opct.pairs.make import split_hygiene
    from opct.pairs.schema import load_pairs

    pairs = load_pairs(args.file)
    problems = split_hygiene(pairs)
    _summary(pairs)
    if problems:
        raise OpctError(f"{args.file}: " + "; ".join(problems))
    print(f"{args.file}: {len(pairs)} pairs OK")
    return 0


def _summary(pairs) -> None:
    counts = Counter((p.axis, p.family, p.split) for p in pairs)
    w = max(len(f) for _, f, _ in counts)
    for (axis, fam, split), n in sorted(counts.items()):
        print(f"  {axis:<11} {fam:<{w}}  {split:<8} {n:>6}")
