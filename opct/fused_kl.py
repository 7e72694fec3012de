"""The `full` reverse KL without the full-vocabulary tensors: the output layer and the KL fused, chunk by chunk.

`opct.losses.reverse_kl_full` needs the student's and the teacher's log-probs over the whole vocabulary at every
response position: two float32 (N, V) tensors (and autograd keeps more of that size for the backward pass). At a real
vocabulary that is what runs out of memory first (V = 152k, 1024 positions, 8 rows: about 5 GB per tensor). Here the
model's last hidden states (N, d) come in instead of logits, and for `chunk` positions at a time the output layer
(W: V x d) makes the two logits, their log-softmaxes give the KL, and only the (N,) result is kept. The backward pass
computes the same chunks again and forms the gradient from them:

    KL_t = sum_v p_v (log p_v - log q_v) with p = softmax(W h_t), q the teacher's; the value, and exactly the gradient
    of `opct.losses._kl` (the term sum_v p_v * grad log p_v = grad sum_v p_v = 0 is left out):
        d KL_t / d z_t = p * (d - KL_t),   d = log p - log q,   z_t = W h_t (+ b)
    so  dh_t = W^T (g_t p * (d - KL_t))  and  dW = sum_t (g_t p * (d - KL_t)) h_t^T  (when W is trained).

It returns, with the KL, the statistics the OPCT step logs (student entropy, and both models' log-probs of the
sampled tokens), computed from the same chunks without a graph. Peak memory: the inputs plus a few (chunk, V) float32
temporaries; `bench/kl_memory.py` measures it.
"""

from __future__ import annotations

import torch


def _log_softmax_(z: torch.Tensor) -> torch.Tensor:
    """log_softmax in place (one (chunk, V) buffer instead of two)."""
    return z.sub_(torch.logsumexp(z, -1, keepdim=True))


def _chunk_logps(h_s, h_t, W, b, Wt, bt, sl):
    """The chunk's student and teacher log-probs, float32 (chunk, V): two buffers."""
    zs = torch.nn.functional.linear(h_s[sl], W, b).float()
    zt = torch.nn.functional.linear(h_t[sl], Wt, bt).float()
    return _log_softmax_(zs), _log_softmax_(zt)


def _p_and_d_(ls: torch.Tensor, lt: torch.Tensor):
    """(p, d = log p - log q, KL) in the two buffers of `_chunk_logps` (both are overwritten)."""
    d = lt.neg_().add_(ls)
    p = ls.exp_()
    return p, d, torch.linalg.vecdot(p, d)


class _FusedReverseKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_s_N_d, h_t_N_d, W_V_d, b_V, Wt_V_d, bt_V, tokens_N, chunk: int):
        """(KL, and without gradients: student entropy, student and teacher log-prob of each token), all (N,)."""
        N = h_s_N_d.shape[0]
        kl_N, ent_N, s_lp_N, t_lp_N = (torch.empty(N, dtype=torch.float32, device=h_s_N_d.device) for _ in range(4))
        with torch.no_grad():
            for i in range(0, N, chunk):
                sl = slice(i, i + chunk)
                ls, lt = _chunk_logps(h_s_N_d, h_t_N_d, W_V_d, b_V, Wt_V_d, bt_V, sl)
                tok = tokens_N[sl, None]
                s_lp_N[sl], t_lp_N[sl] = ls.gather(-1, tok)[:, 0], lt.gather(-1, tok)[:, 0]
                p, d, kl = _p_and_d_(ls, lt)
                kl_N[sl] = kl
                # entropy = -sum p log p = -(KL + sum p log q), and log q = log p - d (p > 0 where it counts)
                log_q = d.sub_(torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))).neg_()
                ent_N[sl] = -(kl + torch.linalg.vecdot(p, log_q))
        none = torch.empty(0)
        ctx.save_for_backward(h_s_N_d, h_t_N_d, W_V_d, none if b_V is None else b_V, Wt_V_d,
                              none if bt_V is None else bt_V)
        ctx.chunk, ctx.has_bias, ctx.has_tbias = chunk, b_V is not None, bt_V is not None
        ctx.mark_non_differentiable(ent_N, s_lp_N, t_lp_N)
        return kl_N, ent_N, s_lp_N, t_lp_N

    @staticmethod
    def backward(ctx, g_N, *_):
        h_s, h_t, W, b, Wt, bt = ctx.saved_tensors
        b = b if ctx.has_bias else None
        bt = bt if ctx.has_tbias else None
        need_h, _, need_W, need_b = ctx.needs_input_grad[:4]
        grad_h = torch.zeros_like(h_s) if need_h else None
        grad_W = torch.zeros(W.shape, dtype=torch.float32, device=W.device) if need_W else None
        grad_b = torch.zeros(W.shape[0], dtype=torch.float32, device=W.device) if need_b else None
        with torch.no_grad():
            for i in range(0, h_s.shape[0], ctx.chunk):
                sl = slice(i, i + ctx.chunk)
                p, d, kl = _p_and_d_(*_chunk_logps(h_s, h_t, W, b, Wt, bt, sl))
                gz = d.sub_(kl[:, None]).mul_(p).mul_(g_N[sl, None].float())  # (chunk, V): d loss / d logits
                if need_h:
                    grad_h[sl] = (gz.to(W.dtype) @ W).to(h_s.dtype)
                if need_W:
                    grad_W += gz.t() @ h_s[sl].float()
                if need_b:
                    grad_b += gz.sum(0)
        return (grad_h, None, None if grad_W is None else grad_W.to(W.dtype),
                None if grad_b is None else grad_b.to(b.dtype), None, None, None, None)


def fused_reverse_kl(h_s_N_d: torch.Tensor, h_t_N_d: torch.Tensor, head: torch.nn.Linear,
                     teacher_head: torch.nn.Linear, tokens_N: torch.Tensor, chunk: int = 256):
    """(KL_t per position (N,), with its exact gradient to the student's hidden states and, if trained, its output
    layer `head`; and {"entropy", "student_logp", "teacher_logp"}: (N,) statistics without a graph). The teacher's
    hidden states and output layer (the same module under LoRA, a frozen copy under full fine-tuning) are data."""
    chunk = max(1, int(chunk))
    Wt, bt = teacher_head.weight.detach(), None if teacher_head.bias is None else teacher_head.bias.detach()
    kl_N, ent_N, s_lp_N, t_lp_N = _FusedReverseKL.apply(h_s_N_d, h_t_N_d.detach(), head.weight, head.bias, Wt, bt,
                                                        tokens_N, chunk)
    return kl_N, {"entropy": ent_N, "student_logp": s_lp_N, "teacher_logp": t_lp_N}
