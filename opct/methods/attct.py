"""AttCT: attention consistency training.

What it really is: a loss on the attention pattern over the clean content (the same span as MLPCT, see
`opct.methods.alignment`). For every decoder layer (or the `--layers` subset) and head, take the attention
probabilities with both the query and the keys inside the content span, renormalise each query's row over those
keys, and pull the student's distribution (student prompt) towards the frozen starting model's (teacher prompt) by
the Jensen-Shannon divergence. The loss is the mean over heads, content query positions and layers, times
`attct_weight`. The first content token is skipped as a query: it sees one key only, so its divergence is always 0.
How the content attends to itself should not depend on the wrapper around it.

Attention probabilities exist only under the eager attention implementation (sdpa and flash attention never form
them), so this method switches the student and the teacher to eager attention before training, and says so on
stderr. Eager attention is slower and needs O(length^2) memory per head.
"""

from __future__ import annotations

import sys

import torch

from opct.activations import use_eager_attention
from opct.methods.internal import internal_step, prepare_content
from opct.pairs.schema import Pair
from opct.train.context import StepContext

_TINY = 1e-30  # floor under probabilities before their log (keys whose probability underflowed to 0)


def restrict(probs_H_Q_K: torch.Tensor, q0: int, k0: int, n: int) -> torch.Tensor:
    """Rows q0..q0+n, columns k0..k0+n of the attention probabilities, each row renormalised: (H, n, n)."""
    block = probs_H_Q_K[:, q0:q0 + n, k0:k0 + n].float()
    return block / block.sum(-1, keepdim=True).clamp_min(_TINY)


def js_divergence(p_N_K: torch.Tensor, q_N_K: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Jensen-Shannon divergence JS(p, stop_grad(q)) per row, natural log: returns (surrogate_N, value_N).

    value = 1/2 KL(p || m) + 1/2 KL(q || m), m = (p + q) / 2. Its gradient with respect to p is
    1/2 log(p / m) (the terms from m cancel), so the surrogate sum_k p_k * stop_grad(1/2 log(p_k / m_k)) has exactly
    that gradient — and exactly 0 value and gradient where p == q, with no float rounding left over. Entries where
    p and q are both 0 (keys a causal query cannot see) contribute nothing.
    """
    q = q_N_K.detach()
    m = 0.5 * (p_N_K.detach() + q)
    log_m = m.clamp_min(_TINY).log()
    log_p, log_q = p_N_K.detach().clamp_min(_TINY).log(), q.clamp_min(_TINY).log()
    value = 0.5 * (p_N_K.detach() * (log_p - log_m) + q * (log_q - log_m)).sum(-1)
    surrogate = (p_N_K * (0.5 * (log_p - log_m))).sum(-1)
    return surrogate, value


def _distance(s_B_H_W_W, t_B_H_W_W, places):
    surrogate, value = 0.0, 0.0
    for row, s_col, t_col, n in places:
        p = restrict(s_B_H_W_W[row], s_col, s_col, n)[:, 1:]  # (H, n-1, n): queries 2.. of the span
        q = restrict(t_B_H_W_W[row], t_col, t_col, n)[:, 1:]
        sur_H_Q, val_H_Q = js_divergence(p, q)
        surrogate = surrogate + sur_H_Q.mean(0).sum()  # mean over heads, sum over queries
        value = value + val_H_Q.mean(0).sum()
    return surrogate, value


def attct_step(run: StepContext, micro_batches: list[list[Pair]]) -> dict[str, float]:
    return internal_step(run, micro_batches, "attention", _distance, units=lambda span: span.length - 1,
                         weight=run.config.attct_weight)


def prepare(run: StepContext) -> None:
    prepare_content(run, min_length=2)
    use_eager_attention(run.model)
    with run.teacher() as teacher:  # the same model under LoRA; the frozen copy under full fine-tuning
        use_eager_attention(teacher)
    if run.accelerator.is_main_process:
        print("opct train: attct switched the model's attention implementation to eager (it needs the attention "
              "probabilities)", file=sys.stderr)
