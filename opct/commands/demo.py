"""`opct demo`: the README's main job (what `make demo` runs).

It runs the default experiment — `opct run configs/demo.yaml`, whose values are `ExperimentConfig`'s defaults — on
the embedded default organism (shipped in the repository, so nothing is rebuilt): arms base, OPCT and BCT trained
on sycophancy (suggested-answer family), jailbreak (train wrappers) and safety-awareness (train domains) pairs; every
suite evaluated, the adaptive attacker included; then report.html and results.md written and a summary table
printed. Run it again and finished arms are skipped. `--profile` prints the organism's behaviour profile instead.
"""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("demo", help="the main job on the embedded default organism (what `make demo` runs)",
                       description=__doc__.split("\n\n")[0] + " " + __doc__.split("\n\n")[1])
    p.add_argument("--out", default="runs", help="root directory of experiments (default: runs)")
    p.add_argument("--name", default="demo", help="experiment name (default: demo)")
    p.add_argument("--profile", action="store_true",
                   help="print the default organism's behaviour profile against its targets, and stop")
    p.add_argument("--remeasure", action="store_true",
                   help="with --profile: sample the profile again from the saved model instead of reading it")
    p.add_argument("--n", type=int, default=200, help="with --profile --remeasure: responses per behaviour")
    p.add_argument("--seed", type=int, default=0, help="with --profile --remeasure: sampling seed")
    p.set_defaults(func=_demo)


def _demo(args) -> int:
    if args.profile:
        return _profile(args)
    from opct.commands.run import run_and_report
    from opct.experiment import load_experiment

    return run_and_report(load_experiment(None, out=args.out, name=args.name))


def _profile(args) -> int:
    from opct.organism.build import build_organism
    from opct.organism.profile import check_targets, measure_profile, print_profile

    d = build_organism("default")
    meta = json.loads((d / "organism.json").read_text())
    print(f"default organism: {d}")
    print(f"  {meta['n_params']:,} parameters, built in {meta.get('build_seconds', '?')} s "
          f"(config hash {meta['config_hash']})")
    profile = measure_profile(d, n=args.n, seed=args.seed) if args.remeasure \
        else json.loads((d / "profile.json").read_text())
    print_profile(profile)
    ok = check_targets(profile)
    print(f"{sum(ok.values())}/{len(ok)} profile targets met")
    return 0
