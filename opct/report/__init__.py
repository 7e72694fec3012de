"""The report of an experiment: `results.md` (tables laid out like the paper's) and a self-contained
`report.html` (the same tables, plots of every headline metric with its interval, training vs held-out groups,
training curves), built from the files of a run directory alone.

    rundir.py     reading runs/<name>/: experiment.json, complete cells (done.json), eval metrics, training curves
    aggregate.py  one number per (arm, metric) over seeds, with its 95% interval
    spec.py       what a table is (columns of metrics); each axis (opct.axes) declares its own
    tables.py     the tables of a run (a loop over the axes), rendered as Markdown or plain text
    plots.py      the figures as PNG bytes
    page.py       the HTML page
    build.py      build_report(run_dir, out_dir=None) -> (html_path, md_path); summary_text(run)
"""

__all__ = ["build_report", "summary_text", "load_run"]


def __getattr__(name):  # imported on first use, so that `opct.report.spec` is importable on its own
    if name in ("build_report", "summary_text"):
        from opct.report import build

        return getattr(build, name)
    if name == "load_run":
        from opct.report.rundir import load_run

        return load_run
    raise AttributeError(name)
