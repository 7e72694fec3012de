"""`opct audit`: does a consistency method amplify or suppress a misaligned behaviour?

    opct audit [CONFIG] [--quick] --out DIR [--organisms ...] [--methods ...] [--seeds 0 1 2] [--report-only]

Derives the misaligned organisms from the base organism per seed (reward hacking and its brittle variant, emergent
misalignment, spurious correlation, sycophancy with its brittle variant and on the protected base), runs the audit
paper's methods (self_confidence, diverse_decoding, multi_view, self_refinement, self_rewarding, the greedy k1
ablation, bct, act; opct's earlier variants by name) — instantiate, pseudo-label the held-out label prompts,
fine-tune — and measures misalignment, its unparsed share and capability before and after on out-of-distribution
probes. Writes DIR/splits.json, DIR/results.jsonl (resumable: finished cells are skipped), DIR/results.md,
DIR/summary.json and DIR/report.html (the verdicts on the paper's findings, heatmaps with 95% intervals, eta(s)
plots). Every flag is a field of opct.audit.run.AuditConfig; CONFIG (YAML or JSON) holds the same fields, flags
override it. --quick: one seed and small sizes.
"""

from __future__ import annotations

from opct.flags import path_arg


def register(subparsers) -> None:
    from opct.audit.run import AuditConfig
    from opct.config import add_dataclass_args

    p = subparsers.add_parser("audit", help="misalignment audit of consistency methods on model organisms",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("config", nargs="?", type=path_arg, default=None, help="YAML or JSON file of AuditConfig fields")
    add_dataclass_args(p, AuditConfig)
    p.add_argument("--report-only", action="store_true",
                   help="rebuild the report from DIR/results.jsonl only (a CONFIG field that differs from "
                        "DIR/config.json's is refused)")
    p.set_defaults(func=run)


def run(args) -> int:
    from opct.audit.report import write_report
    from opct.audit.run import QUICK, AuditConfig, check_out, run_audit
    from opct.config import build_config, load_config_file, require

    if args.report_only:  # the report reads OUT alone: a grid or size flag was ignored, exit 0 (2026-12-07)
        from dataclasses import fields

        from opct.errors import OpctError

        ignored = [f"--{f.name.replace('_', '-')}" for f in fields(AuditConfig) if f.name in vars(args) and
                   f.name != "out"]
        if ignored:
            them = "it" if len(ignored) == 1 else "them"
            raise OpctError(f"--report-only rebuilds the report from OUT/results.jsonl alone and takes only --out "
                            f"(and CONFIG): {', '.join(ignored)} would be ignored; drop {them}, or run the audit "
                            f"without --report-only")
    data = load_config_file(args.config) if args.config else None
    given = set(vars(args)) | set(data or {})
    config = build_config(AuditConfig, args, args.config, data)
    if config.quick:  # quick sizes replace the defaults, never a value the user gave
        config = build_config(AuditConfig, args, args.config, data,
                              **{k: v for k, v in QUICK.items() if k not in given})
    require(config)
    check_out(config.out)  # before the lock file is written into a model's directory
    if not args.report_only:
        from opct.files import dir_lock

        # a second `opct audit` into the same --out is refused, and so is a directory another command wrote
        with dir_lock(config.out, "audit directory", kind="audit"):
            run_audit(config, log=lambda m: print(m, flush=True))
    else:  # another command's run was told "run opct audit first" (2026-12-07)
        from opct.files import check_run_kind

        check_run_kind(config.out, "audit")
        if data:
            _check_report_config(args.config, data, config)
    paths = write_report(config.out)  # atomic writes of files rebuilt from results.jsonl: safe beside a running audit
    print(f"opct audit: results in {paths['results']}; report {paths['html']} and {paths['md']}")
    return 0


def _check_report_config(path, data: dict, config) -> None:
    """--report-only rebuilds the report of the audit OUT/config.json describes: a field of CONFIG (other than out)
    that differs from it would be ignored, so it is refused by name, as a grid or size flag beside --report-only is
    (until 2026-12-07 `opct audit CFG --report-only` with `eval_n: 5` in CFG exited 0 with the old report). Fields
    equal to OUT/config.json's are fine: the file the audit ran with rebuilds its report."""
    from dataclasses import asdict
    from pathlib import Path

    from opct.audit.run import AuditConfig, saved_config
    from opct.errors import OpctError
    from opct.resume_check import changes, defaults_of

    fields = [k for k in data if k != "out"]
    out = Path(config.out)
    saved_path = out / "config.json"
    if not fields or not (saved_path.exists() or (out / "results.jsonl").exists()):
        return  # nothing to check, or no audit there (the report says so)
    if not saved_path.exists():
        raise OpctError(f"{path}: {', '.join(fields)}: cannot be checked against the audit in {out} ({saved_path} "
                        f"is missing), and --report-only takes only --out: drop CONFIG")
    saved = saved_config(saved_path)
    now = asdict(config)
    defaults = defaults_of(AuditConfig)
    diff = changes({k: saved.get(k, defaults.get(k)) for k in fields}, {k: now[k] for k in fields})
    if diff:
        raise OpctError(f"{path}: {', '.join(diff)}: differs from the audit in {out} ({saved_path}), whose report "
                        f"--report-only rebuilds; it would be ignored: drop CONFIG (or the field), or run the audit "
                        f"without --report-only")
