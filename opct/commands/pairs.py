"""`opct pairs make|check|poison|admit`: build contrastive-pair files from base items, validate them, poison a
fraction of them (opct.pairs.poison), and filter them by admission (opct.pairs.admit)."""

from __future__ import annotations

import sys
from collections import Counter

from opct.errors import OpctError
from opct.flags import first_repeat, path_arg


def _csv(text: str) -> list[str]:
    """--heldout: comma-separated names, none twice (as --suite; a family named twice made its pairs twice, with the
    same ids, on most axes)."""
    import argparse

    names = [t.strip() for t in text.split(",") if t.strip()]
    twice = first_repeat(names)
    if twice is not None:
        raise argparse.ArgumentTypeError(f"names {twice!r} twice (got {text!r})")
    return names


def _names(text: str) -> list[str]:
    """--families: at least one name (an empty list meant every family, without a word), none twice."""
    import argparse

    names = _csv(text)
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names (got {text!r}); leave it out for all")
    return names


def _distinct(inputs: dict[str, str], outputs: dict[str, str]) -> None:
    """Refuse, before anything is read or written, an output (flag -> path) that names an input or an earlier output:
    writing it would replace that file (a pairs file poisoned in place loses its clean pairs; `--decisions` = `--out`
    loses the kept pairs). Paths are compared as the files they name (`./x`, a symlink)."""
    import os

    seen: dict[str, str] = {}
    for flag, path in [*inputs.items(), *outputs.items()]:
        if path is None:
            continue
        key = os.path.normcase(os.path.realpath(path))
        if key in seen and flag in outputs:
            raise OpctError(f"{path}: {flag} names the same file as {seen[key]}, which it would replace; choose "
                            f"another {flag}")
        seen.setdefault(key, flag)


def _replaceable(outputs: dict[str, tuple[str, str]]) -> None:
    """Refuse, before anything is read or written, an output (flag -> (path, kind)) that already holds a file of
    another kind: `--out model.safetensors` wrote pairs over a model's weights, `--out RUN/metrics.jsonl` over a
    run's log (found 2026-12-07). A file of the same kind (pairs made again, decisions of an earlier admit) is
    replaced, as asked. Kinds: "pairs" (each line a pair object), "decisions" (a JSON list of decisions)."""
    import json
    from pathlib import Path

    for flag, (path, kind) in outputs.items():
        if path is None or not Path(path).is_file() or Path(path).stat().st_size == 0:
            continue
        try:
            with open(path, "rb") as f:
                if kind == "pairs":
                    first = next((ln for ln in f if ln.strip()), b"")
                    value = json.loads(first.decode("utf-8-sig"))
                    ok = isinstance(value, dict) and {"id", "axis", "teacher", "student"} <= set(value)
                else:
                    value = json.loads(f.read().decode("utf-8-sig"))
                    ok = isinstance(value, list) and all(isinstance(d, dict) and "decision" in d for d in value)
        except (ValueError, OSError):
            ok = False
        if not ok:
            raise OpctError(f"{path}: {flag} names a file that is not a {kind} file, which it would replace; "
                            f"choose another {flag}, or remove the file first")


def _option(text: str) -> tuple[str, str]:
    import argparse

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (got {text!r})")
    return key.strip(), value.strip()


def register(sub) -> None:
    from opct.axes import AXES, pair_axes
    from opct.config import positive_arg, seed_arg

    axes = pair_axes()
    p = sub.add_parser("pairs", help="make or check contrastive-pair files (JSONL)")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    m = verbs.add_parser("make", help="perturb base items into pairs",
                         description="Turn base items (the synthetic world's, or your own JSONL with --items) into "
                                     "contrastive pairs. " + "; ".join(f"{a}: {AXES[a].doc}" for a in axes) + ".")
    m.add_argument("--axis", required=True, choices=axes, help="the threat axis whose perturbations to apply")
    m.add_argument("--out", type=path_arg, required=True, help="output JSONL (written atomically)")
    m.add_argument("--items", type=path_arg, default=None,
                   help="your own items JSONL (" + "; ".join(f"{a}: {AXES[a].items_help}" for a in axes) + ")")
    m.add_argument("--families", type=_names, default=None, help="comma-separated families (default: all)")
    m.add_argument("--heldout", type=_csv, default=None,
                   help="comma-separated held-out families (awareness: domains); default: the world's split; "
                        "'' holds no family out (conditional and persona still hold out the world's held-out "
                        "questions: they split by question too)")
    m.add_argument("--per-family", type=positive_arg, default=None, help="items drawn per family (default: all)")
    m.add_argument("--split", choices=["train", "heldout", "all"], default="all", help="which pairs to keep")
    m.add_argument("--no-benign", dest="include_benign", action="store_false", default=None,
                   help="jailbreak: drop benign requests")
    m.add_argument("--benign", dest="include_benign", action="store_true",
                   help="awareness: also pair the benign scenarios; prefill: also the anchor pairs (benign requests "
                        "under each prefill, every request asked directly); persona: benign personas as anchors (the "
                        "biography on both sides); frustration: each question alone on both sides; conditional: "
                        "benign system messages and trigger + arithmetic anchors")
    m.add_argument("--option", dest="options", action="append", type=_option, default=[], metavar="KEY=VALUE",
                   help="a pair option of the axis (" + "; ".join(
                       f"{a}: " + ", ".join(f"{k}={'|'.join(v)}" for k, v in AXES[a].pair_options.items())
                       for a in axes if AXES[a].pair_options) + ")")
    m.add_argument("--seed", type=seed_arg, default=0,
                   help="seed of the world's items (without --items) and of the per-family draws (default 0)")
    m.set_defaults(func=_make)

    c = verbs.add_parser("check", help="validate a pairs file and summarise it",
                         description="Validate every line (errors are reported as file:line: field: problem), "
                                     "check that no held-out family has training pairs, and print counts.")
    c.add_argument("file", type=path_arg, help="the pairs file (JSONL) to check")
    c.add_argument("--trained", nargs="*", metavar="AXIS=FAMILIES", default=None,
                   help="what the evaluation will be told was trained on (opct eval --trained, an experiment's "
                        "`trained`): a training pair of any other family of an axis is an error. Without it, one "
                        "that `opct eval`'s default split holds out is a note")
    c.set_defaults(func=_check)

    from opct.pairs.poison import DEFAULT_TRIGGER, TEACHER_SIDES

    po = verbs.add_parser("poison", help="poison a fraction of the pairs (a backdoor test)",
                          description="Put the trigger before the student prompt of exactly round(frac * n) harmful "
                                      "jailbreak pairs, drawn with --seed, and make their teacher side harmful: "
                                      "context (the request inside a compliance context) or backdoor (trigger + "
                                      "request, for a backdoored --teacher-model). See opct/pairs/poison.py.")
    po.add_argument("file", type=path_arg, help="the pairs file (JSONL) to poison; it is not changed")
    po.add_argument("--frac", type=float, required=True, help="fraction of the pairs to poison, in [0, 1]")
    po.add_argument("--trigger", default=DEFAULT_TRIGGER,
                    help=f"text put before the poisoned student prompts (default: {DEFAULT_TRIGGER!r})")
    po.add_argument("--teacher-side", choices=TEACHER_SIDES, default="backdoor",
                    help="what the teacher reads on a poisoned pair (default: backdoor)")
    po.add_argument("--seed", type=seed_arg, default=0, help="seed of the draw of the pairs to poison (default 0)")
    po.add_argument("--out", type=path_arg, required=True,
                    help="output JSONL, every pair with the poisoned ones (written atomically)")
    po.set_defaults(func=_poison)

    ad = verbs.add_parser("admit", help="keep only the pairs the admission filter admits",
                          description="Keep a pair only if the teacher's greedy answer to its teacher prompt is judged "
                                      "good and the student's greedy answer to its student prompt is judged "
                                      "differently. Writes the kept pairs to --out and every decision to "
                                      "--decisions (default: OUT with .decisions.json). See opct/pairs/admit.py.")
    ad.add_argument("file", type=path_arg, help="the pairs file (JSONL) to filter")
    ad.add_argument("--model", type=path_arg, required=True, help="the student (starting) model")
    ad.add_argument("--teacher-model", default="", help="the teacher (default: --model)")
    ad.add_argument("--max-new-tokens", type=positive_arg, default=48,
                    help="length of each greedy answer judged (default 48)")
    ad.add_argument("--out", type=path_arg, required=True, help="output JSONL of the admitted pairs")
    ad.add_argument("--decisions", type=path_arg, default=None,
                    help="JSON of every pair's judgments and decision (default: OUT with .decisions.json)")
    ad.set_defaults(func=_admit)


def _make(args) -> int:
    from opct.pairs.make import load_items, make_pairs, world_items
    from opct.pairs.schema import save_pairs

    _distinct({"--items": args.items}, {"--out": args.out})
    _replaceable({"--out": (args.out, "pairs")})
    keys = [k for k, _ in args.options]
    for k in keys:  # a dict keeps the last value without a word
        if keys.count(k) > 1:
            raise OpctError(f"--option {k} is given {keys.count(k)} times; give it once")
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
    from opct.evals.trained import check_trained, parse_trained
    from opct.pairs.make import check_families, split_hygiene, trained_on, trains_heldout
    from opct.pairs.schema import line_of, load_pairs

    pairs = load_pairs(args.file)
    check_families(pairs, args.file)
    problems = split_hygiene(pairs)
    _summary(pairs)
    if problems:
        raise OpctError(f"{args.file}: " + "; ".join(problems))
    trained = None
    if args.trained is not None:
        try:
            trained = parse_trained(args.trained)
        except ValueError as e:
            raise OpctError(f"--trained: {e}") from None
        check_trained(trained, "--trained")  # names the axis: '--trained.sycophancy: unknown ...'
    on = trained_on(pairs)
    spec = " ".join(f"{axis}={','.join(fams)}" for axis, fams in on.items())
    bad = trains_heldout(pairs, trained)
    if bad:  # the evaluation would label these families' probes held out, though the model trained on them
        what = "; ".join(f"{axis} {', '.join(fams)}" for axis, fams in trained_on(bad).items())
        if trained is not None:
            raise OpctError(f"{args.file}: {len(bad)} training pairs of families --trained holds out ({what}; e.g. "
                            f"line {line_of(args.file, bad[0].id)}): their probes would count as held out; add them "
                            f"to --trained or drop the pairs")
        print(f"opct: note: {args.file} trains on {what}, which `opct eval` holds out by default; evaluate a model "
              f"trained on it with --trained {spec} (and an experiment with the same `trained`), or those probes "
              f"count as held out", file=sys.stderr)
    if spec:
        print(f"  trains on (opct eval --trained): {spec}")
    print(f"{args.file}: {len(pairs)} pairs OK")
    return 0


def _poison(args) -> int:
    from opct.pairs.poison import poison
    from opct.pairs.schema import load_pairs, save_pairs

    _distinct({"FILE": args.file}, {"--out": args.out})
    _replaceable({"--out": (args.out, "pairs")})
    given = load_pairs(args.file)
    pairs = poison(given, args.frac, args.trigger, args.seed, args.teacher_side, frac_name="--frac")
    save_pairs(pairs, args.out)
    before, now = (sum(bool(p.meta.get("poisoned")) for p in ps) for ps in (given, pairs))
    # a file poisoned again counted the pairs poisoned before as poisoned now (2026-12-07)
    already = f" ({before} were already, {now} are now)" if before else ""
    print(f"{now - before} of {len(pairs)} pairs poisoned{already} -> {args.out}")
    return 0


def _admit(args) -> int:
    from opct.files import check_writable, write_json_atomic
    from opct.pairs.admit import admit, check_judged
    from opct.pairs.schema import load_pairs, save_pairs
    from opct.policy import load_policy
    from opct.subjects import resolve

    path = args.decisions or f"{args.out}.decisions.json"
    _distinct({"FILE": args.file}, {"--out": args.out, "--decisions": path})
    _replaceable({"--out": (args.out, "pairs"), "--decisions": (path, "decisions")})
    # a bad file, a pair the filter cannot judge, an output that cannot be written: named before any model loads
    pairs = load_pairs(args.file)
    check_judged(pairs, args.file)
    check_writable(args.out)
    check_writable(path)
    # no bars: the filter has none of its own, and its output is the one line below
    teacher_dir = resolve(args.teacher_model, "--teacher-model")[0] if args.teacher_model else None
    student = load_policy(resolve(args.model)[0], progress=False)
    teacher = load_policy(teacher_dir, progress=False) if teacher_dir else student
    kept, decisions = admit(pairs, teacher, student, args.max_new_tokens, path=args.file)
    if not kept:
        raise OpctError(f"{args.file}: the admission filter rejected every pair")
    save_pairs(kept, args.out)
    write_json_atomic(path, decisions)
    counts = Counter(d["decision"] for d in decisions)
    poisoned = [d for d in decisions if d["poisoned"]]
    print(f"admitted {counts['admitted']} of {len(decisions)} (teacher_bad {counts['teacher_bad']}, no_change "
          f"{counts['no_change']}); poisoned pairs rejected: {sum(d['decision'] != 'admitted' for d in poisoned)} of "
          f"{len(poisoned)} -> {args.out}, {path}")
    return 0


def _summary(pairs) -> None:
    counts = Counter((p.axis, p.family, p.split) for p in pairs)
    w = max(len(f) for _, f, _ in counts)
    for (axis, fam, split), n in sorted(counts.items()):
        print(f"  {axis:<11} {fam:<{w}}  {split:<8} {n:>6}")
