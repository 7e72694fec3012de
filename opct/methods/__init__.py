"""Training methods, one file each; `METHODS` maps a name to its step function.

A step function is `step(run: StepContext, micro_batches: list[list[Pair]]) -> dict[str, float]`: it does the forward
and backward passes of one optimizer step over the given micro-batches of pairs (one list per micro-batch, this
process's share) and returns the step's statistics, already reduced over processes, including `loss` and `tokens`.
The shared loop (`opct.train.loop`) owns everything else: models, the teacher, data order, clipping, the optimizer,
NaN handling, checkpoints and metrics. A method that needs offline work (SFT's teacher answers) can do it on its
first call and keep it in `run.cache`.
"""

from opct.methods.opct import opct_step

METHODS = {
    "opct": opct_step,
}
