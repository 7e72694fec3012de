"""MLPCT: MLP consistency training.

What it really is: like ACT, a loss on prompt activations only, but at a different site and over a different
stretch of tokens. The site is each decoder layer's MLP hidden state — the input of its down projection, i.e. after
the non-linearity (and the gate, in gated MLPs). The tokens are the clean content: the teacher's request (for a
compression pair, the student's bare prompt) located as a contiguous run of token ids inside both prompts
(`opct.methods.alignment`, which explains how tokenization at the content's edges is handled). At every content
token and chosen layer the student's hidden state on the student prompt is pulled towards the frozen starting
model's on the teacher prompt by the cosine distance 1 - cos(student, stop_grad(teacher)); the loss is its mean
over the content tokens and layers of the optimizer step, times `mlpct_weight`.

So the wrapper around the content may stay visible to the model, but it should not change how the model reads the
content itself. A pair whose content cannot be found inside the other prompt stops the run before the first step
with an error naming the pair.
"""

from __future__ import annotations

import torch

from opct.methods.internal import gather, internal_step, prepare_content
from opct.pairs.schema import Pair
from opct.train.context import StepContext


def cosine_distance(student_N_F: torch.Tensor, teacher_N_F: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """1 - cos(student, stop_grad(teacher)) per row: (N,).

    Computed as ||u - v||^2 / 2 with u, v the unit vectors (equal to 1 - cos), so that equal rows give exactly 0
    and exactly a 0 gradient (1 - u.v leaves float rounding of order 1e-7 in both).
    """
    s, t = student_N_F.float(), teacher_N_F.detach().float()
    u = s / s.norm(dim=-1, keepdim=True).clamp_min(eps)
    v = t / t.norm(dim=-1, keepdim=True).clamp_min(eps)
    return 0.5 * (u - v).pow(2).sum(-1)


def _distance(s_B_W_F, t_B_W_F, places):
    d = cosine_distance(gather(s_B_W_F, places, 1), gather(t_B_W_F, places, 2)).sum()
    return d, d


def mlpct_step(run: StepContext, micro_batches: list[list[Pair]]) -> dict[str, float]:
    return internal_step(run, micro_batches, "mlp", _distance, units=lambda span: span.length,
                         weight=run.config.mlpct_weight)


def prepare(run: StepContext) -> None:
    prepare_content(run, min_length=1)
