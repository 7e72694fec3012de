"""The step shared by the internal-consistency methods (ACT, MLPCT, AttCT); each supplies a site and a distance.

One optimizer step: for every micro-batch, the student runs on the student prompts (gradients on) and the frozen
starting model on the teacher prompts (no gradients), each inside `opct.activations.record` for one site at the
chosen layers; the method's distance compares the two at the aligned prompt positions (`opct.methods.alignment`).
No tokens are sampled: these methods only read the prompts.

Prefills (`opct.pairs.schema`): a prefill is the start of the assistant's turn, not prompt, so these methods read
each side without it (`prompt_ids`). Under causal masking the prefill cannot change the activations of the positions
before it, so leaving it out changes no compared value; it makes the two sides of a prefill pair (`[user x]
[assistant]` against `[user x][assistant][prefill]`) the same token ids, and their loss and gradient exactly 0 rather
than 0 up to the float rounding of a wider batch. No internal method gets any signal from a prefill pair.

Normalisation: the distance summed over aligned units (tokens, or for AttCT query positions) and layers is divided
by (aligned units in the whole optimizer step, over all micro-batches and processes) x (number of layers), and
multiplied by the method's weight — a mean over tokens and layers whose scale does not depend on gradient
accumulation or the number of processes.
"""

from __future__ import annotations

from typing import Callable

import torch

from opct.activations import forward_prompts, num_layers, parse_layers, record
from opct.batching import pad_left
from opct.errors import OpctError
from opct.methods.alignment import Span, common_suffix_length, content_span
from opct.pairs.schema import Pair, prefill_of, without_prefill
from opct.train.context import RenderedPair, StepContext

# A placement of one pair's span in the two padded batches: (row, student column, teacher column, length).
Placement = tuple[int, int, int, int]
# (student activations, teacher activations, placements) -> (surrogate sum to back-propagate, value sum to report),
# both summed over the aligned units of the micro-batch for ONE layer.
Distance = Callable[[torch.Tensor, torch.Tensor, list[Placement]], tuple[torch.Tensor, torch.Tensor]]


def prompt_ids(run: StepContext) -> dict[str, RenderedPair]:
    """Each pair's two prompts as these methods read them: without a prefill (see the module docstring)."""
    out = {}
    for pid, r in run.prompts.items():
        pair = run.pairs[pid]
        s = run.policy.render(without_prefill(pair.student)) if prefill_of(pair.student) is not None else r.student_ids
        t = run.policy.render(without_prefill(pair.teacher)) if prefill_of(pair.teacher) is not None else r.teacher_ids
        out[pid] = RenderedPair(s, t)
    return out


def prepare_suffix(run: StepContext) -> None:
    """ACT: align each pair on the longest common token suffix of its two prompts."""
    spans = {}
    run.cache["prompt_ids"] = prompts = prompt_ids(run)
    for pid, r in prompts.items():
        k = common_suffix_length(r.teacher_ids, r.student_ids)
        if k == 0:
            raise OpctError(f"pair {pid}: the teacher and student prompts end in different tokens, so they share no "
                            f"suffix for {run.config.method.upper()} to align")
        spans[pid] = Span(len(r.teacher_ids) - k, len(r.student_ids) - k, k)
    _prepare(run, spans)


def prepare_content(run: StepContext, min_length: int = 1) -> None:
    """MLPCT, AttCT: align each pair on its clean-content span (an OpctError names a pair where none is found)."""
    spans = {}
    run.cache["prompt_ids"] = prompts = prompt_ids(run)
    for pid, r in prompts.items():
        span = content_span(run.pairs[pid], r.teacher_ids, r.student_ids, run.policy.tokenizer)
        if span.length < min_length:
            raise OpctError(f"pair {pid}: the clean content is {span.length} token(s) long; "
                            f"{run.config.method.upper()} needs at least {min_length}")
        spans[pid] = span
    _prepare(run, spans)


def _prepare(run: StepContext, spans: dict[str, Span]) -> None:
    run.cache["spans"] = spans
    run.cache["layers"] = parse_layers(run.config.layers, num_layers(run.model))


def placements(spans: list[Span], student, teacher) -> list[Placement]:
    """Where each row's span sits in the left-padded student and teacher batches (`opct.batching.PromptBatch`)."""
    return [(i, student.column(i, s.student_start), teacher.column(i, s.teacher_start), s.length)
            for i, s in enumerate(spans)]


def gather(acts_B_W_D: torch.Tensor, places: list[Placement], side: int) -> torch.Tensor:
    """The activations at the aligned positions, every row's span one after another: (N, D). `side` 1 = student
    columns, 2 = teacher columns."""
    rows = [i for i, *_, n in places for _ in range(n)]
    cols = [p[side] + j for p in places for j in range(p[3])]
    return acts_B_W_D[torch.tensor(rows, device=acts_B_W_D.device), torch.tensor(cols, device=acts_B_W_D.device)]


def internal_step(run: StepContext, micro_batches: list[list[Pair]], site: str, distance: Distance,
                  units: Callable[[Span], int], weight: float) -> dict[str, float]:
    """One optimizer step of an internal-consistency method (see the module docstring)."""
    acc, policy = run.accelerator, run.policy
    layers, spans = run.cache["layers"], run.cache["spans"]
    prompts = run.cache.get("prompt_ids", run.prompts)
    local = sum(units(spans[p.id]) for pairs in micro_batches for p in pairs)
    n_pairs = sum(len(pairs) for pairs in micro_batches)
    counts = acc.reduce(torch.tensor([float(local), float(n_pairs)], dtype=torch.float64, device=acc.device),
                        reduction="sum")
    total_units = counts[0]
    # DDP averages gradients over processes; multiplying by their number turns that average into the global sum.
    scale = acc.num_processes / (total_units * len(layers))

    value_sum = torch.zeros((), dtype=torch.float64, device=acc.device)
    for i, pairs in enumerate(micro_batches):
        student = pad_left([prompts[p.id].student_ids for p in pairs], policy.pad_id, acc.device)
        teacher = pad_left([prompts[p.id].teacher_ids for p in pairs], policy.pad_id, acc.device)
        places = placements([spans[p.id] for p in pairs], student, teacher)
        with run.grad_sync(last_micro_batch=i == len(micro_batches) - 1):
            with run.autocast():
                with record(run.model, (site,), layers) as s_rec:
                    logits = forward_prompts(run.model, student).logits
                with run.teacher() as teacher_model, record(teacher_model, (site,), layers) as t_rec:
                    forward_prompts(teacher_model, teacher)
            s_acts, t_acts = getattr(s_rec, site), getattr(t_rec, site)
            surrogate, value = 0.0, 0.0
            for layer in layers:
                sur_l, val_l = distance(s_acts[layer], t_acts[layer], places)
                surrogate, value = surrogate + sur_l, value + val_l
            # + 0 x logits: every trainable parameter gets a gradient (zero where the loss does not reach, e.g. past
            # the last chosen layer), as DDP requires of every parameter that the forward's output depends on.
            run.backward(surrogate * (weight * scale) + 0.0 * logits.float().sum())
        value_sum += value.detach().double()
        del s_rec, t_rec, s_acts, t_acts, surrogate, logits  # free before the next micro-batch's forward
    value_sum = acc.reduce(value_sum, reduction="sum")
    distance_mean = float(value_sum / (total_units * len(layers)))
    return {"loss": weight * distance_mean, "distance": distance_mean, "aligned_len": float(total_units / counts[1]),
            "tokens": float(total_units)}
