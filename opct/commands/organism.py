"""`opct organism build|profile`: build the embedded model organism, or measure the profile of a model dir."""

from __future__ import annotations

import json
from pathlib import Path

from opct.errors import OpctError
from opct.flags import path_arg


def register(sub) -> None:
    from opct.config import positive_arg, seed_arg

    p = sub.add_parser("organism", help="build the embedded model organism or measure a profile")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    b = verbs.add_parser("build", help="build (or find the shipped/cached) organism; prints its directory last",
                         description="Train the synthetic-world tokenizer and a Llama-architecture model from "
                                     "scratch on the CPU, measure its profile by sampling, and print the "
                                     "organism's directory as the last line. Returns at once when an organism "
                                     "with the same configuration is shipped or cached.")
    b.add_argument("--size", default="default", choices=["default", "test"], help="organism size (default: default)")
    b.add_argument("--seed", type=seed_arg, default=None, help="build seed (default: the size's own, 0)")
    b.add_argument("--force", action="store_true", help="rebuild even if a matching organism exists")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    b.set_defaults(func=_build)

    pr = verbs.add_parser("profile", help="measure the behaviour profile of a model directory by sampling",
                          description="Sample at temperature 1 from a saved model and print its profile.")
    pr.add_argument("model", type=path_arg, help="model directory (save_pretrained format, safetensors)")
    pr.add_argument("--n", type=positive_arg, default=200, help="sampled responses per behaviour (default 200)")
    pr.add_argument("--seed", type=seed_arg, default=0, help="sampling seed (default 0)")
    pr.add_argument("--out", type=path_arg, default=None, help="write the profile JSON here")
    pr.set_defaults(func=_profile)


def _build(args) -> int:
    from opct.organism.build import build_organism
    from opct.organism.profile import print_profile

    d = build_organism(args.size, force=args.force, progress=not args.quiet, seed=args.seed)
    profile = json.loads((d / "profile.json").read_text())
    meta = json.loads((d / "organism.json").read_text())
    print_profile(profile)
    print(f"built in {meta.get('build_seconds', '?')} s; {meta.get('n_params', 0):,} parameters")
    print(d)
    return 0


def _profile(args) -> int:
    from opct.organism.profile import measure_profile, print_profile

    if not (Path(args.model) / "config.json").exists():
        raise OpctError(f"{args.model}: not a model directory (no config.json)")
    if args.out and Path(args.out).is_dir():  # found now, not after minutes of sampling (the profile was lost)
        raise OpctError(f"{args.out}: is a directory, expected a file")
    if args.out:  # a file of the model itself (config.json, its weights) would be replaced by the profile
        import os

        from opct.files import check_writable

        model = Path(os.path.realpath(args.model))
        if Path(os.path.realpath(args.out)).parent == model and Path(args.out).exists():
            raise OpctError(f"{args.out}: --out names a file of the model directory {args.model}, which it would "
                            "replace; choose another --out")
        _refuse_other_file(Path(args.out))
        check_writable(args.out)  # a file where its directory belongs, no permission: before the sampling too
    profile = measure_profile(args.model, n=args.n, seed=args.seed)
    print_profile(profile)
    if args.out:
        from opct.files import write_json_atomic

        write_json_atomic(args.out, profile, sort_keys=True)
    return 0


def _refuse_other_file(out: Path) -> None:
    """An existing --out is replaced only when it is a profile written before: any other file was (a model's
    config.json elsewhere, an experiment.json, a metrics.json: 2026-12-07), leaving what it belonged to unreadable."""
    import json

    from opct.organism.profile import REQUIRED

    if not out.is_file() or out.stat().st_size == 0:
        return
    try:
        data = json.loads(out.read_text(encoding="utf-8"))
        ok = isinstance(data, dict) and REQUIRED[0] in data and f"n_{REQUIRED[0]}" in data
    except (ValueError, OSError):
        ok = False
    if not ok:
        raise OpctError(f"{out}: --out names a file that is not an organism profile, which it would replace; choose "
                        f"another --out, or remove the file first")
