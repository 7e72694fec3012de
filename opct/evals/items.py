"""Where a suite's items come from: the synthetic world by default, or a user's JSONL file (`--items FILE`).

A user's items use the same fields as `opct pairs make --items` (validated by `opct.pairs.make.load_items`), plus
what grading needs. Every problem is reported as `file:line: field: problem`.

  sycophancy  {"id", "question", "answer", "wrong_answer" | "options": [...]}
  jailbreak   {"id", "request", "harmful": true|false (default true), "category", "split"}
  awareness   {"id", "prompt", "fact", "keyword": str | [str, ...], "hazard": true|false (default true),
               "domain", "split"}       -- a hazard response passes if it warns (or refuses) and names a keyword
  capability  {"id", "question", and one of: "answer" (graded on 'the answer is X' or the last number),
               "answer" + "options" (multiple choice), "constraints" ({"start", "end"} or {"repeat", "count"})}

"split" (optional, "train" or "heldout") says whether the item's family or domain was trained on; metrics are split
by it.
"""

from __future__ import annotations

from opct.errors import DataError
from opct.pairs.schema import read_jsonl

SPLITS = ("train", "heldout")


def _check_optional(path, line, obj, field, typ, what):
    if field in obj and not isinstance(obj[field], typ):
        raise DataError(path, line, field, f"must be {what}")


def load_eval_items(path, suite: str) -> list[dict]:
    """Validate and load a user's items for `suite`."""
    if suite in ("sycophancy", "jailbreak", "awareness"):
        from opct.pairs.make import load_items

        items = load_items(path, suite)  # required fields, types, duplicate ids, with line numbers
        lines = [n for n, _ in read_jsonl(path)]
    elif suite == "capability":
        items, lines = _load_capability(path)
    else:
        raise DataError(path, 0, "<file>", f"--items applies to one suite, not {suite!r}")
    for n, obj in zip(lines, items):
        _check_optional(path, n, obj, "split", str, "'train' or 'heldout'")
        if "split" in obj and obj["split"] not in SPLITS:
            raise DataError(path, n, "split", f"must be 'train' or 'heldout' (got {obj['split']!r})")
        if suite == "jailbreak":
            _check_optional(path, n, obj, "harmful", bool, "true or false")
            _check_optional(path, n, obj, "category", str, "a string")
        if suite == "awareness":
            _check_optional(path, n, obj, "hazard", bool, "true or false")
            _check_optional(path, n, obj, "domain", str, "a string")
            kw = obj.get("keyword")
            if kw is None:
                raise DataError(path, n, "keyword", "missing (a hazard answer passes when it warns and names it)")
            kws = [kw] if isinstance(kw, str) else kw
            if not isinstance(kws, list) or not kws or not all(isinstance(k, str) and k.strip() for k in kws):
                raise DataError(path, n, "keyword", "must be a non-empty string or a list of them")
        if suite == "sycophancy" and "options" in obj:
            opts = obj["options"]
            if not isinstance(opts, list) or not all(isinstance(o, (str, int, float)) for o in opts):
                raise DataError(path, n, "options", "must be a list of strings or numbers")
    return items


def _load_capability(path):
    items, lines, seen = [], [], {}
    for n, obj in read_jsonl(path):
        if not isinstance(obj, dict):
            raise DataError(path, n, "<record>", "must be a JSON object")
        for f in ("id", "question"):
            if not isinstance(obj.get(f), str) or not obj[f].strip():
                raise DataError(path, n, f, "missing or not a non-empty string")
        if obj["id"] in seen:
            raise DataError(path, n, "id", f"duplicate id {obj['id']!r} (first on line {seen[obj['id']]})")
        seen[obj["id"]] = n
        cons = obj.get("constraints")
        if cons is not None:
            if not isinstance(cons, dict) or not ({"start", "end"} & set(cons) or "repeat" in cons):
                raise DataError(path, n, "constraints", "must be an object with 'start'/'end' or 'repeat'+'count'")
            if "repeat" in cons and not isinstance(cons.get("count"), int):
                raise DataError(path, n, "constraints.count", "must be an integer when 'repeat' is given")
            grader = "instructions"
        elif "answer" in obj:
            if not isinstance(obj["answer"], (str, int, float)) or isinstance(obj["answer"], bool):
                raise DataError(path, n, "answer", "must be a string or a number")
            if "options" in obj:
                opts = obj["options"]
                if not isinstance(opts, list) or len(opts) < 2:
                    raise DataError(path, n, "options", "must be a list of at least two options")
                if str(obj["answer"]) not in [str(o) for o in opts]:
                    raise DataError(path, n, "answer", "is not one of 'options'")
                grader = "facts"
            else:
                grader = "exact"
        else:
            raise DataError(path, n, "answer", "missing (give 'answer', 'answer' + 'options', or 'constraints')")
        items.append({**obj, "grader": grader, "skill": str(obj.get("skill", grader))})
        lines.append(n)
    if not items:
        raise DataError(path, 0, "<file>", "no items in file")
    return items, lines
