"""Batch layouts: how prompts (and responses) of different lengths share one tensor. Every layout opct uses lives
here; the policy, the sampling engine, the training methods and the activation hooks all build their batches with
these functions.

Left-padded prompts (`left_pad`, `pad_left`): prompt i is right-aligned in a (B, W) block, so the last token of
every prompt sits in the last column; position ids count real tokens only (as generate() does), so a padded row
computes what it would compute alone.

Prompt + response (`pack`, used for scoring and for the training forward passes, see `response_logits`):

    row i:  [pad ... pad | prompt_i | response_i | pad ... pad]
             <--- prompt block, width P ---><---- response block, width R ---->

Prompts are left-padded to a common width P and responses right-padded to R, so response token j of every row
sits in column P + j and is predicted by the logits in column P + j - 1, whatever each prompt's length. Position ids
are counted from each row's first real token, so a padded row computes what it would compute alone (up to float
rounding).

When several rows share one prompt (OPCT samples n responses per prompt), `pack(..., share_prompts=True)` notes which,
and `response_logits` lays each distinct prompt out once, followed by all of its responses, with an attention mask
that keeps the responses apart (`_shared_prompt_logits`): the same logits (up to float rounding) in one forward pass
with fewer tokens, in forward and backward.
"""

from __future__ import annotations

import inspect
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence

import torch

from opct.activations import unwrap


def output_layer(model):
    """The model's output layer (lm_head) when it is a plain Linear that the fused KL can apply itself, else None."""
    head = unwrap(model).get_output_embeddings() if hasattr(unwrap(model), "get_output_embeddings") else None
    return head if type(head) is torch.nn.Linear else None


# What transformers models do to their logits after the output layer that the fused KL cannot follow, by config
# attribute, and the value that does nothing: Gemma 2/3's tanh soft-capping. (A scaling of the logits, Cohere's
# logit_scale or Granite's logits_scaling, is no obstacle: with the output layer passing its input through, the model
# scales the hidden states instead, and a bias-free output layer turns those into the scaled logits.)
_LOGIT_TRANSFORMS = (("final_logit_softcapping", None),)
_PLAIN_HEADS: "weakref.WeakKeyDictionary[torch.nn.Module, bool]" = weakref.WeakKeyDictionary()


def _text_config(model):
    """The model's config (a multimodal model's text part), or None."""
    cfg = getattr(unwrap(model), "config", None)
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def check_plain_head(model, batch: "PackedBatch") -> None:
    """Raise ValueError unless the model's logits are what the fused KL makes of them: its output layer applied to
    what the model gives with that layer passing its input through (`hidden_states_out`). A config attribute that
    transforms the logits beyond that is refused by name, and one row of `batch` is run both ways (no graph; once
    per model) for any other such transform."""
    key = unwrap(model)
    if _PLAIN_HEADS.get(key):
        return
    cfg = _text_config(model)
    for attr, neutral in _LOGIT_TRANSFORMS:
        value = getattr(cfg, attr, neutral)
        if value not in (neutral, None, 0):
            raise ValueError(f"its config sets {attr} = {value}, which transforms the logits after the output layer")
    P, n = batch.prompt_width, max(1, min(int(batch.response_lengths_B[0]), 8))
    prompt = batch.input_ids_B_L[0, :P][batch.attention_mask_B_L[0, :P].bool()].tolist()
    one = pack([prompt], [batch.response_ids_B_R[0, :n].tolist()], 0, batch.input_ids_B_L.device)
    plain = getattr(model, "module", model)  # not through DDP's forward (no collectives for a check)
    with torch.no_grad():
        logits = response_logits(plain, one)
        with hidden_states_out(plain) as head:
            hidden = response_logits(plain, one)
        diff = float((head(hidden).float() - logits.float()).abs().max())
    # the same matmul on the same rows: float32 agrees to rounding; under bf16/fp16 autocast to that dtype's rounding
    rel = 1e-4 if logits.dtype == torch.float32 else 3e-2
    if not diff <= rel * float(logits.float().abs().max()) + 1e-6:
        raise ValueError(f"its logits differ from its output layer applied to its last hidden states by up to "
                         f"{diff:.3g}: it transforms them after the output layer")
    _PLAIN_HEADS[key] = True


@contextmanager
def hidden_states_out(model):
    """Within the block the model's output layer passes its input through, so `response_logits` gives the last
    hidden states (B, R, d) instead of the logits (B, R, V); yields the output layer. For the fused KL
    (`opct.fused_kl`), which applies the output layer itself, chunk by chunk."""
    head = output_layer(model)
    if head is None:
        raise TypeError("the output layer is not a plain Linear")
    head.forward = lambda x: x  # an instance attribute, shadowing the class's forward until it is deleted
    try:
        yield head
    finally:
        del head.forward


def left_pad(prompts_ids: Sequence[list[int]], pad_id: int, width: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids_B_W, attention_mask_B_W) on the CPU: each prompt right-aligned in `width` (default: the longest) columns,
    padding on the left."""
    W = width if width is not None else max(len(p) for p in prompts_ids)
    ids = torch.full((len(prompts_ids), W), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts_ids):
        if p:
            ids[i, W - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[i, W - len(p):] = 1
    return ids, attn


def positions(attn: torch.Tensor) -> torch.Tensor:
    """Position ids that count real tokens only, so left padding does not shift them."""
    return (attn.cumsum(-1) - 1).clamp(min=0)


@dataclass
class PromptBatch:
    """Prompts left-padded to a common width W: token j of prompt i sits in column W - len_i + j, so the last tokens
    of every prompt share the last columns (position ids count real tokens only, as in `pack`)."""

    input_ids_B_W: torch.Tensor
    attention_mask_B_W: torch.Tensor
    position_ids_B_W: torch.Tensor
    lengths: list[int]

    @property
    def width(self) -> int:
        return self.input_ids_B_W.shape[1]

    def column(self, row: int, index: int) -> int:
        """The column of token `index` of prompt `row`."""
        return self.width - self.lengths[row] + index


def pad_left(prompts_ids: Sequence[list[int]], pad_id: int, device) -> PromptBatch:
    ids, attn = left_pad(prompts_ids, pad_id)
    return PromptBatch(ids.to(device), attn.to(device), positions(attn).to(device), [len(p) for p in prompts_ids])


@dataclass
class PackedBatch:
    input_ids_B_L: torch.Tensor
    attention_mask_B_L: torch.Tensor
    position_ids_B_L: torch.Tensor
    response_ids_B_R: torch.Tensor  # right-padded with pad_id (never read as a mask)
    response_lengths_B: torch.Tensor
    prompt_width: int  # P
    # share_prompts: row b's prompt is distinct prompt prompt_index_B[b] (whose first row is first_rows_U[u]), and row b
    # is the slot_B[b]-th row with that prompt
    prompt_index_B: torch.Tensor | None = None
    slot_B: torch.Tensor | None = None
    first_rows_U: torch.Tensor | None = None


def pack(prompts_ids: Sequence[list[int]], responses_ids: Sequence[list[int]], pad_id: int, device,
         share_prompts: bool = False) -> PackedBatch:
    """Lay out prompts (left-padded) and responses (right-padded) as described in the module docstring.

    `share_prompts`: when some rows have identical prompts, record them so that `response_logits` computes each
    distinct prompt once (the layout itself is the same).
    """
    if len(prompts_ids) != len(responses_ids):
        raise ValueError(f"{len(prompts_ids)} prompts but {len(responses_ids)} responses")
    B = len(prompts_ids)
    P = max(len(p) for p in prompts_ids)
    R = max(len(r) for r in responses_ids)
    if R == 0:
        raise ValueError("every response is empty")
    prompt_ids, prompt_attn = left_pad(prompts_ids, pad_id)
    resp_ids = torch.full((B, R), pad_id, dtype=torch.long)
    resp_attn = torch.zeros_like(resp_ids)
    for i, r in enumerate(responses_ids):
        resp_ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        resp_attn[i, :len(r)] = 1
    ids, attn = torch.cat([prompt_ids, resp_ids], 1), torch.cat([prompt_attn, resp_attn], 1)
    pos = positions(attn)
    lengths = torch.tensor([len(r) for r in responses_ids], dtype=torch.long)
    batch = PackedBatch(ids.to(device), attn.to(device), pos.to(device), ids[:, P:].to(device), lengths.to(device), P)
    if share_prompts:
        distinct: dict[tuple, int] = {}
        index = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts_ids]
        if len(distinct) < B:
            first = [index.index(u) for u in range(len(distinct))]
            slot = [index[:i].count(u) for i, u in enumerate(index)]
            batch.prompt_index_B = torch.tensor(index, dtype=torch.long, device=device)
            batch.slot_B = torch.tensor(slot, dtype=torch.long, device=device)
            batch.first_rows_U = torch.tensor(first, dtype=torch.long, device=device)
    return batch


def _last_logits(model, n: int, **kwargs):
    """The model's output, with logits for the last `n` columns only when the model can skip the others."""
    if "logits_to_keep" in inspect.signature(unwrap(model).forward).parameters:
        out = model(**kwargs, logits_to_keep=n)
        return out, out.logits
    out = model(**kwargs)
    return out, out.logits[:, -n:]


def mask_span(model) -> int | None:
    """How far back the model's own attention mask lets a token see: None for a plain causal mask; the span of a
    sliding window or of chunked attention (the smallest, if several); 0 for a mask that is not causal at all."""
    cfg = _text_config(model)
    if cfg is None:
        return 0
    if getattr(cfg, "use_bidirectional_attention", False):
        return 0
    spans = [getattr(cfg, "attention_chunk_size", None)]
    if getattr(cfg, "use_sliding_window", True) is not False:  # Qwen2 keeps a sliding_window it does not use
        spans.append(getattr(cfg, "sliding_window", None))
    spans = [s for s in spans if isinstance(s, int) and not isinstance(s, bool)]
    return min(spans) if spans else None


def _can_share_prompts(model, batch: PackedBatch) -> bool:
    """The shared-prompt layout needs a custom 4D attention mask: the attention implementations that take one, and
    a model whose own mask, which the custom one replaces, is plain causal over this batch's rows (a sliding window
    or attention chunk no shorter than a row hides nothing; a shorter one would be ignored, so those batches take
    the one-row-per-sample layout)."""
    impl = getattr(getattr(unwrap(model), "config", None), "_attn_implementation", None)
    span = mask_span(model)
    return impl in ("sdpa", "eager") and (span is None or batch.input_ids_B_L.shape[1] <= span)


def response_logits(model, batch: PackedBatch) -> torch.Tensor:
    """Logits that predict each response token: `logits_B_R_V[:, j]` predicts `batch.response_ids_B_R[:, j]`.

    `model` may be wrapped (DDP, peft); gradients flow if the caller has them enabled. A batch packed with
    `share_prompts` runs each distinct prompt once (see the module docstring).
    """
    R = batch.response_ids_B_R.shape[1]
    if batch.prompt_index_B is not None and _can_share_prompts(model, batch):
        return _shared_prompt_logits(model, batch)
    # Only the last R + 1 columns are needed; asking for fewer saves a (B, P, V) tensor on long prompts.
    _, logits = _last_logits(model, R + 1, input_ids=batch.input_ids_B_L, attention_mask=batch.attention_mask_B_L,
                             position_ids=batch.position_ids_B_L, use_cache=False)
    return logits[:, :-1]


def _shared_prompt_logits(model, batch: PackedBatch) -> torch.Tensor:
    """`response_logits` with each distinct prompt run once, in one forward pass over U rows (U distinct prompts):

        row u:  [pad ... pad | prompt_u | response of slot 0 | response of slot 1 | ... ]   width P + G * R

    where the G slots hold the responses of the rows that share prompt u (empty slots are padding). A custom 4D
    mask lets a response token see the real prompt tokens and the earlier tokens of its own slot only, and each slot's
    position ids continue from the prompt, so every response is computed exactly as in its own row (up to float
    rounding). A padding query sees only itself (a finite row, no NaN in the backward pass). The prompt's last
    column predicts token 0 of every slot.
    """
    P, R = batch.prompt_width, batch.response_ids_B_R.shape[1]
    dev = batch.input_ids_B_L.device
    prompt_B, slot_B, first_U = batch.prompt_index_B, batch.slot_B, batch.first_rows_U
    U, G = len(first_U), int(slot_B.max()) + 1
    L = P + G * R
    cols_B_R = P + slot_B[:, None] * R + torch.arange(R, device=dev)[None, :]
    rows_B_R = prompt_B[:, None].expand(-1, R)

    def lay_out(prompt_part_U_P, response_part_B_R, fill):
        out = torch.full((U, L), fill, dtype=prompt_part_U_P.dtype, device=dev)
        out[:, :P] = prompt_part_U_P
        out[rows_B_R, cols_B_R] = response_part_B_R
        return out

    ids_U_L = lay_out(batch.input_ids_B_L[first_U, :P], batch.response_ids_B_R, 0)
    real_U_L = lay_out(batch.attention_mask_B_L[first_U, :P], batch.attention_mask_B_L[:, P:], 0).bool()
    pos_U_L = lay_out(batch.position_ids_B_L[first_U, :P], batch.position_ids_B_L[:, P:], 0)
    segment_L = torch.cat([torch.zeros(P, dtype=torch.long, device=dev),
                           torch.arange(1, G + 1, device=dev).repeat_interleave(R)])
    causal_L_L = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
    visible_L_L = causal_L_L & ((segment_L[None, :] == 0) | (segment_L[None, :] == segment_L[:, None]))
    allowed_U_L_L = (visible_L_L[None] & real_U_L[:, None, :]) | torch.eye(L, dtype=torch.bool, device=dev)[None]
    if unwrap(model).config._attn_implementation == "sdpa":
        mask = allowed_U_L_L[:, None]
    else:  # eager attention adds the mask to the scores
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(allowed_U_L_L[:, None].shape, dtype=dtype, device=dev).masked_fill_(
            ~allowed_U_L_L[:, None], torch.finfo(dtype).min)
    _, logits_U_K_V = _last_logits(model, L - (P - 1), input_ids=ids_U_L, attention_mask=mask, position_ids=pos_U_L,
                                   use_cache=False)
    # column c of the layout is column c - (P - 1) of the kept logits; token j of a slot is predicted by column P - 1
    # (j = 0) or by the slot's column j - 1
    predictors_B_R = torch.cat([torch.zeros_like(cols_B_R[:, :1]), cols_B_R[:, :-1] - (P - 1)], 1)
    return logits_U_K_V[rows_B_R, predictors_B_R]


