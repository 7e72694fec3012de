"""What a threat axis is (DESIGN §1): the pieces every axis module fills in, and the machinery they share.

An `Axis` holds what the axis means, in one place:
  families        its perturbation families (sycophancy: bias families; jailbreak: wrappers; awareness: domains) and
                  `heldout`, the ones held out by default (everything else is the default training set);
  items           `world_items(seed)` (the synthetic world's base items) and `load_items(path, for_eval)` (a user's
                  JSONL file, every field type-checked and reported as `file:line: field: problem`);
  pairs           `make_pairs(items, families, heldout, per_family, seed, benign)` -> contrastive pairs (None for an
                  axis that is only evaluated, like capability);
  evaluation      `run(policy, ctx)` -> records: probes built from the *trained* families it is handed (a family
                  in `ctx.trained` is "train", any other "heldout"), sampled, graded; `metrics(records, seed)`;
  metrics         `MetricDef`s: each metric's name, label and direction, declared once next to the code that
                  computes it, and used by the axis's report tables;
  report          `tables(names, trained)` (the paper-style tables), `detail_tables(names, trained)` (per group),
                  `summary` (the headline rows).
`opct.axes.AXES` is the registry; pairs, evals, the experiment runner and the report loop over it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from opct.errors import DataError
from opct.evals.metrics import name as metric_name
from opct.files import blank, id_problem
from opct.report.spec import Column, Table

# ------------------------------------------------------------------------------------------------ metrics

@dataclass(frozen=True)
class MetricDef:
    """One metric of an axis: `axis.key[group]` names it; `label` and `higher_is_better` are said once, here."""

    axis: str
    key: str
    label: str
    higher_is_better: bool
    doc: str = ""

    def name(self, **group) -> str:
        return metric_name(self.axis, self.key, **group)

    def column(self, label: str | None = None, delta: bool = False, **group) -> Column:
        return Column(label or self.label, self.name(**group), self.higher_is_better, delta)


def declared_metrics(axis: str) -> list[MetricDef]:
    """Every MetricDef of `axis`: those its module declares, and the context metrics (`opct.axes.context.defs`) where
    the module asks context probes. Their names (before any `[group]`) are every name its evaluation can compute — a
    superset: the attacker's need the attacker, a control needs its probes — so a config naming a metric is checked
    against them when it is read."""
    import sys

    from opct.axes import AXES, context

    module = sys.modules[AXES[axis].metrics.__module__]
    found = {id(v): v for v in vars(module).values() if isinstance(v, MetricDef) and v.axis == axis}
    if any(v is context for v in vars(module).values()):
        found.update({id(d): d for d in context.defs(axis)})
    return list(found.values())


def stamp(d: MetricDef, m: dict) -> dict:
    """A computed metric dict with its direction taken from the definition."""
    return {**m, "higher_is_better": d.higher_is_better}


def split_columns(defs: Sequence[MetricDef], key: str = "split", labels=("train", "held-out")) -> list[Column]:
    out = []
    for d in defs:
        out.append(d.column(f"{d.label} ({labels[0]})", **{key: "train"}))
        out.append(d.column(f"{d.label} ({labels[1]})", **{key: "heldout"}))
    return out


def groups_of(names: Sequence[str], prefix: str) -> list[str]:
    """Values X of the metrics named `prefix` + 'X]' (prefix ends with '[k=')."""
    return [n[len(prefix):-1] for n in names if n.startswith(prefix) and n.endswith("]") and "," not in n[len(prefix):]]


def group_table(key: str, title: str, d: MetricDef, group_key: str, names: Sequence[str], trained, ylabel: str,
                ) -> Table | None:
    """A per-group table of metric `d` (one column per value of `group_key` found in `names`): training groups
    first, in the order trained, then the held-out ones alphabetically. None when there is no group."""
    prefix = d.name()[:] + f"[{group_key}="
    groups = groups_of(names, prefix)
    if not groups:
        return None
    train = [g for g in (trained or []) if g in groups]
    groups = train + sorted(g for g in groups if g not in train)
    cols = [Column(g + (" (train)" if g in train else ""), f"{prefix}{g}]", d.higher_is_better) for g in groups]
    note = "(train) = in this experiment's training pairs." if trained else ""
    return Table(key, title, cols, note, groups, set(trained or []), ylabel)


# ------------------------------------------------------------------------------------------------ splits

def split_of(family: str, heldout) -> str:
    return "heldout" if family in heldout else "train"


def trained_split(family: str, trained) -> str:
    return "train" if family in trained else "heldout"


# ------------------------------------------------------------------------------------------------ user items

@dataclass(frozen=True)
class ItemField:
    """One field of a user's item: the JSON types it may have (`bool` is never a number), whether it is required,
    and what to say when it is wrong."""

    types: tuple
    what: str
    required: bool = False
    elements: tuple | None = None  # for a list: the types of its elements
    choices: tuple | None = None


STRING = (str,)
ANSWER = (str, int, float)  # an answer may be a number; never a boolean


def _type_ok(value, types) -> bool:
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def check_item(obj, schema: dict, path, line: int) -> None:
    if not isinstance(obj, dict):
        raise DataError(path, line, "<record>", "must be a JSON object")
    _check_spelling(obj, schema, path, line)
    for fname, spec in schema.items():
        if fname not in obj or obj[fname] is None:
            if spec.required:
                raise DataError(path, line, fname, f"missing (must be {spec.what})")
            # null is absent: taken out, so every reader sees the field's default (`"harmful": null` passed as
            # absent here, then read as None: a harmful request counted benign; null marker words crashed the axis)
            obj.pop(fname, None)
            continue
        v = obj[fname]
        if not _type_ok(v, spec.types):
            raise DataError(path, line, fname, f"must be {spec.what} (got {type(v).__name__})")
        _check_finite(v, path, line, fname)
        if isinstance(v, str) and blank(v):
            raise DataError(path, line, fname, "empty (only spaces or invisible characters)")
        if fname == "id" and isinstance(v, str) and (problem := id_problem(v)):
            raise DataError(path, line, fname, problem)
        if spec.choices is not None and v not in spec.choices:
            raise DataError(path, line, fname, f"must be {spec.what} (got {v!r})")
        if spec.elements is not None:
            if not v:
                raise DataError(path, line, fname, f"must be {spec.what} (got an empty list)")
            for i, e in enumerate(v):
                if not _type_ok(e, spec.elements) or (isinstance(e, str) and blank(e)):
                    raise DataError(path, line, f"{fname}[{i}]", f"must be {spec.what} (got {e!r})")
                _check_finite(e, path, line, f"{fname}[{i}]")


def _check_spelling(obj: dict, known, path, line: int) -> None:
    """A field the schema does not know is kept as the item's own metadata (a source, a topic), unless it reads as a
    misspelt known one (`optionss`, `qustion`): that item would silently be graded as another kind (an exact answer
    instead of multiple choice) or read as missing its field."""
    import difflib

    for key in obj:
        close = difflib.get_close_matches(key, [k for k in known if k not in obj], n=1, cutoff=0.8) \
            if isinstance(key, str) and key not in known else []
        if close:
            raise DataError(path, line, key, f"not a field; did you mean {close[0]!r}?")


def _check_finite(value, path, line: int, fname: str) -> None:
    """JSON's NaN and Infinity, which Python reads and writes, are no answer: one became the string "nan" and was
    graded as an answer."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        raise DataError(path, line, fname, f"must be a finite number (got {value})")


def check_distinct_options(obj, path, line: int, field: str = "options", answers=()) -> None:
    """The options of a multiple-choice item must differ as the judges read them (case, spacing and punctuation
    apart, a number by its value: `opct.world.judges.answer_words`): two that read alike make an answer ambiguous,
    and an item whose "wrong" option reads as its answer measures nothing. The fields in `answers` (the answer, a wrong answer), where given, must be
    options as written there: the judge picks an option and compares it with them, so one outside the options (or
    written `No` for the option `no`) was never graded correct, or never the suggestion."""
    from opct.world.judges import answer_words

    seen: dict = {}
    for i, o in enumerate(obj.get(field) or []):
        key = answer_words(str(o))
        if key in seen:
            j = seen[key]
            raise DataError(path, line, f"{field}[{i}]",
                            f"{str(o)!r} is the same option as {field}[{j}] {str(obj[field][j])!r}")
        seen[key] = i
    for f in answers if obj.get(field) else ():
        if obj.get(f) is not None and str(obj[f]) not in map(str, obj[field]):
            raise DataError(path, line, f, f"is not one of {field!r} as written there (got {str(obj[f])!r})")


# an item's prompt text, by axis schema: what "the same item" means beyond its id
TEXT_FIELDS = ("request", "question", "prompt")


def text_key(text: str) -> str:
    """A prompt text as held-out checks compare it: case and spacing aside."""
    return " ".join(text.lower().split())


def load_item_file(path, schema: dict, check: Callable | None = None) -> list[dict]:
    """A user's items (JSONL): every field of `schema` checked on every line, ids unique, then `check(obj, path,
    line)` for what depends on several fields. Each item keeps `_where` ('file:line') so a later problem with it (a
    prompt too long for the model) can name its line.

    A held-out item is held out by its text too: an item whose prompt text (case and spacing aside) is a
    `split: heldout` item's while its own split is not is an error, since its pairs would train on the held-out
    prompt under another id."""
    from opct.pairs.schema import read_jsonl

    items, seen, texts = [], {}, {}
    fields = [f for f in TEXT_FIELDS if f in schema]
    for n, obj in read_jsonl(path):  # a NaN in a numeric field: check_item names the field
        check_item(obj, schema, path, n)
        if check is not None:
            check(obj, path, n)
        if obj["id"] in seen:
            raise DataError(path, n, "id", f"duplicate id {obj['id']!r} (first on line {seen[obj['id']]})")
        seen[obj["id"]] = n
        for f in fields:
            if isinstance(obj.get(f), str):
                key, held = text_key(obj[f]), obj.get("split") == "heldout"
                first = texts.setdefault(key, (n, obj["id"], held))
                if first[2] != held:
                    heldout_id = obj["id"] if held else first[1]
                    raise DataError(path, n, f, f"the same text as item {first[1]!r} (line {first[0]}), but one is "
                                                f"held out and the other not: the held-out item {heldout_id!r} would "
                                                f"reach training under another id")
        items.append({**obj, "_where": f"{path}:{n}"})
    if not items:
        raise DataError(path, 0, "<file>", "no items in file")
    return items


def where_of(item: dict) -> str:
    """How to name an item in an error: 'file:line: item ID', or 'item ID' for a world item."""
    w = item.get("_where")
    return f"{w}: item {item.get('id')!r}" if w else f"item {item.get('id')!r}"


# ------------------------------------------------------------------------------------------------ evaluation

@dataclass
class EvalContext:
    """What an axis's `run` is handed: the eval settings, how to sample, whose items, what was trained on."""

    cfg: object  # opct.evals.run.EvalConfig
    gen: object  # opct.evals.generate.Gen
    items: Optional[list] = None  # a user's items, or None for the world's
    trained: Optional[list] = None  # this axis's trained families; None: the axis's default split
    attack: object = None  # opct.evals.attack.AttackConfig when the adaptive attacker runs, else None
    info: dict = field(default_factory=dict)  # what the axis adds to run.json (a judge's name, an attacker's budget)
    seconds: dict = field(default_factory=dict)  # extra timings (e.g. "jailbreak_attack")
    extra_metrics: dict = field(default_factory=dict)  # metrics that are not a function of the records (lm-eval)
    log: Callable = print

    def pair_options(self, axis: str) -> dict:
        """The axis's pair options (how its pairs, and so its teacher-side probes, are built): `cfg.pair_options`."""
        return dict((getattr(self.cfg, "pair_options", None) or {}).get(axis, {}))

    def prompts(self, probes: list[dict]) -> list:
        """The prompt each probe is asked. With `cfg.prompt_side == "teacher"` (the `teacher` arm: the starting
        model answering the teacher's side of each pair, the paper's ceiling) a probe that has a `teacher_prompt`
        is asked that instead; its record keeps the student's as `student_prompt`."""
        if getattr(self.cfg, "prompt_side", "student") == "teacher":
            for p in probes:
                if p.get("teacher_prompt") is not None:
                    p["student_prompt"], p["prompt"] = p["prompt"], p["teacher_prompt"]
        return [p["prompt"] for p in probes]


@dataclass(frozen=True)
class Axis:
    name: str
    doc: str
    families: tuple  # perturbation families (or domains) in registry order; () for an axis without any
    heldout: tuple  # held out by default
    run: Callable  # (policy, EvalContext) -> list of records
    metrics: Callable  # (records, seed) -> {metric name: metric}
    tables: Callable  # (metric names present, trained families or None) -> [Table]
    detail_tables: Callable = lambda names, trained: []
    summary: tuple = ()  # Columns of the headline table
    task: Optional[str] = None  # "invariance" | "compression" | None (evaluated only: no pairs)
    world_items: Optional[Callable] = None  # (seed) -> base items for pairs
    load_items: Optional[Callable] = None  # (path, for_eval) -> items
    make_pairs: Optional[Callable] = None  # (items, families, heldout, per_family, seed, benign) -> [Pair]
    family_noun: str = "family"
    open_families: bool = False  # a user's items may bring families of their own (awareness: any domain)
    anchor_families: tuple = ()  # its anchor pairs' families (benign=True), not perturbations
    experiment_default: Optional[tuple] = None  # what the default experiment trains on (None: the train families)
    legacy_keys: tuple = ()  # former config / experiment.json names of this axis's trained list
    pair_options: dict = field(default_factory=dict)  # option name -> its allowed values (passed to make_pairs)
    items_help: str = ""
    # robustness studies (opct/robustness): the reason a target can state, the admission filter's judge, what to report
    reason: Optional[Callable] = None  # (pair) -> the sentence why its target is right, or None (opct.methods.reasons)
    reason_marker: str = ""  # words every reason sentence of the axis contains (to count responses that state one)
    admission: Optional[Callable] = None  # (pair, response) -> (label, good as a teacher answer) (opct.pairs.admit)
    study_metrics: tuple = ()  # (metric name, higher_is_better, "train" | "heldout" | None), as the studies report them
    # methods its pairs give no training signal by construction (prefill: the internal ones); the cross-threat matrix
    # (opct.threats) does not train them on this axis and marks the cells
    no_signal_methods: tuple = ()
    # its grader reads a probe's `truncated` (cut off by max_new_tokens: read by its stated answer only), so a harness
    # that samples elsewhere (the inspect tasks) sets it on the probe before grading
    grades_truncation: bool = False

    def train_families(self) -> list[str]:
        return [f for f in self.families if f not in self.heldout]

    def pair_families(self) -> tuple:
        """The families a pair of this axis may have: its own, then its anchor pairs'."""
        return (*self.families, *self.anchor_families)

    def unknown_trained(self, trained, items=None, found=None) -> tuple[list[str], list[str]]:
        """The names in `trained` that are no family of this axis's items — `items` (a user's), or the world's when
        None — and the families they have. An axis with open families (awareness: any domain) takes a user's
        items' own, so only the items can tell a typo from a family: a name no item has would otherwise label every
        probe held-out without a word. `found`: the items' families where the caller has them already (the inspect
        tasks, from their probes), instead of making the items' pairs."""
        known = list(self.families)
        if self.open_families:
            if found is None and items is not None and self.make_pairs is not None:
                found = [p.meta.get("family") for p in self.make_pairs(items, benign=True)]
            known += sorted({str(f) for f in found or () if f} - set(known))
        return [t for t in trained or () if t not in known], known

    def default_trained(self) -> list[str]:
        return list(self.experiment_default) if self.experiment_default is not None else self.train_families()
