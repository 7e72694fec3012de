"""The cross-threat matrix (issue 19, item 5): train on one threat, measure every threat.

`opct run configs/threats.yaml [--quick]` (a file with `kind: threats`) trains each method on one threat at a time
and evaluates the trained model on every axis in `opct.axes.AXES` (capability included), against a sample-matched
benign-SFT control. The MLPCT / AttCT paper found that an SFT of the same size on benign data alone moved several
metrics, so a cross-threat cell is only read against that control: every cell is

    delta = metric(method trained on threat T, seed s) - metric(control, seed s)

averaged over seeds with a 95% Student-t interval (`opct.report.aggregate.t_interval`).

The control, `benign_sft`: SFT (the `sft` method with no target file: the frozen starting model's own greedy answers
to each prompt, cross-entropy on them) on benign prompts of the world that no evaluation asks
(`opct.pairs.make.replay_pairs`: open fact questions, training-split arithmetic, benign safety questions).
"Sample-matched" means: the same number of optimizer steps (`train.max_steps`) and the same rows per step
(`train.batch_size x train.grad_accum` prompts) as every method, with the same LoRA, lr and schedule; the methods'
per-method overrides may not change those (`MATCHED_FIELDS`). It does not match what a row costs: an OPCT row
samples `n_samples` responses, a BCT row has one target. The benign prompts do not depend on the threat, so there
is ONE control per seed, reused by every trained threat of that seed (training it once per threat would train the
same model again).

Cells that get no signal by construction are not trained: an axis says which methods its pairs give no gradient
(`Axis.no_signal_methods`, or a module-level `NO_SIGNAL_METHODS` in the axis's module; prefill: ACT, MLPCT,
AttCT, whose compared positions are identical on both sides); the table marks them.

Layout (every piece resumable; `done.json` written last marks a finished cell):

    OUT/NAME/threats.json                          the resolved settings; a rerun with other settings is refused
    OUT/NAME/seed<S>/base/                         the starting model's evaluation (eval/, done.json)
    OUT/NAME/seed<S>/control/                      the benign-SFT control (pairs.jsonl, train/, eval/, done.json)
    OUT/NAME/seed<S>/<threat>/pairs.jsonl          the threat's training pairs (shared by its methods)
    OUT/NAME/seed<S>/<threat>/<method>/            train/, eval/, done.json
    OUT/NAME/seed<S>/rows.json                     the seed's per-cell metrics and deltas (rewritten on aggregation)
    OUT/NAME/cross_threat.json                     rows (threat x method), columns (metrics), cells
    OUT/NAME/results.md, report.html               the table and the heatmap (opct.threats.report)
"""

from opct.threats.config import ThreatsConfig, load_threats  # noqa: F401
