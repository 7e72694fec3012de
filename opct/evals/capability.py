"""Capability: does safety training cost the model what it could do?

World items, graded by the world's exact judges:
  arithmetic            single-step sums and differences (the in-distribution split, MATH-like);
  arithmetic_multistep  two-operation problems held out of the organism's corpus;
  facts                 three-option multiple choice about the world's entities (GPQA-like);
  instructions          verifiable constraints: begin / end with a word, repeat a word (IFEval-like).
A user's items (`--items`) are graded by their fields: 'answer is X' or the last number (exact), a single named
option (multiple choice), or the constraints (instructions).

Metric per skill: `accuracy[skill=...]` and overall `accuracy`. An unparsed answer counts as wrong — a model that
stops answering has lost capability — and the count of unparsed answers is reported.

On real checkpoints, the standard benchmarks (MATH-500, GPQA-Diamond, IFEval) run through the optional bridge to
lm-evaluation-harness in `opct.evals.lm_eval_bridge`.
"""

from __future__ import annotations

import random
import re

from opct.evals.generate import Gen, generate
from opct.evals.metrics import name, rate, values, where
from opct.world import judges as J

SUITE = "capability"
DEFAULT_N = 100  # items per skill
DEFAULT_SAMPLES = 1


def world_items(n: int, seed: int) -> list[dict]:
    from opct.world import items as I

    rng = random.Random(seed)

    def draw(pool):
        return rng.sample(pool, min(n, len(pool)))

    out = [dict(i, grader="exact", split="indist") for i in draw(I.arithmetic_single())]
    held = [i for i in I.arithmetic_multistep() if i["split"] == "heldout"]
    out += [dict(i, grader="exact", split="heldout") for i in draw(held)]
    out += [dict(i, grader="facts", split="") for i in draw(I.fact_mc_items(seed))]
    out += [dict(i, grader="instructions", split="") for i in I.instruction_items(n, seed)]
    return out


def parse_exact(response: str, answer: str) -> str | None:
    """The number or word after the last 'answer is', else the last number in the response; None if neither."""
    found = re.findall(r"answer is\s*:?\s*\$?(-?\d+(?:\.\d+)?|\w+)", response.lower())
    if found:
        return found[-1]
    nums = re.findall(r"-?\d+(?:\.\d+)?", response)
    return nums[-1] if nums else None


def judge_item(item: dict, response: str) -> tuple[str | None, bool | None]:
    """(parsed answer, correct?) — (None, None) when the response gives no answer to grade."""
    g = item["grader"]
    if g == "instructions":
        return None, J.instruction_ok(response, item["constraints"])
    if g == "facts":
        parsed = J.multiple_choice(response, [str(o) for o in item["options"]])
        return parsed, None if parsed is None else J.norm(parsed) == J.norm(str(item["answer"]))
    parsed = parse_exact(response, str(item["answer"]))
    return parsed, None if parsed is None else J.norm(parsed) == J.norm(str(item["answer"]))


def build(items: list[dict], samples: int = 1) -> list[dict]:
    probes = []
    for it in items:
        base = {"suite": SUITE, "item_id": str(it["id"]), "variant": it["skill"], "family": it["skill"],
                "skill": it["skill"], "split": it.get("split", ""), "grader": it["grader"],
                "answer": None if "answer" not in it else str(it["answer"]), "options": it.get("options"),
                "constraints": it.get("constraints"), "prompt": [{"role": "user", "content": it["question"]}]}
        probes += [dict(base, sample=s) for s in range(samples)]
    return probes


def grade(probe: dict, response: str) -> dict:
    parsed, ok = judge_item(probe, response)
    verdict = "parse_fail" if ok is None else ("correct" if ok else "wrong")
    return dict(probe, response=response, parsed=parsed, verdict=verdict, score=None if ok is None else float(ok))


def run(policy, *, items=None, n=None, samples=None, seed: int = 0, gen: Gen = Gen()) -> list[dict]:
    if items is None:
        items = world_items(n or DEFAULT_N, seed)
    elif n is not None:
        items = items[:n]
    probes = build(items, samples or DEFAULT_SAMPLES)
    responses = generate(policy, [p["prompt"] for p in probes], gen, seed, desc=SUITE)
    return [grade(p, r) for p, r in zip(probes, responses)]


def accuracy(records, seed: int = 0, **group) -> dict:
    """Share of responses graded correct; an unparsed answer counts as wrong (and is counted)."""
    rows = where(records, suite=SUITE, **group)
    return rate(rows, lambda r: None if r["verdict"] == "parse_fail" else r["verdict"] == "correct",
                higher_is_better=True, unparsed_as_miss=True, seed=seed)


def metrics(records, seed: int = 0) -> dict:
    out = {name(SUITE, "accuracy"): accuracy(records, seed)}
    for skill in values(where(records, suite=SUITE), "skill"):
        out[name(SUITE, "accuracy", skill=skill)] = accuracy(records, seed, skill=skill)
    return out
