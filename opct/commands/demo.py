"""`opct demo`: the README's main job. Until the experiment runner exists it loads the embedded default organism
(shipped in the repository, so nothing is rebuilt) and prints its profile against the targets."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("demo", help="the main job on the embedded default organism (what `make demo` runs)",
                       description="Load the shipped default organism (building it only if its configuration "
                                   "changed) and print its behaviour profile against the targets.")
    p.add_argument("--remeasure", action="store_true",
                   help="sample the profile again from the saved model instead of reading profile.json")
    p.add_argument("--n", type=int, default=200, help="with --remeasure: responses per behaviour")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_demo)


def _demo(args) -> int:
    from opct.organism.build import build_organism
    from opct.organism.profile import check_targets, measure_profile, print_profile

    d = build_organism("default")
    meta = json.loads((d / "organism.json").read_text())
    print(f"default organism: {d}")
    print(f"  {meta['n_params']:,} parameters, built in {meta.get('build_seconds', '?')} s "
          f"(config hash {meta['config_hash']})")
    if args.remeasure:
        profile = measure_profile(d, n=args.n, seed=args.seed)
    else:
        profile = json.loads((d / "profile.json").read_text())
    print_profile(profile)
    ok = check_targets(profile)
    print(f"{sum(ok.values())}/{len(ok)} profile targets met")
    return 0
