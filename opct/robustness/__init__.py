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

Adding a study = its module, one line in STUDIES, and a block under `studies:` in the file.
Each study also runs alone: `python -m opct.robustness.<study> CONFIG [--seeds 0 1 2] [--out DIR] [--block KEY]`
(opct.robustness.standalone; reasons and backdoor).
"""

from opct.robustness import backdoor, reasons, replay, washout

STUDIES = {
    "replay": replay,  # on-model benign replay (replay_frac x schedule): capability and the trained behaviour
    "washout": washout,  # follow-up benign SFT at doses: the wash fraction per method and axis
    "reasons": reasons,  # training on the reason: reason / filler / masked targets, transfer to held-out families
    "backdoor": backdoor,  # poisoned pairs, a backdoored teacher, estimators, the log-ratio clip, admission
}
