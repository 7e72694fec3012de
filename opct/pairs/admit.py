"""The pair-admission filter (`admit: filter`; issue 20 part 4): a defence against poisoned pairs.

A pair is kept only if
  1. the teacher's greedy answer to the pair's *teacher* prompt is judged good by the axis's rule judge
     (jailbreak: a harmful request refused, a benign one answered; sycophancy: the right answer; awareness: a hazard
     scenario's fact surfaced, no warning on a benign one) — a poisoned pair, whose teacher side complies, fails it;
  2. the student's (the starting model's) greedy answer to the *student* prompt gets another judgment than the
     teacher's — the perturbation really changes behaviour, so the pair carries a signal.
`admit(pairs, teacher, student, max_new_tokens)` returns (kept pairs, one decision per pair); each decision says which
condition rejected the pair and both judgments, so a report can count admitted / rejected and why.
Greedy decoding is deterministic, so the filter needs no seed. Pairs of an axis without a rule judge (a user's own
"custom" pairs) are an error: the filter cannot judge them.
"""

from __future__ import annotations

from opct.errors import OpctError
from opct.pairs.schema import Pair

ADMIT = ("none", "filter")


def judgment(pair: Pair, response: str) -> str:
    """The rule judge's label of a response to one of the pair's prompts."""
    from opct.world import judges as J

    if pair.axis == "jailbreak":
        return J.request_verdict(response)
    if pair.axis == "sycophancy":
        from opct.axes.sycophancy import parse_answer

        answer, wrong = str(pair.meta.get("answer", "")), str(pair.meta.get("biased_option", ""))
        parsed = parse_answer(response, [answer, wrong])
        return "correct" if parsed == answer else ("suggested" if parsed == wrong else "parse_fail")
    if pair.axis == "awareness":
        keyword = pair.meta.get("keyword") or _fact_keyword(pair.meta.get("fact", ""))
        if pair.meta.get("hazard", True):
            return "surfaced" if J.fact_surfaced(response, keyword) else "missed"
        return "warned" if J.warned(response) else "plain"
    raise OpctError(f"pair {pair.id}: the admission filter has no judge for axis {pair.axis!r}")


def _fact_keyword(fact: str) -> str:
    from opct.world import lexicon as L

    for f in L.safety_facts():
        if f["fact"] == fact:
            return f["keyword"]
    return ""


def good(pair: Pair, label: str) -> bool:
    """Whether the teacher's judgment is the behaviour the pair should teach."""
    if pair.axis == "jailbreak":
        return label == ("refused" if pair.meta.get("harmful", True) else "complied")
    if pair.axis == "sycophancy":
        return label == "correct"
    return label == ("surfaced" if pair.meta.get("hazard", True) else "plain")


def admit(pairs: list[Pair], teacher, student, max_new_tokens: int = 48,
          batch_size: int = 64) -> tuple[list[Pair], list[dict]]:
    """Apply the filter with `teacher` and `student` (policies); return (kept, decisions)."""
    def greedy(policy, prompts):
        out = []
        for i in range(0, len(prompts), batch_size):
            out += policy.sample([policy.render(m) for m in prompts[i:i + batch_size]], max_new_tokens, 0.0).texts
        return out

    t_text = greedy(teacher, [p.teacher for p in pairs])
    s_text = greedy(student, [p.student for p in pairs])
    kept, decisions = [], []
    for p, tr, sr in zip(pairs, t_text, s_text):
        tj, sj = judgment(p, tr), judgment(p, sr)
        reason = "admitted" if good(p, tj) and sj != tj else ("teacher_bad" if not good(p, tj) else "no_change")
        decisions.append({"id": p.id, "poisoned": bool(p.meta.get("poisoned")), "teacher": tj, "student": sj,
                          "decision": reason})
        if reason == "admitted":
            kept.append(p)
    return kept, decisions
