"""`opct demo`: the README's main job (what `make demo` runs).

It runs the default experiment — `opct run configs/demo.yaml`, whose values are `ExperimentConfig`'s defaults — on
the embedded default organism (shipped in the repository, so nothing is rebuilt): arms base, OPCT and BCT trained
on sycophancy (suggested-answer family), jailbreak (train wrappers) and safety-awareness (train domains) pairs; every
suite evaluated, the adaptive attacker included; then report.html and results.md written and a summary table
printed. Run it again and finished arms are skipped. `--profile` prints the organism's behaviour profile instead.

`--subject smollm2` runs that subject's experiment instead (configs/smollm2.yaml: base / OPCT / BCT on
SmolLM2-135M-Instruct, fetched on first use), and `--subject smollm2 --profile` prints its shipped profile.
"""

from __future__ import annotations

import json

from opct.flags import dir_name_arg, path_arg


def register(sub) -> None:
    from opct.config import positive_arg, seed_arg

    p = sub.add_parser("demo", help="the main job on the embedded default organism (what `make demo` runs)",
                       description=__doc__.split("\n\n")[0] + " " + __doc__.split("\n\n")[1])
    p.add_argument("--out", type=path_arg, default="runs", help="root directory of experiments (default: runs)")
    p.add_argument("--name", type=dir_name_arg, default=None, help="experiment name (default: demo, or the subject's experiment's)")
    p.add_argument("--subject", default="default", help="default (the organism's demo) or a subject that ships an "
                                                       "experiment: smollm2")
    p.add_argument("--profile", action="store_true",
                   help="print the default organism's behaviour profile against its targets, and stop")
    p.add_argument("--remeasure", action="store_true",
                   help="with --profile: sample the profile again from the saved model instead of reading it")
    p.add_argument("--n", type=positive_arg, default=None,
                   help="with --profile --remeasure: responses per behaviour (default: 200)")
    p.add_argument("--seed", type=seed_arg, default=None, help="with --profile --remeasure: sampling seed (default: 0)")
    p.set_defaults(func=_demo)


def _check_profile_flags(args) -> None:
    """--remeasure, --n and --seed are the default organism's profile's; until 2026-12-07 `opct demo --seed 3` (or
    --n, or --remeasure without --profile) ran the whole demo at seed 0, and `--subject smollm2 --profile
    --remeasure` printed the shipped profile unsaid."""
    from opct.errors import OpctError

    given = [f for f in ("n", "seed") if getattr(args, f) is not None]
    if args.remeasure and args.subject != "default":
        raise OpctError(f"--remeasure: the {args.subject} subject's profile is shipped, not measured here; "
                        f"--remeasure samples the default organism's (opct demo --profile --remeasure)")
    if args.remeasure and not args.profile:
        raise OpctError("--remeasure: is for --profile (sampling the organism's profile again); the demo itself "
                        "takes no --remeasure")
    if given and not (args.profile and args.remeasure):
        raise OpctError(f"--{given[0]}: is for --profile --remeasure (the profile's sampling); the demo's "
                        f"experiment has its own seeds and item counts (configs/demo.yaml, run with opct run)")


def _demo(args) -> int:
    _check_profile_flags(args)
    if args.subject != "default":
        return _subject(args)
    if args.profile:
        return _profile(args)
    from opct.commands.run import run_and_report
    from opct.experiment import load_experiment
    from opct.experiment.config import DEMO_NOTE

    return run_and_report(load_experiment(None, out=args.out, name="demo" if args.name is None else args.name,
                                          note=DEMO_NOTE))


def _subject(args) -> int:
    from opct.errors import OpctError
    from opct.subjects import SUBJECTS

    subject = SUBJECTS.get(args.subject)
    if subject is None or subject.experiment is None:
        shipping = [n for n, s in SUBJECTS.items() if s.experiment is not None]
        raise OpctError(f"--subject {args.subject}: no such subject with an experiment (choose default or one of "
                        f"{', '.join(shipping)})")
    if args.profile:
        print(f"{subject.name}: {subject.doc}\nprofile measured by sampling at temperature 1 ({subject.profile}):")
        profile = json.loads(subject.profile.read_text())
        from opct.organism.profile import print_profile

        print_profile({k: v for k, v in profile.items() if isinstance(v, (int, float)) and k != "seconds"}, targets={})
        return 0
    from opct.commands.run import run_and_report
    from opct.experiment import load_experiment

    over = {} if args.name is None else {"name": args.name}
    return run_and_report(load_experiment(subject.experiment, out=args.out, **over))


def _profile(args) -> int:
    from opct.organism.build import build_organism
    from opct.organism.profile import check_targets, measure_profile, print_profile

    d = build_organism("default")
    meta = json.loads((d / "organism.json").read_text())
    print(f"default organism: {d}")
    print(f"  {meta['n_params']:,} parameters, built in {meta.get('build_seconds', '?')} s "
          f"(config hash {meta['config_hash']})")
    profile = measure_profile(d, n=args.n or 200, seed=args.seed or 0) if args.remeasure \
        else json.loads((d / "profile.json").read_text())
    print_profile(profile)
    ok = check_targets(profile)
    print(f"{sum(ok.values())}/{len(ok)} profile targets met")
    return 0
