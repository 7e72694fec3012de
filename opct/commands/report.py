"""`opct report RUN [--out DIR]`: write results.md and a self-contained report.html for a run directory written by
`opct run`, and print the summary table. Reads only the run's files, so it can be rerun at any time (also on a
half-finished experiment: the missing cells are listed)."""

from __future__ import annotations

from pathlib import Path

from opct.errors import OpctError
from opct.flags import path_arg

# what `opct run FILE` calls the run directory it locks, by kind (`opct.commands.run`)
KINDS = {"threats": "threats run", "robustness": "robustness study"}


def register(sub) -> None:
    p = sub.add_parser("report", help="results.md + self-contained report.html for a run directory",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("run", metavar="RUN", type=path_arg, help="run directory (runs/<name>, holding experiment.json)")
    p.add_argument("--out", type=path_arg, default=None,
                   help="where to write results.md and report.html (default: RUN)")
    p.set_defaults(func=_report)


def _report(args) -> int:
    from opct.report import build_report, load_run, summary_text

    if (Path(args.run) / "threats.json").exists():  # a cross-threat run (`opct run FILE` with kind: threats)
        from opct.threats.matrix import write_matrix
        from opct.threats.report import build as build_threats

        return _study_report(args, "threats", write_matrix, build_threats)
    if (Path(args.run) / "study.json").exists():  # a robustness run (`opct run FILE` with kind: robustness)
        from opct.robustness.report import build
        from opct.robustness.runner import write_aggregate

        return _study_report(args, "robustness", write_aggregate, build)

    with _writing(args, "experiment"):
        run = load_run(args.run)
        html, md = build_report(run, args.out)
    print(summary_text(run))
    print(f"opct report: {md} and {html}")
    return 0


def _writing(args, what: str):
    """The lock a report is written under (`opct.report.rundir.writing_into`): the run directory's, the one `opct
    run` holds (`what`, as it names the run), or with --out that folder's, the run only read."""
    from opct.report.rundir import writing_into

    if args.out:
        _check_out(Path(args.run), Path(args.out))
        return writing_into(Path(args.out), "report folder", "choose another --out", new=True)
    return writing_into(Path(args.run), what, "write the report elsewhere with --out DIR")


def _check_out(run, out) -> None:
    """--out must not be another command's run directory: its own results.md and report.html would be replaced by
    this run's (`opct report runs/a --out runs/b` overwrote experiment b's report with a's)."""
    import os

    from opct.files import RUN_MARKERS

    if os.path.realpath(out) == os.path.realpath(run):
        return
    for name, (_, what) in RUN_MARKERS.items():
        if (out / name).exists():
            raise OpctError(f"{out}: holds {what} ({name}), whose report files --out would replace with those of "
                            f"{run}; choose another --out")
    from opct.modeldir import refuse_model_dir

    refuse_model_dir(out, "a report")  # a trained adapter's final/: `opct train` and `opct eval` refuse it too


def _study_report(args, kind: str, aggregate, build) -> int:
    """A robustness or threats run: aggregate its rows again and rebuild the report, in its own directory or with
    --out in DIR, the run only read (so a running run reports, its unfinished cells listed); see `_writing`."""
    run = Path(args.run)
    with _writing(args, KINDS[kind]):
        aggregate(run, Path(args.out) if args.out else None)
        html, md = build(run, args.out)
    print(f"opct report: {md} and {html}")
    return 0
