"""On-Policy Consistency Training (DESIGN §4).

What it really is: on each step the student answers the *perturbed* (student) prompt itself, by sampling; the frozen
starting model — the teacher — reads the very same answer, token by token, but under the *clean* (teacher) prompt.
The student is pushed to make every next-token distribution along its own answer match the teacher's: a per-token
reverse KL, KL(student || teacher), estimated as chosen in `opct.losses`. Because the answers are the student's own,
training stays on its distribution, unlike SFT on offline teacher answers.

One optimizer step = sample every micro-batch first (so the number of response tokens in the whole step, over all
micro-batches and processes, is known), then one forward/backward per micro-batch with the loss divided by that
count. The loss scale therefore does not depend on gradient accumulation or on the number of processes.
"""

from __future__ import annotations

import torch

from opct.activations import unwrap
from opct.errors import OpctError
from opct.losses import (ESTIMATORS, NEEDS_SAMPLER, SUM_LOSS, entropy, log_probs, log_ratio_gate, response_mask,
                         token_logprobs)
from opct.pairs.schema import Pair
from opct.policy import Samples, pack, response_logits
from opct.train.context import StepContext
from opct.train.guards import check_same_responses


def rollout(run: StepContext, pairs: list[Pair]) -> tuple[list[list[int]], list[list[int]], Samples]:
    """Sample `n_samples` responses per pair on the student prompts; return (student ids, teacher ids, samples)."""
    cfg = run.config
    rows = [run.prompts[p.id] for p in pairs for _ in range(cfg.n_samples)]
    student_ids = [r.student_ids for r in rows]
    sampler = run.policy if run.sampler is None else run.sampler  # `--sampler vllm`: the vLLM engine
    samples = sampler.sample(student_ids, cfg.max_new_tokens, cfg.temperature, cfg.min_new_tokens)
    return student_ids, [r.teacher_ids for r in rows], samples


def opct_step(run: StepContext, micro_batches: list[list[Pair]]) -> dict[str, float]:
    """Forward and backward of one optimizer step (the loop clips, steps and logs). Returns the step's statistics,
    averaged over all response tokens of all processes (and `tokens`, their count)."""
    return kl_step(run, micro_batches, rollout)


def _vocab_loss(run: StepContext, student, teacher, mask_B_R, sampler_logp_B_R):
    """The masked sum of the estimator's surrogate from both models' full-vocabulary log-probs; and the sums over
    response tokens of the loss value, delta, student entropy and teacher cross-entropy (no graph)."""
    cfg = run.config
    tokens_B_R = student.response_ids_B_R
    student_logp_B_R_V = log_probs(response_logits(run.model, student))
    with run.teacher() as teacher_model:
        teacher_logp_B_R_V = log_probs(response_logits(teacher_model, teacher))
    surrogate_B_R, value_B_R = ESTIMATORS[cfg.estimator](
        student_logp_B_R_V, teacher_logp_B_R_V, tokens_B_R, topk=cfg.topk, sampler_logp_B_T=sampler_logp_B_R,
        importance_clip=cfg.importance_clip or None, clip_tau=cfg.clip_tau)
    with torch.no_grad():
        s_logp_B_R = token_logprobs(student_logp_B_R_V, tokens_B_R)
        t_logp_B_R = token_logprobs(teacher_logp_B_R_V, tokens_B_R)
        clipped_B_R = 1.0 - log_ratio_gate(student_logp_B_R_V, teacher_logp_B_R_V, tokens_B_R, cfg.clip_tau)
        stats = [(value_B_R.detach() * mask_B_R).sum(), ((s_logp_B_R - t_logp_B_R) * mask_B_R).sum(),
                 (entropy(student_logp_B_R_V.detach()) * mask_B_R).sum(), (-t_logp_B_R * mask_B_R).sum(),
                 (clipped_B_R * mask_B_R).sum()]
    return (surrogate_B_R * mask_B_R).sum(), stats


def _fused_loss(run: StepContext, student, teacher, mask_B_R):
    """The `full` estimator through the fused output layer + KL (`opct.fused_kl`, `kl_chunk` positions at a time):
    the same value and gradient as `_vocab_loss`, without the full-vocabulary tensors."""
    from opct.batching import hidden_states_out, output_layer
    from opct.fused_kl import fused_reverse_kl

    if output_layer(run.model) is None:
        raise OpctError("--kl-chunk needs the model's output layer (lm_head) to be a plain Linear (not a LoRA "
                        "target); drop --kl-chunk or the output layer from --lora-targets")
    _check_head(run.model, student)
    keep = mask_B_R.bool()
    with hidden_states_out(run.model) as head:
        h_s_N_d = response_logits(run.model, student)[keep]
    with run.teacher() as teacher_model:
        _check_head(teacher_model, teacher)
        with hidden_states_out(teacher_model) as teacher_head:
            h_t_N_d = response_logits(teacher_model, teacher)[keep]
    kl_N, st = fused_reverse_kl(h_s_N_d, h_t_N_d, head, teacher_head, student.response_ids_B_R[keep],
                                run.config.kl_chunk)
    stats = [kl_N.detach().sum(), (st["student_logp"] - st["teacher_logp"]).sum(), st["entropy"].sum(),
             -st["teacher_logp"].sum(), kl_N.new_zeros(())]
    return kl_N.sum(), stats


def _check_head(model, batch) -> None:
    """`opct.batching.check_plain_head` as a one-line error naming the model and the way out."""
    from opct.batching import check_plain_head

    try:
        check_plain_head(model, batch)
    except ValueError as e:
        name = getattr(unwrap(model).config, "_name_or_path", "") or "the model"
        raise OpctError(f"--kl-chunk: {name}: {e}; the fused KL applies the plain output layer, so it would train on "
                        f"other logits than the model's; drop --kl-chunk") from None


def kl_step(run: StepContext, micro_batches: list[list[Pair]], responses) -> dict[str, float]:
    """The per-token reverse-KL step over the responses `responses(run, pairs)` gives for each micro-batch — the
    student's own samples (OPCT), or fixed ones (the off-policy ablation, opct.methods.offpolicy)."""
    cfg, acc, policy = run.config, run.accelerator, run.policy
    batches = []
    for pairs in micro_batches:
        student_ids, teacher_ids, samples = responses(run, pairs)
        # The n samples of a pair share their prompts: under LoRA each distinct prompt is run once (see opct.policy).
        # Not under full fine-tuning: there the teacher is a copy of the weights, and a copy can take other
        # (alignment-dependent) matmul kernels than the student on the smaller prompt-only shapes, so identical
        # prompts would no longer give an exactly zero loss; the one-pass layout keeps both on the same kernels.
        share = cfg.lora
        student = pack(student_ids, samples.response_ids, policy.pad_id, acc.device, share_prompts=share)
        teacher = pack(teacher_ids, samples.response_ids, policy.pad_id, acc.device, share_prompts=share)
        check_same_responses(student, teacher, f"step {run.step + 1}")
        mask_B_R = response_mask(student.response_ids_B_R, student.response_lengths_B, policy.eos_ids)
        batches.append((student, teacher, mask_B_R, samples))

    local = sum(mask_B_R.sum() for _, _, mask_B_R, _ in batches)
    total_tokens = acc.reduce(local.double(), reduction="sum")
    # DDP averages gradients over processes; multiplying by their number turns that average into the global sum.
    # A token-sum estimator (the paper's) is not divided by the token count.
    scale = acc.num_processes / (1.0 if cfg.estimator in SUM_LOSS else total_tokens)

    # sums over response tokens: loss value, delta, student entropy, teacher CE, clipped; then rows, truncated rows
    sums = torch.zeros(7, dtype=torch.float64, device=acc.device)
    for i, (student, teacher, mask_B_R, samples) in enumerate(batches):
        sampler_logp_B_R = None
        if cfg.importance_weight or cfg.estimator in NEEDS_SAMPLER:
            sampler_logp_B_R = torch.zeros(student.response_ids_B_R.shape, device=acc.device)
            for row, lp in enumerate(samples.logprobs):
                sampler_logp_B_R[row, :len(lp)] = torch.tensor(lp)
        with run.grad_sync(last_micro_batch=i == len(batches) - 1):
            with run.autocast():
                if cfg.kl_chunk:
                    loss, stats = _fused_loss(run, student, teacher, mask_B_R)
                else:
                    loss, stats = _vocab_loss(run, student, teacher, mask_B_R, sampler_logp_B_R)
            run.backward(loss * scale)
        rows, truncated = len(samples.response_ids), sum(samples.truncated)
        sums += torch.stack([*stats, mask_B_R.new_tensor(rows), mask_B_R.new_tensor(truncated)]).to(sums)
        del loss  # free the graph before the next micro-batch's forward
    sums = acc.reduce(sums, reduction="sum")
    n = float(total_tokens)
    out = {"loss": float(sums[0]) / n, "mean_delta": float(sums[1]) / n, "student_entropy": float(sums[2]) / n,
           "teacher_ce": float(sums[3]) / n, "response_len": n / float(sums[5]),
           "truncated_frac": float(sums[6]) / float(sums[5]), "tokens": n}
    if cfg.clip_tau is not None:  # the share of response tokens the log-ratio clip took out of the gradient
        out["clipped_frac"] = float(sums[4]) / n
    return out
