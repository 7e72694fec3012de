"""The report of an experiment: `results.md` (tables laid out like the paper's) and a self-contained
`report.html` (the same tables, plots of every headline metric with its interval, training vs held-out groups,
training curves), built from the files of a run directory alone.

    rundir.py     reading runs/<name>/: experiment.json, complete cells (done.json), eval metrics, training curves
    aggregate.py  one number per (arm, metric) over seeds, with its 95% interval
    tables.py     which metric goes in which table, and rendering a table as Markdown or plain text
    plots.py      the figures as PNG bytes
    page.py       the HTML page
    build.py      build_report(run_dir, out_dir=None) -> (html_path, md_path); summary_text(run)
"""

from opct.report.build import build_report, summary_text  # noqa: F401
from opct.report.rundir import load_run  # noqa: F401
