"""Robustness studies (issue 20): does a trained behaviour last, and what does it cost?

`opct run configs/robustness.yaml` (a file with `kind: robustness`) runs every study the file names, once per seed,
and reports them together (`opct.robustness.runner`). A study is a module here exposing

    Config                                   a dataclass of its settings, validated with opct.config (types and
                                             ranges at load time; errors name the field) like every other config;
                                             a field `model` (if it has one) is set by the runner to the resolved
                                             model directory of the file's `model`;
    run(cfg, seed: int, out: Path, log) -> list[dict]
                                             ONE seed: writes what it needs under `out` (resumable: finished
                                             pieces are skipped) and returns long-format rows
                                             {"study", "method", "axis", "condition", "x": float | None, "metric",
                                              "value": float | None (None = undefined, reported as such),
                                              "higher_is_better": bool}
    QUICK (optional)                         field overrides for `--quick` (mappings are merged into the file's)

The runner aggregates rows over seeds by (study, method, axis, condition, x, metric): mean, 95% t-interval, n;
tables per study (rows method x condition [x], columns metric), curves where x is numeric.

Adding a study = its module (ending in the `__main__` block the others end in), one line in STUDIES
(`opct.robustness.studies`), and a block under `studies:` in the file. Each study also runs alone:
`python -m opct.robustness.<study> CONFIG [--seeds 0 1 2] [--out DIR] [--block KEY]` (opct.robustness.standalone).
"""


def __getattr__(name):
    """`opct.robustness.STUDIES`, read from `opct.robustness.studies` when asked for (importing the studies here
    made `python -m opct.robustness.<study>` warn that the module was imported before it ran)."""
    if name == "STUDIES":
        from opct.robustness.studies import STUDIES

        return STUDIES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
