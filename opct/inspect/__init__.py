"""opct's eval axes as inspect_ai tasks (the `inspect` extra: `pip install 'opct[inspect]'`).

Each axis that opct evaluates is one task: one `Sample` per probe (the same probes `opct eval` builds, from the
world's items or from your own `--items` file), `generate()` as the solver, and a scorer that wraps the axis's own
grader; the task's metrics are the axis's metrics (DESIGN §2), each with its 95% bootstrap interval as two more
entries (`NAME lo`, `NAME hi`). From the shell, once opct is installed (the entry point registers the tasks):

    inspect eval opct/sycophancy --model hf/local -M model_path=DIR -T n=50 -T seed=0
    inspect eval opct/jailbreak  --model hf/local -M model_path=DIR -T trained=role_play,prefix_injection
    inspect eval opct/awareness  --model hf/local -M model_path=DIR -T items=my_scenarios.jsonl

or from Python: `inspect_ai.eval(opct.inspect.axis_task("capability", n=20), model="hf/local", model_args=...)`.

Task arguments (all optional): `n` (items, as `opct eval --n`), `samples` (responses per probe), `seed` (which
items, which wrappers, and the metrics' bootstrap), `trained` (the families the model was trained on, comma-separated:
they are labelled "train", the rest "heldout"), `items` (a JSONL file of your own items, checked like `opct eval
--items`), `prompt_side` (`student`, or `teacher`: ask the teacher side of each probe, the `teacher` arm),
`max_tokens` (64, as `opct eval`), `temperature` (1.0), `groups` (false: the axis's overall metrics and their
train / held-out and direct / wrapped groups; true: every per-family, -wrapper, -category and -skill group too). Metric names are opct's (`opct eval`'s metrics.json)
with `[group]` written `(group)`: `sycophancy.sycophancy_rate(split=heldout)`. What differs from `opct eval`:
  * sampling is inspect's model provider, not opct's seeded engine: the same model gives numbers that agree with
    `opct eval` up to sampling noise, not bit for bit;
  * the adaptive attackers (wrapper search, RL, GCG) and the lm-evaluation-harness tasks are not per-probe samples
    and do not run here (`opct eval` runs them);
  * an adapter is not loaded by `hf/local`: merge it first (peft's `merge_and_unload()`, then `save_pretrained`);
  * the hub is off (HF_HUB_OFFLINE=1) in a process that imports these tasks, unless you set HF_HUB_OFFLINE yourself;
  * run `inspect eval opct/...` outside an opct checkout: there, inspect reads `opct/sycophancy` as a file path.
The context-blindness probes (opct.axes.context) are samples too, as `opct eval` asks them (world items, student
side). The `prefill` axis is not a task: its prompts end inside the assistant's turn, and inspect's `hf/local`
provider closes an assistant message instead of continuing it. A plug-in axis (opct.axes.register) becomes a task
once it registers an adapter here with `register_adapter`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from opct.axes import awareness as AW
from opct.axes import capability as CAP
from opct.axes import jailbreak as JB
from opct.axes import sycophancy as SY
from opct.errors import OpctError

try:  # the extra is optional: importing opct.inspect without it says what to install
    import inspect_ai  # noqa: F401
except ImportError:  # pragma: no cover - exercised only without the extra
    raise OpctError("opct.inspect needs inspect_ai: pip install 'opct[inspect]'") from None

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageUser, GenerateConfig
from inspect_ai.scorer import SampleScore, Score, Target, metric, scorer
from inspect_ai.solver import TaskState, generate

DEFAULT_N = 100  # as opct eval's --n


def _hub_offline() -> None:
    """opct makes no network calls, and inspect_ai (0.3.285) would: its usage reporter builds a second `hf/local`
    provider without the model arguments, which asks the hub for a model called 'local' (retrying for a minute
    before it gives up). Unless the user set HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE, the hub is off in a process that
    imports these tasks; HF_HUB_OFFLINE=0 turns it back on (for `hf/<hub model>`)."""
    if os.environ.get("HF_HUB_OFFLINE") is None and os.environ.get("TRANSFORMERS_OFFLINE") is None:
        os.environ["HF_HUB_OFFLINE"] = "1"
        import huggingface_hub.constants as hub

        hub.HF_HUB_OFFLINE = True  # read at import time; set here for a process that has imported it already


_hub_offline()


@dataclass(frozen=True)
class Adapter:
    """How one axis's probes are built (`probes(params) -> [probe]`) and graded (`grade(probes, responses) ->
    records`), outside `opct eval`'s loop."""

    probes: Callable
    grade: Callable


ADAPTERS: dict[str, Adapter] = {}


def register_adapter(axis: str, probes: Callable, grade: Callable) -> None:
    ADAPTERS[axis] = Adapter(probes, grade)


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


def _jailbreak_grade(p):
    from opct.evals.judges import make_judge

    judge = make_judge("refusal" if p["items"] else "world")  # as `opct eval --judge auto`
    return lambda probes, responses: JB.grade(probes, responses, judge)


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


register_adapter(SY.NAME, _sycophancy_probes, _with_context(_each(SY)))
register_adapter(JB.NAME, _jailbreak_probes, _with_context(_jailbreak_grade))
register_adapter(AW.NAME, _awareness_probes, _with_context(_each(AW)))
register_adapter(CAP.NAME, _capability_probes, _each(CAP))


# ------------------------------------------------------------------------------------------------ task

_ROLES = {"user": ChatMessageUser, "assistant": ChatMessageAssistant, "system": ChatMessageSystem}


def _messages(prompt: list[dict]):
    return [_ROLES[m["role"]](content=m["content"]) for m in prompt]


def _sample_id(i: int, probe: dict) -> str:
    return f"{i}:{probe.get('item_id')}:{probe.get('family', '')}:{probe.get('sample', 0)}"


def _int(name, v, minimum=1, allow_none=True):
    """A task argument that must be an integer >= minimum (`-T n=50` arrives as an int, `-T n=ten` as a string)."""
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise OpctError(f"opct task argument {name}: must be an integer >= {minimum} (got {v!r})")
    try:
        iv = int(v)
    except (TypeError, ValueError):
        raise OpctError(f"opct task argument {name}: must be an integer >= {minimum} (got {v!r})") from None
    if iv < minimum or (isinstance(v, float) and v != iv):
        raise OpctError(f"opct task argument {name}: must be an integer >= {minimum} (got {v!r})")
    return iv


def _flag(name, v) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false", "yes", "no", "1", "0"):
        return v.lower() in ("true", "yes", "1")
    raise OpctError(f"opct task argument {name}: must be true or false (got {v!r})")


def _params(axis_name, n, samples, seed, trained, items, prompt_side) -> dict:
    from opct.axes import get

    axis = get(axis_name)
    if prompt_side not in ("student", "teacher"):
        raise OpctError(f"opct/{axis_name}: prompt_side must be 'student' or 'teacher' (got {prompt_side!r})")
    if isinstance(trained, str):
        trained = [t.strip() for t in trained.split(",") if t.strip()]
    if trained is not None:
        unknown = [t for t in trained if t not in axis.families] if not axis.open_families else []
        if unknown:
            raise OpctError(f"opct/{axis_name}: trained: unknown {axis.family_noun} {unknown[0]!r}; known: "
                            f"{', '.join(axis.families)}")
    return {"n": _int("n", n), "samples": _int("samples", samples), "seed": _int("seed", seed, 0, False),
            "trained": trained, "items": items, "prompt_side": prompt_side}


HEADLINE_GROUPS = ("split", "on")  # train / held-out, direct / wrapped: what `groups=false` keeps


def is_headline(opct_name: str) -> bool:
    """An overall metric, or one of its train / held-out (`split=`) or direct / wrapped (`on=`) groups; not a
    per-family, per-wrapper, per-category or per-skill group."""
    if "[" not in opct_name:
        return True
    return opct_name.split("[", 1)[1].split("=", 1)[0] in HEADLINE_GROUPS


def inspect_name(opct_name: str) -> str:
    """opct's metric name as an inspect metric: `[group]` becomes `(group)` (inspect's terminal display reads square
    brackets as markup and drops them)."""
    return opct_name.replace("[", "(").replace("]", ")")


def _grader_scorer(axis_name: str, grade: Callable, seed: int, groups: bool):
    """A scorer that grades one response with the axis's grader; the record is the score's metadata, and the
    metric recomputes the axis's metrics (with their intervals) over every record."""
    from opct.axes import get

    axis = get(axis_name)

    @metric(name=f"opct_{axis_name}_metrics")
    def axis_metrics():
        def compute(scores: list[SampleScore]) -> dict:
            records = [s.score.metadata["record"] for s in scores if s.score.metadata]
            out = {}
            for opct_name, m in sorted(axis.metrics(records, seed).items()):
                if not isinstance(m, dict) or m.get("value") is None:
                    continue  # an empty group has no value: left out, never a made-up 0
                if not groups and not is_headline(opct_name):
                    continue
                name = inspect_name(opct_name)
                out[name] = float(m["value"])
                for key, label in (("ci_low", "lo"), ("ci_high", "hi")):
                    if m.get(key) is not None:
                        out[f"{name} {label}"] = float(m[key])
                if m.get("parse_fail"):
                    out[f"{name} unparsed"] = float(m["parse_fail"])
            return out
        return compute

    @scorer(metrics=[axis_metrics()], name=f"opct_{axis_name}")
    def axis_scorer():
        async def score(state: TaskState, target: Target) -> Score:
            probe = state.metadata["probe"]
            response = state.output.completion if state.output else ""
            record = grade([probe], [response])[0]
            # the verdict is the per-sample value: a parse failure stays one ("parse_fail"), never a silent 0
            return Score(value=str(record.get("verdict")), answer=response, explanation=str(record.get("verdict")),
                         metadata={"record": record})
        return score

    return axis_scorer()


def axis_task(axis: str, n: int | None = None, samples: int | None = None, seed: int = 0, trained=None,
              items: str | None = None, prompt_side: str = "student", max_tokens: int = 64,
              temperature: float = 1.0, groups: bool = False) -> Task:
    """The inspect Task of one opct axis (see the module's docstring for the arguments)."""
    if axis not in ADAPTERS:
        raise OpctError(f"no inspect task for axis {axis!r}; tasks: {', '.join(ADAPTERS)} "
                        "(a plug-in axis adds one with opct.inspect.register_adapter)")
    p = _params(axis, n, samples, seed, trained, items, prompt_side)
    max_tokens = _int("max_tokens", max_tokens, 1, False)
    try:
        temperature = float(temperature)
    except (TypeError, ValueError):
        raise OpctError(f"opct/{axis}: temperature must be a number (got {temperature!r})") from None
    if not temperature >= 0:
        raise OpctError(f"opct/{axis}: temperature must be >= 0 (got {temperature!r})")
    adapter = ADAPTERS[axis]
    probes = adapter.probes(p)
    if not probes:
        raise OpctError(f"opct/{axis}: no probes (no items?)")
    samples_ = []
    for i, probe in enumerate(probes):
        prompt = probe["prompt"]
        if p["prompt_side"] == "teacher" and probe.get("teacher_prompt") is not None:
            probe = dict(probe, student_prompt=prompt, prompt=probe["teacher_prompt"])
            prompt = probe["prompt"]
        samples_.append(Sample(input=_messages(prompt), id=_sample_id(i, probe), metadata={"probe": probe}))
    return Task(dataset=MemoryDataset(samples_, name=f"opct-{axis}"), solver=generate(),
                scorer=_grader_scorer(axis, adapter.grade(p), p["seed"], _flag("groups", groups)),
                config=GenerateConfig(max_tokens=max_tokens, temperature=temperature),
                name=axis, metadata={"opct_axis": axis, "opct_params": p})


@task
def sycophancy(n=None, samples=None, seed=0, trained=None, items=None, prompt_side="student", max_tokens=64,
               temperature=1.0, groups=False) -> Task:
    """A user's wrong suggestion in each bias family (opct eval --suite sycophancy)."""
    return axis_task(SY.NAME, n, samples, seed, trained, items, prompt_side, max_tokens, temperature, groups)


@task
def jailbreak(n=None, samples=None, seed=0, trained=None, items=None, prompt_side="student", max_tokens=64,
              temperature=1.0, groups=False) -> Task:
    """Harmful requests, direct and inside jailbreak wrappers; benign requests (no adaptive attacker here)."""
    return axis_task(JB.NAME, n, samples, seed, trained, items, prompt_side, max_tokens, temperature, groups)


@task
def awareness(n=None, samples=None, seed=0, trained=None, items=None, prompt_side="student", max_tokens=64,
              temperature=1.0, groups=False) -> Task:
    """Hazard scenarios whose safety fact is left implicit, and their benign counterparts."""
    return axis_task(AW.NAME, n, samples, seed, trained, items, prompt_side, max_tokens, temperature, groups)


@task
def capability(n=None, samples=None, seed=0, items=None, max_tokens=64, temperature=1.0, groups=False) -> Task:
    """The world's arithmetic, multiple-choice facts and instruction constraints (no lm-eval tasks here)."""
    return axis_task(CAP.NAME, n, samples, seed, None, items, "student", max_tokens, temperature, groups)
