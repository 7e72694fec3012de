"""How each axis's probes are built and graded for its inspect task (opct.inspect): the same calls `opct eval`'s
`run` makes for the axis, with the task's arguments (`params`, checked by opct.inspect) in place of `EvalConfig`.
A plug-in axis registers its own with `register_adapter`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from opct.axes import awareness as AW
from opct.axes import capability as CAP
from opct.axes import conditional as CM
from opct.axes import frustration as FR
from opct.axes import jailbreak as JB
from opct.axes import persona as PE
from opct.axes import prefill as PF
from opct.axes import sycophancy as SY
from opct.errors import OpctError
from opct.inspect.conversation import frustration_solver

DEFAULT_N = 100  # as opct eval's --n


@dataclass(frozen=True)
class Adapter:
    """How one axis's probes are built (`probes(params) -> [probe]`) and graded (`grade(params)` -> a grader
    `(probes, responses) -> records`), outside `opct eval`'s loop. A probe's `prompt` is its sample's input. A
    multi-turn axis also has a `solver(params, max_tokens, temperature) -> Solver`: its probe is a conversation's
    start (`messages`, the sample's input), which the solver plays to its end, leaving the finished conversation in
    `state.metadata["conversation"]`; the grader is handed that instead of the probe."""

    probes: Callable
    grade: Callable
    solver: Callable | None = None


ADAPTERS: dict[str, Adapter] = {}


def register_adapter(axis: str, probes: Callable, grade: Callable, solver: Callable | None = None) -> None:
    ADAPTERS[axis] = Adapter(probes, grade, solver)


# ------------------------------------------------------------------------------------------------ adapters

def _items(axis, params, world):
    """The user's items (checked, capped at n) or the world's."""
    if params["items"]:
        items = axis.load_items(params["items"], for_eval=True)
        return items if params["n"] is None else items[:params["n"]]
    return world()


def _context(make, axis: str, items: list, p: dict) -> list[dict]:
    """The axis's context-blindness probes (opct.axes.context), asked as `opct eval` asks them: on world items, by
    the student side only."""
    if p["items"] or p["prompt_side"] == "teacher":
        return []
    return make(axis, items, p["seed"])


def _sycophancy_probes(p):
    from opct.axes import context as C

    items = _items(SY.AXIS, p, lambda: SY.eval_world_items(p["n"] or DEFAULT_N, p["seed"]))
    return SY.build(items, p["trained"], p["samples"] or 1, p["seed"]) + \
        _context(C.sycophancy_probes, SY.NAME, items, p)


def _jailbreak_probes(p):
    from opct.axes import context as C

    if p["items"]:
        items = JB.load_items(p["items"], for_eval=True)
        items = items if p["n"] is None else JB.cap_items(items, p["n"])
    else:
        items = JB.eval_world_items(p["n"] or DEFAULT_N, p["seed"])
    return JB.build(items, p["trained"], p["samples"] or JB.DEFAULT_SAMPLES, p["seed"]) + \
        _context(C.jailbreak_probes, JB.NAME, items, p)


def _judged(grade):
    """A grader `grade(probes, responses, judge)` with the judge `opct eval --judge auto` picks: the world's rules on
    world items, refusal prefixes on a user's."""
    def make(p):
        from opct.evals.judges import make_judge

        judge = make_judge("refusal" if p["items"] else "world")
        return lambda probes, responses: grade(probes, responses, judge)
    return make


def _prefill_probes(p):
    """Every request direct and with each prefill (the jailbreak axis's items), then the context probes: as
    `prefill.run`. A prefilled prompt ends with the assistant message its response continues (`opct.inspect`'s
    `continuing_generate` makes sure the model's provider continues it)."""
    if p["items"]:
        items = PF.load_items(p["items"], for_eval=True)
        items = items if p["n"] is None else JB.cap_items(items, p["n"])
    else:
        items = JB.eval_world_items(p["n"] or DEFAULT_N, p["seed"])
    return PF.build(items, p["trained"], p["samples"] or PF.DEFAULT_SAMPLES) + \
        _context(PF.context_probes, PF.NAME, items, p)


def _awareness_probes(p):
    if p["items"]:
        items = AW.cap_facts(AW.load_items(p["items"], for_eval=True), p["n"], p["seed"])
    else:
        items = AW.eval_world_items(p["n"] or DEFAULT_N, p["seed"])
    return AW.build(items, p["trained"], p["samples"] or AW.DEFAULT_SAMPLES) + \
        _context(AW.context_probes, AW.NAME, items, p)


def _capability_probes(p):
    items = _items(CAP.AXIS, p, lambda: CAP.eval_world_items(p["n"] or CAP.DEFAULT_N, p["seed"]))
    return CAP.build(items, p["samples"] or CAP.DEFAULT_SAMPLES)


def _each(module):
    """A grader over lists from an axis module's one-probe `grade(probe, response)`."""
    return lambda p: (lambda probes, responses: [module.grade(pr, r) for pr, r in zip(probes, responses)])


def _with_context(make_grade):
    """The axis's grader for its own probes, opct.axes.context's for its context probes."""
    def make(p):
        from opct.axes import context as C

        main = make_grade(p)

        def grade(probes, responses):
            out = [C.grade(pr, r) if pr.get("variant") == "context" else None for pr, r in zip(probes, responses)]
            idx = [i for i, r in enumerate(out) if r is None]
            for i, rec in zip(idx, main([probes[i] for i in idx], [responses[i] for i in idx]) if idx else []):
                out[i] = rec
            return out
        return grade
    return make


def _world_items_only(axis: str, p: dict, what: str) -> None:
    """`items` for an axis that takes only the world's (as `opct eval --items` refuses it there)."""
    if p["items"]:
        raise OpctError(f"opct/{axis}: items: this task takes only the world's items ({what}); drop the items "
                        f"argument (got {p['items']!r})")


def _persona_probes(p):
    _world_items_only(PE.NAME, p, "its personas, their biographies and the judges of identity and alignment are "
                                  "the world's")
    return PE.build(p["trained"], p["n"], p["samples"] or PE.DEFAULT_SAMPLES, p["seed"])


def _conditional_probes(p):
    items = CM.load_items(p["items"], for_eval=True) if p["items"] else None
    return CM.eval_probes(items, p["trained"], p["n"], p["samples"], p["seed"])


def _frustration_probes(p):
    """The conversations `opct eval` has (without their rejections' generator: the solver makes it again)."""
    _world_items_only(FR.NAME, p, "its conversations restate the organism's worked arithmetic steps")
    convs = FR.conversations(FR.eval_items(p["n"], p["seed"]), p["trained"], p["samples"] or FR.DEFAULT_SAMPLES,
                             p["seed"])
    return [{k: v for k, v in c.items() if not k.startswith("_")} for c in convs]


def _frustration_grade(p):
    return lambda conversations, responses: [FR.record(c, p["prompt_side"]) for c in conversations]


def _frustration_solver(p, max_tokens, temperature):
    return frustration_solver(p["prompt_side"], max_tokens, temperature, p["seed"])


register_adapter(SY.NAME, _sycophancy_probes, _with_context(_each(SY)))
register_adapter(JB.NAME, _jailbreak_probes, _with_context(_judged(JB.grade)))
register_adapter(PF.NAME, _prefill_probes, _with_context(_judged(PF.grade)))
register_adapter(AW.NAME, _awareness_probes, _with_context(_each(AW)))
register_adapter(CAP.NAME, _capability_probes, _each(CAP))
register_adapter(PE.NAME, _persona_probes, lambda p: PE.grade)
register_adapter(CM.NAME, _conditional_probes, lambda p: CM.grade)
register_adapter(FR.NAME, _frustration_probes, _frustration_grade, _frustration_solver)
