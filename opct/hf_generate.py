"""Sampling and beam search through transformers' `model.generate`: the general path behind `HFPolicy` for models
that `opct.engine` does not reproduce (any architecture), with the sampler's own log-probs recorded."""

from __future__ import annotations

from typing import Sequence

import torch

from opct.batching import left_pad
from opct.engine import NonFinite


class SamplerLogprobs:
    """Records the sampling distribution's log-prob of each chosen token, in O(B x V) memory.

    generate() calls logits processors with the scores for step t; the token chosen at step t only shows up in
    `input_ids` at step t + 1, so the log-probs of step t are kept until then (the last step is collected by
    `finish`). transformers applies custom processors before its temperature warper, hence the division here; the
    policy sets no other warper (top-k 0, top-p 1), so this is exactly the distribution tokens are drawn from
    (greedy decoding: temperature 1, the model's own distribution). Scores that are NaN, +inf or all -inf (diverged
    weights), or that divided by the temperature give no distribution (a tiny one), raise `NonFinite` before a token
    is drawn from them.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.prev_logp_B_V = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        if self.prev_logp_B_V is not None:
            self.steps.append(self.prev_logp_B_V.gather(-1, input_ids[:, -1:]).squeeze(-1))
        if bool(torch.isnan(scores).any() | torch.isposinf(scores).any() | torch.isneginf(scores).all(-1).any()):
            raise NonFinite("the model's logits are not finite")
        self.prev_logp_B_V = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        if bool(torch.isnan(self.prev_logp_B_V).any()):  # finite logits, but infinite once divided by a tiny T
            raise NonFinite("the model's probabilities are not finite")
        return scores

    def finish(self, last_tokens_B) -> torch.Tensor:
        self.steps.append(self.prev_logp_B_V.gather(-1, last_tokens_B[:, None]).squeeze(-1))
        return torch.stack(self.steps, dim=1)


class Nucleus:
    """A logits processor for generate(): scores outside the top-p nucleus of softmax(scores / T) become -inf."""

    def __init__(self, temperature: float, top_p: float):
        self.temperature, self.top_p = temperature, top_p

    def __call__(self, input_ids, scores):
        from opct.engine import nucleus

        keep = torch.isfinite(nucleus(torch.log_softmax(scores.float() / self.temperature, -1), self.top_p))
        return scores.masked_fill(~keep, -float("inf"))


def generate(model, prompts_ids: Sequence[list[int]], pad_id: int, eos_ids: list[int], max_new_tokens: int,
             temperature: float, min_new_tokens: int = 0, top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature sampling (no top-k; nucleus when `top_p` < 1; greedy at temperature 0) from the global RNG.
    Returns (new tokens_B_T, sampler logp_B_T) on the CPU."""
    from transformers import GenerationConfig, LogitsProcessorList

    ids, attn = left_pad(prompts_ids, pad_id)
    P = ids.shape[1]
    sampled = temperature > 0
    gen = GenerationConfig(do_sample=sampled, temperature=temperature if sampled else None,
                           top_k=0 if sampled else None, top_p=1.0 if sampled else None,
                           max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens or None,
                           eos_token_id=eos_ids, pad_token_id=pad_id, use_cache=True)
    recorder = SamplerLogprobs(temperature if sampled else 1.0)
    # the nucleus is applied here, before the recorder (transformers' own top-p warper would run after it, so the
    # recorded log-probs would not be those of the distribution the tokens are drawn from)
    processors = [Nucleus(temperature, top_p)] if sampled and top_p < 1 else []
    out = _generate_in_eval_mode(model, ids, attn, generation_config=gen,
                                 logits_processor=LogitsProcessorList([*processors, recorder]))
    return out[:, P:].cpu(), recorder.finish(out[:, -1]).cpu()


def beam_search(model, prompts_ids: Sequence[list[int]], pad_id: int, eos_ids: list[int], max_new_tokens: int,
                num_beams: int) -> torch.Tensor:
    """The best-scoring finished beam per prompt (length penalty 1, stop at EOS): new tokens_B_T on the CPU."""
    from transformers import GenerationConfig

    ids, attn = left_pad(prompts_ids, pad_id)
    P = ids.shape[1]
    gen = GenerationConfig(do_sample=False, num_beams=num_beams, num_return_sequences=1, early_stopping=True,
                           max_new_tokens=max_new_tokens, eos_token_id=eos_ids, pad_token_id=pad_id, use_cache=True)
    return _generate_in_eval_mode(model, ids, attn, generation_config=gen)[:, P:].cpu()


def _generate_in_eval_mode(model, ids_B_P: torch.Tensor, attn_B_P: torch.Tensor, **kw) -> torch.Tensor:
    """`model.generate` on the model's device, in eval mode (no dropout), the model's mode restored after.

    generate() fills every field the given GenerationConfig leaves unset from the model's own `generation_config`
    (a checkpoint's repetition_penalty, no_repeat_ngram_size, bad_words_ids, min_p, ...), and each would reshape the
    distribution behind opct's back: the samples would not come from the policy, nor the recorded log-probs be theirs.
    So for the call the model's generation_config is an empty one (transformers' neutral defaults), restored after."""
    from transformers import GenerationConfig, GenerationMixin

    device = next(model.parameters()).device
    was_training = model.training
    owners = [m for m in model.modules() if isinstance(m, GenerationMixin) and hasattr(m, "generation_config")]
    saved = [m.generation_config for m in owners]
    model.eval()
    try:
        for m in owners:
            m.generation_config = GenerationConfig()
        return model.generate(input_ids=ids_B_P.to(device), attention_mask=attn_B_P.to(device), **kw)
    finally:
        for m, g in zip(owners, saved):
            m.generation_config = g
        model.train(was_training)
