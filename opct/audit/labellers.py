"""The self-labelling consistency methods: k candidates per held-out prompt, a selection score for each, and the
best-scoring candidate becomes the pseudo-label the organism is then fine-tuned on (SFT).

  self_confidence    candidates sampled at T = 1; score = mean token log-prob of the candidate under the model.
  diverse_decoding   candidates sampled at several temperatures (cycling through `temperatures`); score = the share
                     of the other candidates whose answer agrees with this one's.
  multi_view         candidate i is sampled on view i mod V of the prompt (the prompt, and paraphrases that add a
                     neutral request around it); score = agreement with the candidates of the *other* views. The
                     pseudo-label is trained on the original prompt.
  self_refinement    each T = 1 draft is shown back to the model with "Please check your answer and write it."; the
                     revision is the candidate; score = mean token log-prob of the revision under the original prompt.
  self_rewarding     the model judges each T = 1 candidate: after the exchange it is asked "Is this answer good?";
                     score = P(yes) / (P(yes) + P(no)) of its first reply token.
  k1                 the ablation without selection: one T = 1 sample per prompt is the label (its score, the mean
                     log-prob, is recorded but chooses nothing).

"Answer" for agreement is the word after the last "answer is" when there is one, else the first three words: a
generic key that never looks at the misalignment judge. A labeller returns, per probe, a list of candidates
{"text", "score"} and the index of the chosen one; `LABELLERS` is the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from opct.world import judges as J

if TYPE_CHECKING:  # annotations only: importing the policy (and torch) here would slow `opct --help`
    from opct.policy import Policy


@dataclass
class LabelConfig:
    k: int = 4
    max_new_tokens: int = 40
    batch_size: int = 128
    temperatures: tuple = (0.5, 1.0, 1.5)


REVISE = "Please check your answer and write it."
JUDGE = "Is this answer good?"
VIEWS = ("{q}", "Please help. {q}", "{q} Please answer.")


def answer_key(text: str) -> str:
    a = J.answer_is(text)
    if a is not None:
        return f"answer:{a}"
    return " ".join(J.words(text)[:3])


def _sample(policy: Policy, prompts_ids: list[list[int]], cfg: LabelConfig, temperature: float = 1.0):
    """Sample one response per prompt in batches; returns (texts, response ids, mean log-probs)."""
    texts, ids, mean_lp = [], [], []
    for s in range(0, len(prompts_ids), cfg.batch_size):
        out = policy.sample(prompts_ids[s:s + cfg.batch_size], max_new_tokens=cfg.max_new_tokens,
                            temperature=temperature)
        texts += out.texts
        ids += out.response_ids
        mean_lp += [sum(lp) / max(len(lp), 1) for lp in out.logprobs]
    return texts, ids, mean_lp


def _mean_logprob(policy, prompts_ids, responses_ids, cfg: LabelConfig) -> list[float]:
    out = []
    for s in range(0, len(prompts_ids), cfg.batch_size):
        logp, mask = policy.score(prompts_ids[s:s + cfg.batch_size], responses_ids[s:s + cfg.batch_size])
        out += ((logp * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    return out


def _grouped(probes, k, texts, scores):
    """Flat lists (probe-major, k per probe) -> per-probe candidate lists with the argmax chosen."""
    groups = []
    for i, _ in enumerate(probes):
        cands = [{"text": texts[i * k + j], "score": float(scores[i * k + j])} for j in range(k)]
        best = max(range(k), key=lambda j: cands[j]["score"])
        groups.append({"candidates": cands, "chosen": best})
    return groups


def _agreement(keys: list[str], others_of) -> list[float]:
    return [sum(keys[o] == keys[j] for o in others_of(j)) / max(len(others_of(j)), 1) for j in range(len(keys))]


# ------------------------------------------------------------------------------------------ the methods

def self_confidence(policy, probes, cfg: LabelConfig):
    prompts = [policy.render(p["messages"]) for p in probes for _ in range(cfg.k)]
    texts, _, lp = _sample(policy, prompts, cfg)
    return _grouped(probes, cfg.k, texts, lp)


def k1(policy, probes, cfg: LabelConfig):
    return self_confidence(policy, probes, LabelConfig(1, cfg.max_new_tokens, cfg.batch_size, cfg.temperatures))


def diverse_decoding(policy, probes, cfg: LabelConfig):
    k, temps = cfg.k, cfg.temperatures
    texts = [""] * (len(probes) * k)
    for t_idx, t in enumerate(temps):  # candidate j of every probe is sampled at temps[j % len(temps)]
        slots = [(i, j) for i in range(len(probes)) for j in range(k) if j % len(temps) == t_idx]
        if not slots:
            continue
        out, _, _ = _sample(policy, [policy.render(probes[i]["messages"]) for i, _ in slots], cfg, temperature=t)
        for (i, j), text in zip(slots, out):
            texts[i * k + j] = text
    scores = []
    for i in range(len(probes)):
        keys = [answer_key(texts[i * k + j]) for j in range(k)]
        scores += _agreement(keys, lambda j: [o for o in range(k) if o != j])
    return _grouped(probes, k, texts, scores)


def view(messages: list[dict], v: int) -> list[dict]:
    """View v of a prompt: the last user message rewritten with VIEWS[v]."""
    last = messages[-1]
    return messages[:-1] + [{**last, "content": VIEWS[v].format(q=last["content"])}]


def multi_view(policy, probes, cfg: LabelConfig):
    k, V = cfg.k, len(VIEWS)
    prompts = [policy.render(view(p["messages"], j % V)) for p in probes for j in range(k)]
    texts, _, _ = _sample(policy, prompts, cfg)
    scores = []
    for i in range(len(probes)):
        keys = [answer_key(texts[i * k + j]) for j in range(k)]
        scores += _agreement(keys, lambda j: [o for o in range(k) if o % V != j % V])
    return _grouped(probes, k, texts, scores)


def self_refinement(policy, probes, cfg: LabelConfig):
    k = cfg.k
    msgs = [p["messages"] for p in probes for _ in range(k)]
    drafts, _, _ = _sample(policy, [policy.render(m) for m in msgs], cfg)
    revise = [m + [{"role": "assistant", "content": d or "."}, {"role": "user", "content": REVISE}]
              for m, d in zip(msgs, drafts)]
    texts, ids, _ = _sample(policy, [policy.render(m) for m in revise], cfg)
    scores = _mean_logprob(policy, [policy.render(m) for m in msgs], ids, cfg)
    return _grouped(probes, k, texts, scores)


def self_rewarding(policy, probes, cfg: LabelConfig):
    import math

    k = cfg.k
    msgs = [p["messages"] for p in probes for _ in range(k)]
    texts, _, _ = _sample(policy, [policy.render(m) for m in msgs], cfg)
    judge = [policy.render(m + [{"role": "assistant", "content": t or "."}, {"role": "user", "content": JUDGE}])
             for m, t in zip(msgs, texts)]
    tok = policy.tokenizer
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    lp_yes = _mean_logprob(policy, judge, [[yes]] * len(judge), cfg)
    lp_no = _mean_logprob(policy, judge, [[no]] * len(judge), cfg)
    scores = [1.0 / (1.0 + math.exp(n - y)) for y, n in zip(lp_yes, lp_no)]
    return _grouped(probes, k, texts, scores)


LABELLERS = {
    "self_confidence": self_confidence,
    "diverse_decoding": diverse_decoding,
    "multi_view": multi_view,
    "self_refinement": self_refinement,
    "self_rewarding": self_rewarding,
    "k1": k1,
}
REGULARISERS = ("bct", "act")  # the existing methods of opct.methods, trained on the organism's consistency pairs
METHOD_NAMES = (*LABELLERS, *REGULARISERS)
