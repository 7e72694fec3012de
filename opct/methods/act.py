"""ACT: activation consistency training (DESIGN §4).

What it really is: no answers at all. The student reads the perturbed (student) prompt; the frozen starting model
reads the clean (teacher) prompt. On the prompt tokens the two share at their end — the longest common token
suffix, which always includes the chat template's generation prompt, and the clean request too when the wrapper or
bias sits before it — the student's residual stream after every decoder layer (or the `--layers` subset) is pulled
towards the teacher's, which is held fixed (stop-gradient). Loss = `act_weight` x squared L2 distance, summed over
the hidden dimensions and averaged over the aligned tokens and layers of the optimizer step. Because the squared
distance grows with the hidden size and activation norms, the default weight is small (1e-4).

The point is that the last prompt positions are where the model "decides" how to answer: if its internal state
there is the same with and without the perturbation, so is the answer that follows.
"""

from __future__ import annotations

import torch

from opct.methods.internal import gather, internal_step, prepare_suffix
from opct.pairs.schema import Pair
from opct.train.context import StepContext


def squared_l2(student_N_D: torch.Tensor, teacher_N_D: torch.Tensor) -> torch.Tensor:
    """||student - stop_grad(teacher)||^2 per row: (N,). Exactly 0, with a 0 gradient, where the rows are equal."""
    return (student_N_D.float() - teacher_N_D.detach().float()).pow(2).sum(-1)


def _distance(s_B_W_D, t_B_W_D, places):
    d = squared_l2(gather(s_B_W_D, places, 1), gather(t_B_W_D, places, 2)).sum()
    return d, d


def act_step(run: StepContext, micro_batches: list[list[Pair]]) -> dict[str, float]:
    return internal_step(run, micro_batches, "residual", _distance, units=lambda span: span.length,
                         weight=run.config.act_weight)


prepare = prepare_suffix
