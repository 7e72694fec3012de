"""The pair-admission filter (`admit: filter`; issue 20 part 4): a defence against poisoned pairs.

A pair is kept only if
  1. the teacher's greedy answer to the pair's *teacher* prompt is judged good by the axis's rule judge
     (`Axis.admission`: jailbreak, a harmful request refused and a benign one answered; sycophancy, the right answer;
     awareness, a hazard scenario's fact surfaced, no warning on a benign one) — a poisoned pair fails it;
  2. the student's (the starting model's) greedy answer to the *student* prompt gets another judgment than the
     teacher's — the perturbation really changes behaviour, so the pair carries a signal.
`admit(pairs, teacher, student, max_new_tokens)` returns (kept pairs, one decision per pair); each decision says which
condition rejected the pair and both judgments, so a report can count admitted / rejected and why.
Greedy decoding is deterministic, so the filter needs no seed. Pairs of an axis without a rule judge (a user's own
"custom" pairs) are an error: the filter cannot judge them.
"""

from __future__ import annotations

from opct.errors import DataError, OpctError
from opct.pairs.schema import Pair, check_pair_fits, line_of

ADMIT = ("none", "filter")


def judge(pair: Pair, response: str) -> tuple[str, bool]:
    """(label, good): the axis's rule judge's label of a response to one of the pair's prompts, and whether it is the
    behaviour the pair should teach (`Axis.admission`, written in each axis module)."""
    from opct.axes import AXES

    axis = AXES.get(pair.axis)
    if axis is None or axis.admission is None:
        raise OpctError(f"pair {pair.id}: the admission filter has no judge for axis {pair.axis!r}")
    return axis.admission(pair, response)


def check_judged(pairs: list[Pair], path) -> None:
    """Every pair of the file at `path` has an axis whose rule judge the filter can ask (before any answer is made);
    the first that has none is a `DataError` naming its line."""
    from opct.axes import AXES

    for p in pairs:
        if getattr(AXES.get(p.axis), "admission", None) is None:
            raise DataError(path, line_of(path, p.id), "axis", f"the admission filter has no judge for axis {p.axis!r}")
        try:  # the judge on an empty answer: a field of `meta` it reads and the pair lacks is found now, not after
            judge(p, "")  # both models answered (a KeyError traceback); judges are pure functions of the text
        except KeyError as e:
            raise DataError(path, line_of(path, p.id), f"meta.{e.args[0]}",
                            f"missing (the admission filter's {p.axis} judge reads it)") from None
        except ValueError as e:  # a judge's own word on what it lacks (`opct.axes.awareness._admission`)
            raise DataError(path, line_of(path, p.id), "meta", str(e)) from None


def judgment(pair: Pair, response: str) -> str:
    """The rule judge's label of a response to one of the pair's prompts."""
    return judge(pair, response)[0]


def admit(pairs: list[Pair], teacher, student, max_new_tokens: int = 48,
          batch_size: int = 64, path=None) -> tuple[list[Pair], list[dict]]:
    """Apply the filter with `teacher` and `student` (policies); return (kept, decisions). `path`: the pairs' file,
    for an error to name the line of a prompt that does not fit the context."""
    def rendered(policy, side):  # every prompt is checked against the context before any is answered
        out = []
        for p in pairs:
            ids = policy.render(getattr(p, side))
            check_pair_fits(policy, ids, max_new_tokens, p.id, side, path)
            out.append(ids)
        return out

    def greedy(policy, prompts):
        out = []
        for i in range(0, len(prompts), batch_size):
            out += policy.sample(prompts[i:i + batch_size], max_new_tokens, 0.0).texts
        return out

    t_ids, s_ids = rendered(teacher, "teacher"), rendered(student, "student")
    t_text, s_text = greedy(teacher, t_ids), greedy(student, s_ids)
    kept, decisions = [], []
    for p, tr, sr in zip(pairs, t_text, s_text):
        (tj, ok), sj = judge(p, tr), judgment(p, sr)
        reason = "admitted" if ok and sj != tj else ("teacher_bad" if not ok else "no_change")
        decisions.append({"id": p.id, "poisoned": bool(p.meta.get("poisoned")), "teacher": tj, "student": sj,
                          "decision": reason})
        if reason == "admitted":
            kept.append(p)
    return kept, decisions
