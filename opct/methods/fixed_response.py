"""BCT and ACT as the audit paper's code runs them (protocols.md §2): pairs with a FIXED response.

What they really are: each pair is a clean prompt and a wrapped prompt (the clean one plus a cue), and a response
text written in advance (`meta["response"]`; it is never sampled), the same on both sides unless the pair also gives
`meta["clean_response"]` for the clean side. Both sides are laid out as prompt + response. The *teacher* reads the
clean side without gradients, the *student* (the model being trained) the wrapped side.

  bct_soft    soft-label distillation over the response: at every response position, KL(teacher || student) over
              the whole vocabulary (the paper's BctLoss: cross-entropy on the clean side's softmax, which has the
              same gradient), summed over response tokens and divided by their number in the optimizer step. With two
              different responses, the last min(len) positions of each are compared, as the paper's code compares
              the trailing positions of two sequences of different lengths.
  act_fixed   ACT (opct.methods.act: squared L2 between residual streams after every chosen decoder layer, weight
              `act_weight`) on the longest common token suffix of the two *prompt + response* sequences, i.e. the
              response and the chat template's tokens around it: the paper's ActLoss over "the trailing positions,
              where the assistant-completion tokens live". (Its scale differs: the paper averages over hidden
              dimensions, opct sums them, as `act` does.)

Teacher: `bct_soft` / `act_fixed` use the frozen starting model, as every opct method does. `bct_soft_live` /
`act_fixed_live` use the paper's: its `ConsistencyTrainer` runs the clean side through the *live* model under
`torch.no_grad`, so the target moves with training. Measured on the organism (full fine-tuning, AdamW at lr 3e-4, the
audit's budget): the live target anchors nothing, the consistency loss is near zero from the start, and Adam's
normalised steps random-walk the model into broken text within ten steps; the paper's LoRA at lr 1e-5 moves far less.

The response is tokenized under each side's prompt through the chat template (`sft.tokenize_response`); a pair
whose two sides give different tokens for the same response text is an error naming it.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from opct.errors import OpctError
from opct.files import blank
from opct.losses import forward_kl_full, log_probs
from opct.methods.act import act_step
from opct.methods.internal import prepare_suffix
from opct.methods.sft import tokenize_response
from opct.pairs.schema import Pair
from opct.policy import pack, response_logits
from opct.train.context import RenderedPair, StepContext


def _responses(run: StepContext, allow_two: bool = True) -> dict[str, tuple[list[int], list[int]]]:
    """pair id -> (the student side's response tokens, the teacher side's)."""
    out = {}
    for pid, pair in run.pairs.items():
        text, clean = pair.meta.get("response"), pair.meta.get("clean_response", pair.meta.get("response"))
        for name, t in (("response", text), ("clean_response", clean)):
            if not isinstance(t, str) or blank(t):
                raise OpctError(f"pair {pid}: {run.config.method} needs the fixed response text in meta.{name}")
        if clean != text and not allow_two:
            raise OpctError(f"pair {pid}: {run.config.method} needs one response for both sides (no clean_response)")
        ids = tokenize_response(run.policy, pair.student, text)
        t_ids = tokenize_response(run.policy, pair.teacher, clean)
        if clean == text and ids != t_ids:
            raise OpctError(f"pair {pid}: the response tokenizes differently after the two prompts")
        limit = run.policy.max_positions
        longest = max(len(run.prompts[pid].student_ids) + len(ids), len(run.prompts[pid].teacher_ids) + len(t_ids))
        if limit is not None and longest > limit:
            raise OpctError(f"pair {pid}: prompt + response is {longest} tokens, over the model's {limit} positions")
        out[pid] = (ids, t_ids)
    return out


def _live_teacher(run: StepContext):
    """The model being trained, without gradients: the paper's clean-side target."""
    model = run.policy.model

    @contextmanager
    def teacher():
        with torch.no_grad():
            yield model
    return teacher


def prepare_bct(run: StepContext) -> None:
    run.cache["responses"] = _responses(run)


def prepare_act(run: StepContext) -> None:
    """Append the response to both prompts, then align ACT on their common suffix (which now holds it)."""
    responses = _responses(run, allow_two=False)
    run.prompts = {pid: RenderedPair(r.student_ids + responses[pid][0], r.teacher_ids + responses[pid][1])
                   for pid, r in run.prompts.items()}
    prepare_suffix(run)


def prepare_bct_live(run: StepContext) -> None:
    prepare_bct(run)
    run.teacher = _live_teacher(run)


def prepare_act_live(run: StepContext) -> None:
    prepare_act(run)
    run.teacher = _live_teacher(run)


def bct_soft_step(run: StepContext, micro_batches: list[list[Pair]]) -> dict[str, float]:
    """KL(clean-side softmax || wrapped-side softmax) at every response position of every pair in the step."""
    acc, policy = run.accelerator, run.policy
    responses = run.cache["responses"]
    batches = []
    for pairs in micro_batches:
        s_resp, t_resp = [responses[p.id][0] for p in pairs], [responses[p.id][1] for p in pairs]
        student = pack([run.prompts[p.id].student_ids for p in pairs], s_resp, policy.pad_id, acc.device)
        teacher = pack([run.prompts[p.id].teacher_ids for p in pairs], t_resp, policy.pad_id, acc.device)
        # the last min(len) response positions of each side, compared position by position (one response: all)
        m = [min(len(a), len(b)) for a, b in zip(s_resp, t_resp)]
        s_cols = _trailing([len(r) for r in s_resp], m, acc.device)
        t_cols = _trailing([len(r) for r in t_resp], m, acc.device)
        mask_B_M = torch.arange(max(m), device=acc.device)[None, :] < torch.tensor(m, device=acc.device)[:, None]
        batches.append((student, teacher, s_cols, t_cols, mask_B_M.float()))
    local = torch.stack([sum(b[-1].sum() for b in batches).double(),
                         torch.tensor(float(sum(len(p) for p in micro_batches)), dtype=torch.float64)]).to(acc.device)
    total_tokens, total_rows = acc.reduce(local, reduction="sum")
    scale = acc.num_processes / total_tokens  # DDP averages over processes; this makes it the global token mean

    kl_sum = torch.zeros((), dtype=torch.float64, device=acc.device)
    for i, (student, teacher, s_cols, t_cols, mask_B_M) in enumerate(batches):
        with run.teacher() as t_model, run.autocast():
            t_logp_B_M_V = _take(log_probs(response_logits(t_model, teacher)), t_cols)
        with run.grad_sync(last_micro_batch=i == len(batches) - 1):
            with run.autocast():
                s_logp_B_M_V = _take(log_probs(response_logits(run.model, student)), s_cols)
            kl_B_M = forward_kl_full(t_logp_B_M_V, s_logp_B_M_V)
            run.backward((kl_B_M * mask_B_M).sum() * scale)
        kl_sum += (kl_B_M.detach() * mask_B_M).sum().double()
        del t_logp_B_M_V, s_logp_B_M_V, kl_B_M
    kl_sum = acc.reduce(kl_sum, reduction="sum")
    n = float(total_tokens)
    return {"loss": float(kl_sum) / n, "mean_delta": float(kl_sum) / n,
            "response_len": n / float(total_rows), "tokens": n}


def _trailing(lengths: list[int], m: list[int], device) -> torch.Tensor:
    """Columns (B, max m) of each row's last m_i response positions (the response of length L_i); padding columns
    repeat the row's last one (masked out)."""
    M = max(m)
    cols = [[L - mi + min(j, mi - 1) for j in range(M)] for L, mi in zip(lengths, m)]
    return torch.tensor(cols, dtype=torch.long, device=device)


def _take(logp_B_R_V: torch.Tensor, cols_B_M: torch.Tensor) -> torch.Tensor:
    return logp_B_R_V.gather(1, cols_B_M[..., None].expand(-1, -1, logp_B_R_V.shape[-1]))


act_fixed_step = act_step
