"""The OPCT objective (DESIGN §4) as pure functions over aligned log-probs.

Setting: the student samples y ~ pi_theta(. | student prompt); the frozen teacher (the starting model) scores the
same tokens under the teacher prompt. Both models' log-probs (`log_probs(logits)`, computed once per forward pass)
are aligned on the response: `[:, t]` predicts y_t (see `opct.policy.pack`). Per response token

    delta_t = log pi_theta(y_t | y_<t, student prompt) - log pi_T(y_t | y_<t, teacher prompt)

and the quantity minimised is the per-position reverse KL at the sampled prefixes,

    KL_t = sum_v pi_theta(v | y_<t, student) * (log pi_theta(v | ...) - log pi_T(v | ..., teacher)),

summed over response tokens (mask: up to and including the first EOS) and divided by the number of response tokens
in the whole optimizer step. The prefixes y_<t are treated as data (the gradient does not flow through which
prefixes were sampled), as in on-policy distillation.

Estimators of its gradient (`ESTIMATORS`):
  full     exact KL_t over the vocabulary, differentiated directly (its exact gradient, see `_kl`). The DEFAULT:
           no sampling noise in the token dimension, unbiased, and nearly free — both forward passes produce the
           full-vocabulary log-probs anyway; the KL is one more elementwise pass over them.
  topk     KL over the student's top-k tokens plus one tail bucket holding the remaining mass of each model,
           differentiated directly. It needs the teacher's log-probs only at the student's k token ids (a served
           teacher that returns only its *own* top-k cannot give them); with both models local, as here, it saves
           nothing over `full` and is biased low (a KL between coarsened distributions). opct's own choice: the
           paper's top-k option differs (a scalar advantage sum_{student top-k} p_s (log p_s - log p_T), no tail,
           -100 for a token outside the teacher's own top-k, inside its importance-sampling loss; its expected
           gradient per token is zero, as the advantage does not depend on the sampled token).
  sampled  REINFORCE: stop_grad(delta_t) * grad log pi_theta(y_t), optionally times a stop-grad importance weight
           pi_theta(y_t) / q(y_t) against the sampler q (useful when sampling at temperature != 1). Since
           E_{y_t ~ pi_theta}[delta_t * grad log pi_theta(y_t)] = grad KL_t, it agrees with `full` in expectation.
           Back-propagating delta_t itself (k1) or k3 directly would give the wrong gradient; this never does.
  paper    the OPCT paper's objective (its code's `importance_sampling` loss): per token the advantage
           A_t = -(log q(y_t) - log pi_T(y_t)), with q the sampler's log-prob of the token, and the surrogate
           -exp(log pi_theta(y_t) - log q(y_t)) * A_t, SUMMED over all response tokens of the step (no division by
           their count: `SUM_LOSS`), no clipping. (The paper's code also clips no gradient: configs/paper.yaml's
           `opct_paper` arm sets `max_grad_norm: 0`; opct's default clip at norm 1 would rescale every step of
           this summed loss, whose norm runs to the hundreds.) On-policy at temperature 1 (q = pi_theta) its gradient is
           `sampled`'s; it differs in using the sampler's log-prob in the advantage and in the token-sum scale.

Every estimator returns `(surrogate_B_T, value_B_T)`: back-propagate the masked sum of `surrogate`; report `value`
(KL_t for full/topk, delta_t — the unbiased single-sample estimate of KL_t — for sampled).

The per-token log-ratio clip (`clip_tau`, a defence option studied in arXiv 2610.07654, None = off): the sampled
token's log-ratio delta_t is clipped to [-tau, tau] as PPO clips its ratio — the clipped quantity's derivative is
zero outside the band — so a token with |delta_t| > tau contributes *no gradient* at all, under every estimator: its
surrogate is multiplied by the stop-grad gate g_t = 1[|delta_t| <= tau] (`log_ratio_gate`). Inside the band the
estimator is unchanged. The gate is computed from the two models' log-probs of the sampled token (not from the
sampler's), after both forward passes, so it acts on the loss, never on sampling. `value` is not gated: the reported
loss stays the true KL estimate, and `clipped` (the gated-off share of tokens) is logged beside it. What it defends
against: a teacher that disagrees with the student violently on a few tokens (a backdoored teacher on triggered
prompts puts near-zero mass on the student's refusal) cannot pull on those tokens; a teacher that disagrees mildly
still can, so a backdoor can still seep in through the tokens whose log-ratio lies inside the band.
"""

from __future__ import annotations

from typing import Sequence

import torch


def response_mask(tokens_B_T: torch.Tensor, lengths_B: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """1.0 on response tokens up to and including the first EOS, within each row's length; 0.0 elsewhere.

    The padding value is never read: pad may equal EOS, and right padding is excluded by `lengths_B`.
    """
    T = tokens_B_T.shape[1]
    valid_B_T = torch.arange(T, device=tokens_B_T.device)[None, :] < lengths_B[:, None]
    eos_B_T = torch.isin(tokens_B_T, torch.tensor(list(eos_ids), device=tokens_B_T.device)) & valid_B_T
    eos_before_B_T = (eos_B_T.long().cumsum(-1) - eos_B_T.long()) > 0  # an EOS strictly earlier in the row
    return (valid_B_T & ~eos_before_B_T).float()


def log_probs(logits_B_T_V: torch.Tensor) -> torch.Tensor:
    """log softmax over the vocabulary, in float32: (B, T, V). Everything below takes these, computed once."""
    return torch.log_softmax(logits_B_T_V.float(), -1)


def token_logprobs(logp_B_T_V: torch.Tensor, tokens_B_T: torch.Tensor) -> torch.Tensor:
    """The log-prob of each given token: (B, T)."""
    return logp_B_T_V.gather(-1, tokens_B_T[..., None])[..., 0]


def entropy(logp_B_T_V: torch.Tensor) -> torch.Tensor:
    """Entropy of each position's distribution: (B, T)."""
    return -(logp_B_T_V.exp() * logp_B_T_V).sum(-1)


def _kl(s_logp: torch.Tensor, t_logp: torch.Tensor) -> torch.Tensor:
    """sum_v p_v * stop_grad(log p_v - log q_v): the value of KL(p || q), and exactly its gradient.

    grad KL = sum_v grad(p_v) * (log p_v - log q_v) + sum_v p_v * grad(log p_v); the second sum is grad(sum_v p_v) = 0,
    so it is left out — in floating point it is only rounding noise (sum_v p_v is not exactly 1), which would make
    the gradient at p == q tiny instead of exactly zero.
    """
    return (s_logp.exp() * (s_logp - t_logp).detach()).sum(-1)


def reverse_kl_full(student_logp_B_T_V: torch.Tensor, teacher_logp_B_T_V: torch.Tensor) -> torch.Tensor:
    """KL(student || teacher) over the whole vocabulary at each position: (B, T). The teacher is detached."""
    return _kl(student_logp_B_T_V, teacher_logp_B_T_V.detach())


def forward_kl_full(teacher_logp_B_T_V: torch.Tensor, student_logp_B_T_V: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) over the whole vocabulary at each position: (B, T) — distillation onto the teacher's
    soft labels (the audit paper's BCT). The teacher is detached; the gradient is that of the cross-entropy
    -sum_v p_T(v) log p_S(v), whose value differs from this KL only by the teacher's (constant) entropy."""
    t_logp = teacher_logp_B_T_V.detach()
    return (t_logp.exp() * (t_logp - student_logp_B_T_V)).sum(-1)


def _with_tail(logp_B_T_K: torch.Tensor) -> torch.Tensor:
    """Append log(1 - sum(p)) as one more category, so the k+1 entries form a distribution.

    The captured mass is clamped just below 1, so a model that puts all its mass on the top-k gets a tiny (not
    -inf) tail; otherwise a zero tail on one side and a positive tail on the other would make the KL infinite.
    """
    log_mass = torch.logsumexp(logp_B_T_K, -1, keepdim=True).clamp(max=-1e-7)
    return torch.cat([logp_B_T_K, torch.log(-torch.expm1(log_mass))], -1)


def reverse_kl_topk(student_logp_B_T_V: torch.Tensor, teacher_logp_B_T_V: torch.Tensor, k: int) -> torch.Tensor:
    """KL(student || teacher) on the student's top-k tokens plus a tail bucket: (B, T).

    With k >= V this is `reverse_kl_full` (no bucket is needed, and none is added).
    """
    if k >= student_logp_B_T_V.shape[-1]:
        return reverse_kl_full(student_logp_B_T_V, teacher_logp_B_T_V)
    idx_B_T_K = student_logp_B_T_V.detach().topk(k, -1).indices
    s_logp = _with_tail(student_logp_B_T_V.gather(-1, idx_B_T_K))
    t_logp = _with_tail(teacher_logp_B_T_V.detach().gather(-1, idx_B_T_K))
    return _kl(s_logp, t_logp)


def reinforce_surrogate(student_logp_B_T: torch.Tensor, teacher_logp_B_T: torch.Tensor,
                        sampler_logp_B_T: torch.Tensor | None = None,
                        importance_clip: float | None = None) -> torch.Tensor:
    """stop_grad(w_t * delta_t) * log pi_theta(y_t): its gradient is w_t * delta_t * grad log pi_theta(y_t). (B, T).

    `w_t` = pi_theta(y_t) / q(y_t) with q the sampler (`sampler_logp_B_T`), clipped above at `importance_clip`;
    w_t = 1 when no sampler log-probs are given.
    """
    delta_B_T = (student_logp_B_T - teacher_logp_B_T).detach()
    weight_B_T = torch.ones_like(delta_B_T)
    if sampler_logp_B_T is not None:
        weight_B_T = torch.exp((student_logp_B_T.detach() - sampler_logp_B_T).clamp(-20.0, 20.0))
        if importance_clip:
            weight_B_T = weight_B_T.clamp(max=importance_clip)
    return weight_B_T * delta_B_T * student_logp_B_T


def log_ratio_gate(student_logp_B_T_V: torch.Tensor, teacher_logp_B_T_V: torch.Tensor, tokens_B_T: torch.Tensor,
                   tau: float | None) -> torch.Tensor:
    """g_t = 1[|delta_t| <= tau], delta_t = log pi_theta(y_t) - log pi_T(y_t) at the sampled token: (B, T), no graph.
    All ones when `tau` is None (no clip)."""
    if tau is None:
        return torch.ones(tokens_B_T.shape, device=tokens_B_T.device)
    with torch.no_grad():
        delta_B_T = token_logprobs(student_logp_B_T_V, tokens_B_T) - token_logprobs(teacher_logp_B_T_V, tokens_B_T)
        return (delta_B_T.abs() <= tau).float()


def _gated(fn):
    """An estimator with the per-token log-ratio clip `clip_tau` (see the module docstring)."""
    def estimator(student_logp_B_T_V, teacher_logp_B_T_V, tokens_B_T, *, clip_tau=None, **kw):
        surrogate_B_T, value_B_T = fn(student_logp_B_T_V, teacher_logp_B_T_V, tokens_B_T, **kw)
        if clip_tau is None:
            return surrogate_B_T, value_B_T
        return surrogate_B_T * log_ratio_gate(student_logp_B_T_V, teacher_logp_B_T_V, tokens_B_T, clip_tau), value_B_T
    estimator.__name__ = estimator.__qualname__ = fn.__name__
    estimator.__doc__ = fn.__doc__
    return estimator


@_gated
def _full(student_logp_B_T_V, teacher_logp_B_T_V, tokens_B_T, **_):
    kl = reverse_kl_full(student_logp_B_T_V, teacher_logp_B_T_V)
    return kl, kl


@_gated
def _topk(student_logp_B_T_V, teacher_logp_B_T_V, tokens_B_T, *, topk=20, **_):
    kl = reverse_kl_topk(student_logp_B_T_V, teacher_logp_B_T_V, topk)
    return kl, kl


@_gated
def _sampled(student_logp_B_T_V, teacher_logp_B_T_V, tokens_B_T, *, sampler_logp_B_T=None, importance_clip=None,
             **_):
    s_logp = token_logprobs(student_logp_B_T_V, tokens_B_T)
    t_logp = token_logprobs(teacher_logp_B_T_V.detach(), tokens_B_T)
    return reinforce_surrogate(s_logp, t_logp, sampler_logp_B_T, importance_clip), (s_logp - t_logp).detach()


def paper_surrogate(student_logp_B_T: torch.Tensor, teacher_logp_B_T: torch.Tensor,
                    sampler_logp_B_T: torch.Tensor) -> torch.Tensor:
    """-exp(log pi_theta - log q) * A_t with A_t = -(log q - log pi_T) held fixed: (B, T). Its gradient is
    ratio_t * (log q(y_t) - log pi_T(y_t)) * grad log pi_theta(y_t)."""
    advantage_B_T = -(sampler_logp_B_T - teacher_logp_B_T).detach()
    ratio_B_T = torch.exp((student_logp_B_T - sampler_logp_B_T.detach()).clamp(-20.0, 20.0))
    return -ratio_B_T * advantage_B_T


@_gated
def _paper(student_logp_B_T_V, teacher_logp_B_T_V, tokens_B_T, *, sampler_logp_B_T=None, **_):
    s_logp = token_logprobs(student_logp_B_T_V, tokens_B_T)
    t_logp = token_logprobs(teacher_logp_B_T_V.detach(), tokens_B_T)
    q_logp = s_logp.detach() if sampler_logp_B_T is None else sampler_logp_B_T
    return paper_surrogate(s_logp, t_logp, q_logp), (s_logp - t_logp).detach()


# name -> fn(student_logp_B_T_V, teacher_logp_B_T_V, tokens_B_T, *, topk, sampler_logp_B_T, importance_clip, clip_tau)
#         -> (surrogate_B_T, value_B_T); the inputs are log-probs (`log_probs(logits)`), aligned on the response.
ESTIMATORS = {"full": _full, "topk": _topk, "sampled": _sampled, "paper": _paper}
# Estimators whose loss is summed over the step's response tokens instead of averaged over them.
SUM_LOSS = ("paper",)
# Estimators that need the sampler's log-probs of the tokens.
NEEDS_SAMPLER = ("paper",)
DEFAULT_ESTIMATOR = "full"
