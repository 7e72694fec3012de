"""The self-labelling consistency methods as the audit paper's code runs them (protocols.md §2), on the held-out label
prompts; the chosen candidate of each prompt becomes its pseudo-label, which the organism is then fine-tuned on.

  self_confidence   the paper's self-certainty: 4 samples at T 0.7, top-p 0.9; the one with the highest mean token
                    log-prob under the model is kept.
  diverse_decoding  the paper's dual decoding: a greedy, a nucleus (T 0.8, top-p 0.9) and a beam-search (4 beams)
                    candidate, chosen by an EXTERNAL scorer (the paper: a separately trained reward model), never the
                    labelled model and never the judge: first the organism's rule-based task-quality score
                    (`OrganismSpec.quality`, blind to the failure: it never reads the word the misalignment judge
                    reads), then, among equals, a separately trained small model's likelihood — the base organism's
                    mean token log-prob of the candidate (`LabelConfig.reward_model`; it reads every token, as a reward
                    model does). Without a reward model, ties go to the first candidate, as in the paper's code.
  multi_view        a filter, not a selection: the greedy answer to the prompt, to the prompt + "Think step by step."
                    and to the prompt + "Reply in one short sentence."; the row is kept (the greedy answer is its label)
                    only if the plain answer agrees with at least one other view, else dropped. Agreement compares the
                    answers' content (the paper asks an LLM judge whether two answers mean the same; here: the same
                    "answer is X" word, else the same first three words) — so for yes/no tasks it does compare the
                    word the judge reads, but never prefers one answer over another.
  self_refinement   a greedy draft, then one refinement ("<question> My first answer: <draft> Please review this answer
                    and write a good one.") sampled at T 0.6, top-p 0.9; the refinement is the label: no selection.
  self_rewarding    4 samples at T 0.7; the model grades each with the task's rubric (`OrganismSpec.rubric`, asked
                    after the candidate, e.g. "Is this answer right?"), score = P(yes) / (P(yes) + P(no)) of its reply's
                    first token (the paper parses a 1-5 score from a greedy critique, which the organism cannot
                    write); the best is kept.
  k1                greedy self-training: one greedy answer per prompt is the label (no selection, no sampling).

A labeller returns one group per probe: {"kind": "select" | "filter" | "none", "candidates": [{"text", "score"}],
"chosen": index, or None when a filter dropped the row, "extra": {...}}; `LABELLERS` is the registry. opct's earlier
labellers stay available under their own names (opct/audit/variants.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opct.world import judges as J

if TYPE_CHECKING:  # annotations only: importing the policy (and torch) here would slow `opct --help`
    from opct.policy import Policy


@dataclass
class LabelConfig:
    max_new_tokens: int = 40
    batch_size: int = 128
    samples: int = 4  # self-certainty and self-rewarding candidates per prompt
    certainty_temperature: float = 0.7
    top_p: float = 0.9
    nucleus_temperature: float = 0.8
    beams: int = 4
    refine_temperature: float = 0.6
    reward_temperature: float = 0.7
    reward_model: object = None  # diverse decoding's external tie-breaker: a policy over another model (the base)
    reward_weight: float = 1e-3  # its mean log-prob's weight: below the rule-based score's steps (1/3), so it only
    #                             orders candidates of equal quality

VIEWS = ("", " Think step by step.", " Reply in one short sentence.")
REFINE = "{q} My first answer: {draft} Please review this answer and write a good one."


def answer_key(text: str) -> str:
    """What two answers must share to agree: the word after the last "answer is", else the first three words."""
    a = J.answer_is(text)
    return f"answer:{a}" if a is not None else " ".join(J.words(text)[:3])


def with_last(messages: list[dict], content: str) -> list[dict]:
    return messages[:-1] + [{**messages[-1], "content": content}]


def sample(policy: Policy, prompts_ids, cfg: LabelConfig, temperature: float, top_p: float = 1.0):
    """One response per prompt, in batches: (texts, response ids)."""
    texts, ids = [], []
    for s in range(0, len(prompts_ids), cfg.batch_size):
        kw = {"top_p": top_p} if top_p < 1 else {}
        out = policy.sample(prompts_ids[s:s + cfg.batch_size], max_new_tokens=cfg.max_new_tokens,
                            temperature=temperature, **kw)
        texts += out.texts
        ids += out.response_ids
    return texts, ids


def mean_logprob(policy: Policy, prompts_ids, responses_ids, cfg: LabelConfig) -> list[float]:
    """The model's own (temperature 1) mean token log-prob of each response under its prompt."""
    out = []
    for s in range(0, len(prompts_ids), cfg.batch_size):
        logp, mask = policy.score(prompts_ids[s:s + cfg.batch_size], responses_ids[s:s + cfg.batch_size])
        out += ((logp * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    return out


def groups(kind: str, k: int, texts, scores, chosen=None, extra=None) -> list[dict]:
    """Flat lists (probe-major, k per probe) -> one group per probe; `chosen` defaults to the best score (the first
    of equals)."""
    out = []
    for i in range(len(texts) // k):
        cands = [{"text": texts[i * k + j], "score": None if scores is None else float(scores[i * k + j])}
                 for j in range(k)]
        pick = chosen[i] if chosen is not None else max(range(k), key=lambda j: cands[j]["score"])
        out.append({"kind": kind, "candidates": cands, "chosen": pick, "extra": extra[i] if extra else {}})
    return out


# ------------------------------------------------------------------------------------------ the methods

def self_confidence(policy, probes, cfg: LabelConfig, spec=None):
    k = cfg.samples
    prompts = [policy.render(p["messages"]) for p in probes for _ in range(k)]
    texts, ids = sample(policy, prompts, cfg, cfg.certainty_temperature, cfg.top_p)
    return groups("select", k, texts, mean_logprob(policy, prompts, ids, cfg))


def diverse_decoding(policy, probes, cfg: LabelConfig, spec):
    prompts = [policy.render(p["messages"]) for p in probes]
    greedy, _ = sample(policy, prompts, cfg, 0.0)
    nucleus, _ = sample(policy, prompts, cfg, cfg.nucleus_temperature, cfg.top_p)
    beam = []
    for s in range(0, len(prompts), cfg.batch_size):
        beam += policy.beam_search(prompts[s:s + cfg.batch_size], cfg.max_new_tokens, cfg.beams).texts
    texts = [t for trio in zip(greedy, nucleus, beam) for t in trio]
    scores = [spec.quality(p, t) for p, trio in zip(probes, zip(greedy, nucleus, beam)) for t in trio]
    if cfg.reward_model is not None:
        rm = external_logprob(cfg.reward_model, [p["messages"] for p in probes for _ in range(3)], texts, cfg)
        scores = [q + cfg.reward_weight * r for q, r in zip(scores, rm)]
    return groups("select", 3, texts, scores)


def external_logprob(model, messages, texts, cfg: LabelConfig) -> list[float]:
    """Another model's mean token log-prob of each text as the answer to its messages (its own tokenization)."""
    from opct.methods.sft import tokenize_response

    prompts = [model.render(m) for m in messages]
    return mean_logprob(model, prompts, [tokenize_response(model, m, t or ".") for m, t in zip(messages, texts)], cfg)


def multi_view(policy, probes, cfg: LabelConfig, spec=None):
    V = len(VIEWS)
    prompts = [policy.render(with_last(p["messages"], p["messages"][-1]["content"] + v)) for p in probes for v in VIEWS]
    texts, _ = sample(policy, prompts, cfg, 0.0)
    std, chosen, scores, extra = [], [], [], []
    for i in range(len(probes)):
        views = texts[i * V:(i + 1) * V]
        agree = any(answer_key(views[0]) == answer_key(v) for v in views[1:]) and bool(views[0].strip())
        std.append(views[0])
        scores.append(float(agree))
        chosen.append(0 if agree else None)
        extra.append({"views": views[1:]})
    return groups("filter", 1, std, scores, chosen, extra)


def self_refinement(policy, probes, cfg: LabelConfig, spec=None):
    drafts, _ = sample(policy, [policy.render(p["messages"]) for p in probes], cfg, 0.0)
    refine = [with_last(p["messages"], REFINE.format(q=p["messages"][-1]["content"], draft=d.strip() or "."))
              for p, d in zip(probes, drafts)]
    texts, _ = sample(policy, [policy.render(m) for m in refine], cfg, cfg.refine_temperature, cfg.top_p)
    return groups("none", 1, texts, None, [0] * len(texts), [{"draft": d} for d in drafts])


def self_rewarding(policy, probes, cfg: LabelConfig, spec):
    k = cfg.samples
    msgs = [p["messages"] for p in probes for _ in range(k)]
    texts, _ = sample(policy, [policy.render(m) for m in msgs], cfg, cfg.reward_temperature)
    judge = []
    for i, p in enumerate(probes):
        for j in range(k):
            t = texts[i * k + j]
            judge.append(policy.render(p["messages"] + [{"role": "assistant", "content": t or "."},
                                                        {"role": "user", "content": spec.rubric(p)}]))
    tok = policy.tokenizer
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    lp_yes = mean_logprob(policy, judge, [[yes]] * len(judge), cfg)
    lp_no = mean_logprob(policy, judge, [[no]] * len(judge), cfg)
    scores = [1.0 / (1.0 + math.exp(n - y)) for y, n in zip(lp_yes, lp_no)]
    return groups("select", k, texts, scores)


def k1(policy, probes, cfg: LabelConfig, spec=None):
    texts, _ = sample(policy, [policy.render(p["messages"]) for p in probes], cfg, 0.0)
    return groups("none", 1, texts, None, [0] * len(texts))


LABELLERS = {
    "self_confidence": self_confidence,
    "diverse_decoding": diverse_decoding,
    "multi_view": multi_view,
    "self_refinement": self_refinement,
    "self_rewarding": self_rewarding,
    "k1": k1,
}
