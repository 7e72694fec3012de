"""Training methods, one file each; `METHODS` maps a name to its step function.

A step function is `step(run: StepContext, micro_batches: list[list[Pair]]) -> dict[str, float]`: it does the forward
and backward passes of one optimizer step over the given micro-batches of pairs (one list per micro-batch, this
process's share) and returns the step's statistics, already reduced over processes, including `loss` and `tokens`.
The shared loop (`opct.train.loop`) owns everything else: models, the teacher, data order, clipping, the optimizer,
NaN handling, checkpoints and metrics.

A method that needs work before its first step has a `PREPARE` entry, `prepare(run: StepContext) -> None`, which the
loop calls once per run (fresh or resumed; `run.step` says where it resumes) and which keeps its results in
`run.cache`: SFT's and BCT's offline targets, the token alignments of ACT / MLPCT / AttCT (so a pair that cannot be
aligned stops the run before training starts), AttCT's switch to eager attention.

  opct    on-policy consistency training: reverse KL on the student's own samples       (opct.py)
  offpolicy  the same loss on fixed trajectories sampled once from the starting model   (offpolicy.py)
  sft     cross-entropy on offline teacher answers, or on targets from a file          (sft.py)
  bct     sft with the starting model's own answers to the clean prompts as targets    (sft.py)
  act     squared L2 between residual streams on the prompts' common token suffix       (act.py)
  mlpct   cosine distance between MLP hidden states on the clean-content span          (mlpct.py)
  attct   Jensen-Shannon divergence between attention patterns on that span           (attct.py)
  bct_soft   the audit paper's BCT: KL to the clean side's softmax over a fixed response  (fixed_response.py)
  act_fixed  the audit paper's ACT: residual L2 over the fixed response's positions       (fixed_response.py)
  bct_soft_live / act_fixed_live   the same with the paper's live (moving) clean-side target (fixed_response.py)
"""

from opct.methods import act, attct, fixed_response, mlpct, offpolicy, sft
from opct.methods.opct import opct_step
from opct.train.config import ROLLOUT_METHODS

METHODS = {
    "opct": opct_step,
    "offpolicy": offpolicy.offpolicy_step,
    "sft": sft.sft_step,
    "bct": sft.bct_step,
    "act": act.act_step,
    "mlpct": mlpct.mlpct_step,
    "attct": attct.attct_step,
    "bct_soft": fixed_response.bct_soft_step,
    "act_fixed": fixed_response.act_fixed_step,
    "bct_soft_live": fixed_response.bct_soft_step,
    "act_fixed_live": fixed_response.act_fixed_step,
}

# Methods whose step draws the student's own rollouts (through `run.sampler` when `--sampler vllm` gives one).
ROLLOUTS = ROLLOUT_METHODS

PREPARE = {
    "offpolicy": offpolicy.prepare,
    "sft": sft.prepare,
    "bct": sft.prepare_bct,
    "act": act.prepare,
    "mlpct": mlpct.prepare,
    "attct": attct.prepare,
    "bct_soft": fixed_response.prepare_bct,
    "act_fixed": fixed_response.prepare_act,
    "bct_soft_live": fixed_response.prepare_bct_live,
    "act_fixed_live": fixed_response.prepare_act_live,
}
