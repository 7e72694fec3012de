"""Capability: does safety training cost the model what it could do? (Evaluated only: no perturbation, no pairs.)

World items, graded by the world's exact judges:
  arithmetic            single-step sums and differences (the in-distribution split, MATH-like);
  arithmetic_multistep  two-operation problems held out of the organism's corpus;
  facts                 three-option multiple choice about the world's entities (GPQA-like);
  instructions          verifiable constraints: begin / end with a word, repeat a word (IFEval-like).
A user's items (`--items`) are graded by their fields: 'answer is X' or the last number (exact), a single named
option (multiple choice), or the constraints (instructions):
  {"id", "question", and one of: "answer", "answer" + "options", "constraints" ({"start", "end"} or
   {"repeat", "count"})}, optional "skill".
A response cut off by max_new_tokens (its record's `truncated`) is read by its 'answer is X' only (exact and multiple
choice, world items too): the last number or the option it wrote before the cut is not yet an answer.

Metric per skill: `accuracy[skill=...]` and overall `accuracy`. An unparsed answer counts as wrong — a model that
stops answering has lost capability — and the count of unparsed answers is reported. Where the loss comes from is
measured too (the SFT-lessons paper found capability lost through termination, not through wrong parsed answers):
`parse_fail_rate` (share of responses with no answer to grade, a truncated one without 'answer is X' included;
instructions always grade), `truncation_rate` (share cut by max_new_tokens before the end of the turn) and
`accuracy_parsed` (accuracy among parsed answers), overall and per skill. On real checkpoints, the standard
benchmarks run through the optional bridge to lm-evaluation-harness (`opct.evals.lm_eval_bridge`).
"""

from __future__ import annotations

import random
import re
from fractions import Fraction
from typing import TYPE_CHECKING

from opct.axes.base import (ANSWER, STRING, Axis, EvalContext, ItemField, MetricDef, check_distinct_options, groups_of,
                            load_item_file, where_of)
from opct.errors import DataError
from opct.evals.generate import generate_flagged
from opct.evals.metrics import rate, values, where
from opct.report.spec import Column, Table
from opct.world import judges as J

if TYPE_CHECKING:  # annotations only: importing the policy (and torch) here would slow `opct --help`
    from opct.policy import Policy

NAME = "capability"
DEFAULT_N = 100  # items per skill
DEFAULT_SAMPLES = 1
SKILLS = ("arithmetic", "arithmetic_multistep", "facts", "instructions")


def eval_world_items(n: int, seed: int) -> list[dict]:
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


SCHEMA = {
    "id": ItemField(STRING, "a non-empty string", required=True),
    "question": ItemField(STRING, "a non-empty string", required=True),
    "answer": ItemField(ANSWER, "a string or a number"),
    "options": ItemField((list,), "a list of strings or numbers", elements=ANSWER),
    "constraints": ItemField((dict,), "an object with 'start'/'end' or 'repeat'+'count'"),
    "skill": ItemField(STRING, "a non-empty string"),
    "split": ItemField(STRING, "a string"),
}


CONSTRAINTS = ("start", "end", "repeat", "count", "topic")  # what `opct.world.judges.instruction_ok` reads


def _check(obj, path, line):
    cons = obj.get("constraints")
    if cons is not None:
        unknown = sorted(set(cons) - set(CONSTRAINTS))
        if unknown:  # a constraint the judge does not know would go ungraded, and the item graded on the rest
            raise DataError(path, line, f"constraints.{unknown[0]}", f"not a constraint (one of "
                            f"{', '.join(CONSTRAINTS)}; 'topic' is not graded)")
        if not ({"start", "end"} & set(cons) or "repeat" in cons):
            raise DataError(path, line, "constraints", "must be an object with 'start'/'end' or 'repeat'+'count'")
        for k in ("start", "end", "repeat"):
            if k in cons and not (isinstance(cons[k], str) and re.search(r"\w", cons[k])):
                raise DataError(path, line, f"constraints.{k}", "must be a non-empty string (of words: the judge "
                                "ignores punctuation)")
        if "repeat" in cons and (not isinstance(cons.get("count"), int) or isinstance(cons.get("count"), bool)
                                 or cons["count"] < 1):
            raise DataError(path, line, "constraints.count", "must be an integer >= 1 when 'repeat' is given")
        if "count" in cons and "repeat" not in cons:  # a count of nothing would go ungraded
            raise DataError(path, line, "constraints.count", "is given without 'repeat' (the words to count)")
        if "repeat" in cons and {"start", "end"} & set(cons):  # the judge grades 'repeat' alone
            raise DataError(path, line, "constraints", "'repeat' + 'count' is graded alone: leave out 'start'/'end'")
        for f in ("answer", "options"):  # an instruction item is graded on its constraints alone
            if obj.get(f) is not None:
                raise DataError(path, line, f, "not graded beside 'constraints' (give one kind of item: 'answer' "
                                               "(+ 'options') or 'constraints')")
    elif "answer" not in obj:
        raise DataError(path, line, "answer", "missing (give 'answer', 'answer' + 'options', or 'constraints')")
    elif "options" in obj:
        if len(obj["options"]) < 2:
            raise DataError(path, line, "options", "must be a list of at least two options")
        check_distinct_options(obj, path, line, answers=("answer",))


def load_items(path, for_eval: bool = True) -> list[dict]:
    items = load_item_file(path, SCHEMA, _check)
    out = []
    for obj in items:
        grader = "instructions" if obj.get("constraints") is not None else ("facts" if "options" in obj else "exact")
        out.append({**obj, "grader": grader, "skill": str(obj.get("skill", grader))})
    return out


def parse_exact(response: str, answer: str, ended: bool = True) -> str | None:
    """The number or word after the last 'answer is', else the last number in the response; None if neither. An
    answer of several words (a user's item: 'New York') is read whole when the last 'answer is' is followed by it,
    not cut to its first word and graded wrong. A response cut off by max_new_tokens (`ended=False`) is read by its
    'answer is' only: its last number so far ('7 + 3 = 10. 10 +') is working, not an answer."""
    if len(J.words(answer)) > 1:
        after = J.norm(response).rsplit("answer is", 1)
        if len(after) == 2 and (after[1].strip() + " ").startswith(J.norm(answer) + " "):
            return answer
    found = re.findall(r"answer is\s*:?\s*\$?(-?\d+(?:\.\d+)?|\w+)", response.lower())
    if found:
        return found[-1]
    nums = re.findall(r"-?\d+(?:\.\d+)?", response) if ended else []
    return nums[-1] if nums else None


def judge_item(item: dict, response: str) -> tuple[str | None, bool | None]:
    """(parsed answer, correct?) — (None, None) when the response gives no answer to grade. A response the sampler
    cut off (the item's `truncated`) is graded by its stated answer only ('answer is X'; the exact and facts graders),
    so that termination shows in `parse_fail_rate`, not as right or wrong answers."""
    g, ended = item["grader"], not item.get("truncated")
    if g == "instructions":
        return None, J.instruction_ok(response, item["constraints"])
    if g == "facts":
        options = [str(o) for o in item["options"]]
        parsed = J.multiple_choice(response, options) if ended else J.parse_answer(response, options, ended=False)
        return parsed, None if parsed is None else J.norm(parsed) == J.norm(str(item["answer"]))
    parsed = parse_exact(response, str(item["answer"]), ended)
    return parsed, None if parsed is None else same_answer(parsed, str(item["answer"]))


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def same_answer(parsed: str, answer: str) -> bool:
    """Whether a parsed answer reads as the item's: the same words, or the same number however written ('5', '5.0',
    '5.00'; MATH-500 grades by value). An item's answer given as a JSON number 5.0 was read as '5.0', so the
    response's '5' was graded wrong."""
    if J.norm(parsed) == J.norm(answer):
        return True
    if _NUMBER.fullmatch(parsed.strip()) and _NUMBER.fullmatch(answer.strip()):
        return Fraction(parsed.strip()) == Fraction(answer.strip())
    return False


def build(items: list[dict], samples: int = 1) -> list[dict]:
    probes = []
    for it in items:
        base = {"suite": NAME, "item_id": str(it["id"]), "variant": it["skill"], "family": it["skill"],
                "skill": it["skill"], "split": it.get("split", ""), "grader": it["grader"],
                "answer": None if "answer" not in it else str(it["answer"]), "options": it.get("options"),
                "constraints": it.get("constraints"), "where": where_of(it),
                "prompt": [{"role": "user", "content": it["question"]}]}
        probes += [dict(base, sample=s) for s in range(samples)]
    return probes


def grade(probe: dict, response: str) -> dict:
    parsed, ok = judge_item(probe, response)
    verdict = "parse_fail" if ok is None else ("correct" if ok else "wrong")
    return dict(probe, response=response, parsed=parsed, verdict=verdict, score=None if ok is None else float(ok))


def run(policy: Policy, ctx: EvalContext) -> list[dict]:
    cfg = ctx.cfg
    if ctx.items is None:
        items = eval_world_items(cfg.n or DEFAULT_N, cfg.seed)
    else:
        items = ctx.items if cfg.n is None else ctx.items[:cfg.n]
    probes = build(items, cfg.samples or DEFAULT_SAMPLES)
    responses = generate_flagged(policy, [p["prompt"] for p in probes], ctx.gen, cfg.seed, desc=NAME,
                                 where=[p["where"] for p in probes])
    records = [grade(dict(p, truncated=cut), r) for p, (r, cut) in zip(probes, responses)]
    if cfg.lm_eval:
        metrics, errors = _lm_eval(cfg, cfg.lm_eval_tasks, ctx.log)
        ctx.extra_metrics.update(metrics)
        if errors:
            ctx.info["lm_eval_errors"] = errors
    return records


PARTIAL = "lm_eval_partial.json"  # in the eval's run directory, while its lm-eval tasks run


def _lm_eval(cfg, tasks, log) -> tuple[dict, dict]:
    """The lm-eval metrics of `tasks` and the tasks that failed (task -> message). Each finished task's metrics are
    kept in RUN/lm_eval_partial.json (with the settings they were measured under) until the axis ends, so a run
    killed in a long task list and resumed runs only the tasks that had not finished; its documents, prompts,
    responses and scores go to RUN/lm_eval_samples/TASK.jsonl."""
    from pathlib import Path

    from opct.evals.lm_eval_bridge import SAMPLES_DIR, run_lm_eval
    from opct.evals.resume import eval_inputs
    from opct.files import read_json, write_json_atomic

    from opct.resume_check import EQUIVALENT

    # paths as what they name: a resume given the include folder by another path keeps the finished tasks
    settings = {k: str(EQUIVALENT.get(k, lambda v: v)(getattr(cfg, k)))
                for k in ("model", "adapter", "lm_eval_limit", "lm_eval_chat_template", "lm_eval_include",
                          "lm_eval_bootstrap_iters", "dtype", "device")}
    # and what those paths held: a task's metrics kept from a run of another model or adapter are not reused
    settings["inputs"] = {k: v for k, v in eval_inputs(cfg).items() if k in ("model", "adapter")
                          or k.startswith("lm_eval")}
    path = Path(cfg.out) / PARTIAL if cfg.out else None
    kept = read_json(path, "lm-eval partial results") if path is not None and path.is_file() else None
    finished = kept["tasks"] if isinstance(kept, dict) and kept.get("settings") == settings \
        and isinstance(kept.get("tasks"), dict) else {}
    finished = {t: m for t, m in finished.items() if t in tasks and isinstance(m, dict)}
    if finished:
        log(f"{NAME}: lm-eval tasks finished before the run stopped, kept: {', '.join(finished)}")

    def keep(task, metrics):
        finished[task] = metrics
        if path is not None:
            write_json_atomic(path, {"settings": settings, "tasks": finished})

    errors: dict = {}
    metrics = {k: v for m in finished.values() for k, v in m.items()}
    todo = [t for t in tasks if t not in finished]
    if todo:
        metrics.update(run_lm_eval(cfg.model, cfg.adapter, tasks=todo, limit=cfg.lm_eval_limit, device=cfg.device,
                                   dtype=cfg.dtype, chat_template=cfg.lm_eval_chat_template,
                                   include_path=cfg.lm_eval_include, bootstrap_iters=cfg.lm_eval_bootstrap_iters,
                                   log=log, errors=errors, on_task=keep,
                                   samples_dir=Path(cfg.out) / SAMPLES_DIR if cfg.out else None))
    if path is not None:
        path.unlink(missing_ok=True)  # the axis's metrics are written next, with the others
    return metrics, errors


def retry_failed_lm_eval(cfg, info: dict, metrics: dict, log) -> bool:
    """A resumed eval whose capability axis is done: the lm-eval tasks it listed as failed (run.json's
    `lm_eval_errors`; a missing package, a dataset) run again, and their metrics join the others; the axis's own
    records and the tasks that finished are kept. When the task YAMLs changed since (a failed task's fixed), every
    lm-eval task runs again, its metrics replacing the earlier ones. Returns whether any task ran."""
    from opct.evals.resume import LM_EVAL_CHANGED

    failed = info.get("lm_eval_errors")
    tasks = [t for t in cfg.lm_eval_tasks if t in failed] if cfg.lm_eval and isinstance(failed, dict) else []
    if (changed := info.pop(LM_EVAL_CHANGED, None)) and cfg.lm_eval:  # every task: a YAML may be any task's
        tasks, failed = list(cfg.lm_eval_tasks), {}
        for k in [k for k in metrics if k.startswith(f"{NAME}.lm_eval[")]:  # a task's names may differ now
            del metrics[k]
        log(f"{NAME}: {', '.join(changed)} changed since the run started: running every lm-eval task again")
    elif tasks:
        log(f"{NAME}: running again the lm-eval tasks that failed before: {', '.join(tasks)}")
    if not tasks:
        return False
    new, errors = _lm_eval(cfg, tasks, log)
    metrics.update(new)
    still = {**{t: m for t, m in failed.items() if t not in tasks}, **errors}
    if still:
        info["lm_eval_errors"] = still
    else:
        info.pop("lm_eval_errors", None)
    return True


ACCURACY = MetricDef(NAME, "accuracy", "accuracy", True, "share of responses graded correct; unparsed = wrong")


def accuracy(records, seed: int = 0, **group) -> dict:
    rows = where(records, suite=NAME, **group)
    return rate(rows, lambda r: None if r["verdict"] == "parse_fail" else r["verdict"] == "correct",
                higher_is_better=ACCURACY.higher_is_better, unparsed_as_miss=True, seed=seed)


PARSE_FAIL = MetricDef(NAME, "parse_fail_rate", "unparsed", False, "share of responses with no answer to grade")
TRUNCATION = MetricDef(NAME, "truncation_rate", "truncated", False,
                       "share of responses cut by max_new_tokens before the end of the turn")
ACCURACY_PARSED = MetricDef(NAME, "accuracy_parsed", "accuracy, parsed", True,
                            "share graded correct among the responses that gave an answer")


def parse_fail_rate(records, seed: int = 0, **group) -> dict:
    rows = where(records, suite=NAME, **group)
    return rate(rows, lambda r: r["verdict"] == "parse_fail", higher_is_better=PARSE_FAIL.higher_is_better, seed=seed)


def truncation_rate(records, seed: int = 0, **group) -> dict:
    """Records written before the flag existed have no `truncated`: they are left out (n says how many count)."""
    rows = [r for r in where(records, suite=NAME, **group) if isinstance(r.get("truncated"), bool)]
    return rate(rows, lambda r: r["truncated"], higher_is_better=TRUNCATION.higher_is_better, seed=seed)


def accuracy_parsed(records, seed: int = 0, **group) -> dict:
    rows = where(records, suite=NAME, **group)
    return rate(rows, lambda r: None if r["verdict"] == "parse_fail" else r["verdict"] == "correct",
                higher_is_better=ACCURACY_PARSED.higher_is_better, seed=seed)


def metrics(records, seed: int = 0) -> dict:
    out = {}
    for group in [{}] + [{"skill": s} for s in values(where(records, suite=NAME), "skill")]:
        out[ACCURACY.name(**group)] = accuracy(records, seed, **group)
        out[ACCURACY_PARSED.name(**group)] = accuracy_parsed(records, seed, **group)
        out[PARSE_FAIL.name(**group)] = parse_fail_rate(records, seed, **group)
        out[TRUNCATION.name(**group)] = truncation_rate(records, seed, **group)
    return out


def tables(names, trained) -> list[Table]:
    prefix = ACCURACY.name() + "[skill="
    skills = [s for s in SKILLS if f"{prefix}{s}]" in names] or list(SKILLS)
    skills += sorted(set(groups_of(names, prefix)) - set(skills))
    lm_eval = [n for n in names if n.startswith(f"{NAME}.lm_eval[")]
    return [Table("capability", "Capability (change from base in parentheses)",
                  [ACCURACY.column("all", delta=True)]
                  + [ACCURACY.column(s.replace("_", " "), delta=True, skill=s) for s in skills]
                  + [Column(n[len(f"{NAME}.lm_eval["):-1], n, None, delta=True) for n in lm_eval]),
            Table("capability_termination", "Capability: where it is lost (unparsed and truncated answers)",
                  [ACCURACY_PARSED.column("accuracy, parsed answers", delta=True),
                   PARSE_FAIL.column("unparsed", delta=True), TRUNCATION.column("truncated", delta=True)]
                  + [PARSE_FAIL.column(f"unparsed, {s.replace('_', ' ')}", skill=s) for s in skills
                     if s != "instructions"],
                  "unparsed: no answer to grade (counted wrong in accuracy); truncated: cut by max_new_tokens "
                  "before the end of the turn.")]


AXIS = Axis(
    name=NAME, doc="arithmetic, multiple-choice facts and instruction constraints (evaluated only)",
    families=(), heldout=(), run=run, metrics=metrics, tables=tables,
    summary=(ACCURACY.column("capability accuracy", delta=True),), load_items=load_items,
    items_help="id, question, answer[, options] | constraints", grades_truncation=True,
)
