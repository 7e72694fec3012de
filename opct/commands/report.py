"""`opct report RUN [--out DIR]`: write results.md and a self-contained report.html for a run directory written by
`opct run`, and print the summary table. Reads only the run's files, so it can be rerun at any time (also on a
half-finished experiment: the missing cells are listed)."""

from __future__ import annotations

from contextlib import contextmanager
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

    if args.out:
        _check_out(Path(args.run), Path(args.out))
        where = _writing(Path(args.out), "report folder", "choose another --out", new=True)
    else:
        where = _writing(Path(args.run), "experiment", "write the report elsewhere with --out DIR")
    with where:
        run = load_run(args.run)
        html, md = build_report(run, args.out)
    print(summary_text(run))
    print(f"opct report: {md} and {html}")
    return 0


@contextmanager
def _writing(out: Path, what: str, instead: str = "", new: bool = False):
    """Hold the lock of the folder a report is written into (`opct.files.dir_lock`; the run directory's is the one
    `opct run` holds, `what` as it names it): two reports, or a report and the run it reads, interleaved their
    results.md and report.html, and could leave a stale report over the run's own (2026-12). A folder that cannot be
    written (a finished run kept read-only) is refused first, saying what to do `instead`; with `--out` elsewhere the
    run is only read, so a read-only run directory still reports. A folder that is not there (unless it is `new`: an
    --out), or a file in its place, is left to the reader and writer, which name it."""
    from opct.errors import blocking_file, os_problem
    from opct.files import check_writable, dir_lock

    if not (out.is_dir() or (new and blocking_file(str(out)) is None)):
        yield
        return
    try:
        check_writable(out / "results.md")
    except OSError as e:
        raise OpctError(f"{out}: cannot write the report: {os_problem(e)}" + (f"; {instead}" if instead else "")) \
            from None
    with dir_lock(out, what, instead=instead):
        yield


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
    """A robustness or threats run: aggregate its rows again and rebuild the report, in its own directory under the
    lock `opct run FILE` holds (`_writing`), or with --out in DIR under DIR's lock, the run only read (so a running
    run reports, its unfinished cells listed)."""
    run = Path(args.run)
    if args.out:
        _check_out(run, Path(args.out))
        where = _writing(Path(args.out), "report folder", "choose another --out", new=True)
    else:
        where = _writing(run, KINDS[kind], "write the report elsewhere with --out DIR")
    with where:
        aggregate(run, Path(args.out) if args.out else None)
        html, md = build(run, args.out)
    print(f"opct report: {md} and {html}")
    return 0
