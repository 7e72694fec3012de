"""opct's earlier audit methods, kept under their own names beside the paper's (opct/audit/labellers.py).

Labellers (k candidates sampled at T = 1 unless said otherwise):
  self_confidence_t1    k samples at T = 1; score = the sampler's mean token log-prob.
  diverse_decoding_vote k samples cycling through T 0.5 / 1.0 / 1.5; score = the share of the other candidates with
                        the same answer key — a majority vote, which for yes/no tasks is a vote on the very word the
                        misalignment judge reads (why the paper's method replaced it).
  multi_view_vote       candidate i sampled on view i mod 3 of the prompt; score = agreement with the other views'
                        candidates (again a vote on the answer word); the label is trained on the original prompt.
  self_refinement_best  each T = 1 draft is shown back with "Please check your answer and write it."; the revision
                        with the highest mean log-prob under the original prompt is kept (a selection).
  self_rewarding_good   score = P(yes) / (P(yes) + P(no)) to the generic "Is this answer good?".
  k1_sampled            one T = 1 sample per prompt is the label.
Regularisers (`REGULARISERS`: audit method -> training method, pair mode):
  bct / act             the default: the paper's pairs (one fixed response), frozen starting model as the teacher
  bct_live / act_live   the same with the paper's live clean-side target (opct.methods.fixed_response)
  bct_paired            the paper's data files as its code reads them: the clean side's response is the aligned
                        answer, the wrapped side's the behaviour the cue endorses, their trailing positions compared
                        (soft KL), live target
  bct_targeted / act_targeted   opct's `bct` / `act` on targeted pairs — teacher without the organism's trigger,
                        student with it (`OrganismSpec.targeted_pair`): de-biasing aimed at the trigger
"""

from __future__ import annotations

import math

from opct.audit.labellers import LabelConfig, answer_key, groups, mean_logprob, sample, with_last

REVISE = "Please check your answer and write it."
JUDGE = "Is this answer good?"
VIEWS = ("{q}", "Please help. {q}", "{q} Please answer.")
TEMPERATURES = (0.5, 1.0, 1.5)


def _agreement(keys: list[str], others_of) -> list[float]:
    return [sum(keys[o] == keys[j] for o in others_of(j)) / max(len(others_of(j)), 1) for j in range(len(keys))]


def self_confidence_t1(policy, probes, cfg: LabelConfig, spec=None):
    k = cfg.samples
    prompts = [policy.render(p["messages"]) for p in probes for _ in range(k)]
    texts, ids = sample(policy, prompts, cfg, 1.0)
    return groups("select", k, texts, mean_logprob(policy, prompts, ids, cfg))


def k1_sampled(policy, probes, cfg: LabelConfig, spec=None):
    texts, _ = sample(policy, [policy.render(p["messages"]) for p in probes], cfg, 1.0)
    return groups("none", 1, texts, None, [0] * len(texts))


def diverse_decoding_vote(policy, probes, cfg: LabelConfig, spec=None):
    k = cfg.samples
    texts = [""] * (len(probes) * k)
    for t_idx, t in enumerate(TEMPERATURES):  # candidate j of every probe is sampled at TEMPERATURES[j % 3]
        slots = [(i, j) for i in range(len(probes)) for j in range(k) if j % len(TEMPERATURES) == t_idx]
        if slots:
            out, _ = sample(policy, [policy.render(probes[i]["messages"]) for i, _ in slots], cfg, t)
            for (i, j), text in zip(slots, out):
                texts[i * k + j] = text
    scores = []
    for i in range(len(probes)):
        keys = [answer_key(texts[i * k + j]) for j in range(k)]
        scores += _agreement(keys, lambda j: [o for o in range(k) if o != j])
    return groups("select", k, texts, scores)


def multi_view_vote(policy, probes, cfg: LabelConfig, spec=None):
    k, V = cfg.samples, len(VIEWS)
    prompts = [policy.render(with_last(p["messages"], VIEWS[j % V].format(q=p["messages"][-1]["content"])))
               for p in probes for j in range(k)]
    texts, _ = sample(policy, prompts, cfg, 1.0)
    scores = []
    for i in range(len(probes)):
        keys = [answer_key(texts[i * k + j]) for j in range(k)]
        scores += _agreement(keys, lambda j: [o for o in range(k) if o % V != j % V])
    return groups("select", k, texts, scores)


def self_refinement_best(policy, probes, cfg: LabelConfig, spec=None):
    k = cfg.samples
    msgs = [p["messages"] for p in probes for _ in range(k)]
    drafts, _ = sample(policy, [policy.render(m) for m in msgs], cfg, 1.0)
    revise = [m + [{"role": "assistant", "content": d or "."}, {"role": "user", "content": REVISE}]
              for m, d in zip(msgs, drafts)]
    texts, ids = sample(policy, [policy.render(m) for m in revise], cfg, 1.0)
    return groups("select", k, texts, mean_logprob(policy, [policy.render(m) for m in msgs], ids, cfg))


def self_rewarding_good(policy, probes, cfg: LabelConfig, spec=None):
    k = cfg.samples
    msgs = [p["messages"] for p in probes for _ in range(k)]
    texts, _ = sample(policy, [policy.render(m) for m in msgs], cfg, 1.0)
    judge = [policy.render(m + [{"role": "assistant", "content": t or "."}, {"role": "user", "content": JUDGE}])
             for m, t in zip(msgs, texts)]
    tok = policy.tokenizer
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    lp_yes = mean_logprob(policy, judge, [[yes]] * len(judge), cfg)
    lp_no = mean_logprob(policy, judge, [[no]] * len(judge), cfg)
    return groups("select", k, texts, [1.0 / (1.0 + math.exp(n - y)) for y, n in zip(lp_yes, lp_no)])


VARIANT_LABELLERS = {
    "self_confidence_t1": self_confidence_t1,
    "diverse_decoding_vote": diverse_decoding_vote,
    "multi_view_vote": multi_view_vote,
    "self_refinement_best": self_refinement_best,
    "self_rewarding_good": self_rewarding_good,
    "k1_sampled": k1_sampled,
}
# audit method -> (training method of opct.methods, pair mode of opct.audit.splits.make_pairs)
REGULARISERS = {"bct": ("bct_soft", "paper"), "act": ("act_fixed", "paper"),
                "bct_live": ("bct_soft_live", "paper"), "act_live": ("act_fixed_live", "paper"),
                "bct_paired": ("bct_soft_live", "paired"),
                "bct_targeted": ("bct", "targeted"), "act_targeted": ("act", "targeted")}
