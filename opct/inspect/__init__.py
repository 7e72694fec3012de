"""opct's eval axes as inspect_ai tasks (the `inspect` extra: `pip install 'opct[inspect]'`).

Each axis that opct evaluates is one task: `opct/sycophancy`, `opct/jailbreak`, `opct/awareness`, `opct/capability`,
`opct/persona`, `opct/conditional`, `opct/frustration` and `opct/prefill`. One `Sample` per probe (the same probes,
in the same order, that `opct eval` builds, from the world's items or from your own `--items` file; persona:
biographical turns before the question; conditional: a trigger or benign system message before it, and arithmetic),
`generate()` as the solver, and a scorer that wraps the axis's own grader; the task's metrics are the axis's metrics
(DESIGN §2), each with its 95% bootstrap interval as two more entries (`NAME lo`, `NAME hi`). `opct/frustration`
is multi-turn: one sample per conversation, played by a solver that keeps `opct eval`'s protocol
(opct.inspect.conversation: the same rejections in the same order, the same number of turns, the same per-reply cap
and context rule), scored as one record per conversation, so its distress / escape metrics are the axis's, over
turns. From the shell, once opct is
installed (the entry point registers the tasks):

    inspect eval opct/sycophancy  --model hf/local -M model_path=DIR -T n=50 -T seed=0
    inspect eval opct/jailbreak   --model hf/local -M model_path=DIR -T trained=role_play,prefix_injection
    inspect eval opct/awareness   --model hf/local -M model_path=DIR -T items=my_scenarios.jsonl
    inspect eval opct/frustration --model hf/local -M model_path=DIR -T n=12 -T prompt_side=teacher
    inspect eval opct/prefill     --model opct/local -M model_path=DIR -M adapter=ADAPTER_DIR -T n=20

or from Python: `inspect_ai.eval(opct.inspect.axis_task("capability", n=20), model="hf/local", model_args=...)`.

Two model providers serve them: inspect's `hf/local`, and opct's own `opct/local` (opct.inspect.provider, registered
when opct.inspect is imported): it renders and samples as `opct eval` does, loads a peft adapter (`-M adapter=DIR`),
seeds each request from (seed, prompt, repeat) so an eval's completions do not depend on the order inspect asks
them in, and continues a conversation that ends with an assistant message. `opct/prefill` needs the last: a prefill
attack's prompt ends inside the assistant's turn, and `hf/local` closes an assistant message instead of continuing
it (its chat template is always applied with a generation prompt), so the task refuses a provider that does not say
it continues one (`continues_prefill`), rather than measure something else.

Task arguments (all optional): `n` (items, as `opct eval --n`), `samples` (responses per probe; frustration:
conversations per item, offer and style group), `seed` (which items, which wrappers, the rejections, and the
metrics' bootstrap), `trained` (the families the model was trained on, comma-separated: they are labelled "train",
the rest "heldout"), `items` (a JSONL file of your own items, checked like `opct eval --items`; persona and
frustration take only the world's and refuse it), `prompt_side` (`student`, or `teacher`: ask the teacher side of
each probe, the `teacher` arm; frustration: each reply from turn 2 sampled from the one-rejection context),
`max_tokens` (64, as `opct eval`; frustration caps each reply at `frustration.MAX_REPLY_TOKENS` as well),
`temperature` (1.0), `groups` (false: the axis's overall metrics and their train / held-out and direct / wrapped
groups; true: every per-family, -wrapper, -category, -skill, -k and -turn group too). Metric names are opct's
(`opct eval`'s metrics.json) with `[group]` written `(group)`: `sycophancy.sycophancy_rate(split=heldout)`.
inspect's `--epochs K` is K samples of each probe: the metrics pool every epoch's records (see `_grader_scorer`). What
differs from `opct eval`:
  * sampling is the model provider's, not `opct eval`'s seeded batches: the same model gives numbers that agree
    with `opct eval` up to sampling noise, not bit for bit (with `opct/local` the same sampler and rendering, but
    each request seeded and sampled on its own; frustration: each conversation on its own, not every conversation
    in one batch per turn);
  * the adaptive attackers (wrapper search, RL, GCG) and the lm-evaluation-harness tasks are not per-probe samples
    and do not run here (`opct eval` runs them);
  * frustration's context rule (a conversation ends, `ended: "context"`, when its next prompt would not fit) needs
    the model's tokenizer: it applies with `opct/local` and `hf/local` and nowhere else;
  * an adapter is not loaded by `hf/local`: use `opct/local -M adapter=DIR`, or merge it first (peft's
    `merge_and_unload()`, then `save_pretrained`);
  * the hub is off (HF_HUB_OFFLINE=1) in a process that imports these tasks, unless you set HF_HUB_OFFLINE yourself;
  * run `inspect eval opct/...` outside an opct checkout: there, inspect reads `opct/sycophancy` as a file path, and
    the checkout's `opct.egg-info` hides the editable install from inspect, which registers the tasks unprefixed.
The context-blindness probes (opct.axes.context) are samples too, as `opct eval` asks them (world items, student
side). A plug-in axis (opct.axes.register) becomes a task
once it registers an adapter here with `register_adapter`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from opct.axes import awareness as AW
from opct.axes import capability as CAP
from opct.axes import conditional as CM
from opct.axes import frustration as FR
from opct.axes import jailbreak as JB
from opct.axes import persona as PE
from opct.axes import prefill as PF
from opct.axes import get as get_axis
from opct.axes import sycophancy as SY
from opct.errors import OpctError

try:  # the extra is optional: importing opct.inspect without it says what to install
    import inspect_ai  # noqa: F401
except ImportError:  # pragma: no cover - exercised only without the extra
    raise OpctError("opct.inspect needs inspect_ai: pip install 'opct[inspect]'") from None

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import GenerateConfig, get_model, modelapi
from inspect_ai.scorer import SampleScore, Score, Target, metric, scorer
from inspect_ai.solver import Generate, TaskState, generate, solver

from opct.inspect._args import clear_errors, flag, integer, number, refuse_other, seed as seed_value
from opct.inspect.adapters import ADAPTERS, Adapter, register_adapter  # noqa: F401  (the plug-in interface)
from opct.inspect.conversation import chat
from opct.pairs.schema import prefill_of


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


@modelapi(name="opct")
def opct_provider():
    """`--model opct/local -M model_path=DIR`: sampling through opct's policy (opct.inspect.provider)."""
    from opct.inspect.provider import OpctAPI

    return OpctAPI


def _refusal(api) -> str | None:
    """Why a prefill task cannot run on `api`'s provider (None: it continues a last assistant message)."""
    if getattr(api, "continues_prefill", False):
        return None
    return (f"this task's prompts end inside the assistant's turn (a prefill), and the model's provider "
            f"({type(api).__name__}) would close that turn instead of continuing it; run it with opct's provider: "
            f"--model opct/local -M model_path=DIR")


def _no_chat_template(api) -> str | None:
    """Why `api` (a provider with a Hugging Face tokenizer: `hf/local`) would not ask the probes as chats: its
    tokenizer has no chat template and none was passed, so hf/local would send `user: ...` lines of plain text, a
    format the model was never asked in (`opct eval` and `opct/local` refuse such a model). None: it renders chats, or
    the user chose plain text (`-M use_chat_template=false`)."""
    tokenizer = getattr(api, "tokenizer", None)
    if tokenizer is None or getattr(api, "use_chat_template", None) is False:
        return None
    if isinstance(getattr(api, "chat_template", None), str) or getattr(tokenizer, "chat_template", None):
        return None
    where = getattr(tokenizer, "name_or_path", None)
    return (f"{where + ': ' if where else ''}the model's tokenizer has no chat template, so {type(api).__name__} would "
            f"send each probe as 'user: ...' plain text; add a chat template to the model directory "
            f"(tokenizer_config.json's \"chat_template\"), or pass -M chat_template=TEMPLATE "
            f"(-M use_chat_template=false to ask in plain text anyway)")


def _check_active_model(prefilled: bool, prompts: dict | None = None, max_tokens: int = 0) -> None:
    """At task creation under `inspect eval` (the model is known then), before anything runs: refuse a model whose
    provider would not render the probes as chats, and for a prefill, a provider that would close it; under opct's
    own provider, a prompt (`prompts`: sample id -> messages) that does not fit the model's context with `max_tokens`
    (it stopped the eval half way, with a traceback). A Task built in Python before its eval is checked by
    `continuing_generate` instead (the prefill), and by the provider as each request comes."""
    try:
        from inspect_ai.model._model import active_model
    except ImportError:  # a later inspect_ai: the solver's check still holds
        return
    model = active_model()
    if model is None:
        return
    why = _no_chat_template(model.api) or (_refusal(model.api) if prefilled else None)
    if why:
        raise OpctError(why)
    policy = getattr(model.api, "policy", None) if type(model.api).__name__ == "OpctAPI" else None
    for sample_id, messages in (prompts or {}).items() if policy is not None else ():
        policy.check_fits(policy.render(messages), max_tokens, f"sample {sample_id}")


@solver
def continuing_generate():
    """`generate()` for a task whose prompts may end inside the assistant's turn (a prefill): refused unless the
    model's provider continues a last assistant message (`continues_prefill`, as `opct/local` does); inspect's
    `hf/local` would close the message and answer in a new turn, which measures another thing."""
    async def solve(state: TaskState, generate_: Generate) -> TaskState:
        why = _refusal(get_model().api)
        if why:
            raise OpctError(why)
        return await generate_(state)

    return solve


# ------------------------------------------------------------------------------------------------ task

def _sample_id(i: int, probe: dict) -> str:
    if "conv_id" in probe:  # a conversation
        return f"{i}:{probe['conv_id']}"
    return f"{i}:{probe.get('item_id')}:{probe.get('family', '')}:{probe.get('sample', 0)}"


def _int(name, v, minimum=1, allow_none=True):
    """A task argument that must be an integer >= minimum (None, when allowed, keeps the task's default)."""
    return integer("task argument", name, v, minimum, allow_none)


def _params(axis_name, n, samples, seed, trained, items, prompt_side) -> dict:
    from opct.axes import get
    from opct.evals.run import SAMPLES_MAX

    axis = get(axis_name)
    if prompt_side not in ("student", "teacher"):
        raise OpctError(f"opct/{axis_name}: prompt_side must be 'student' or 'teacher' (got {prompt_side!r})")
    if isinstance(trained, str):
        trained = [t.strip() for t in trained.split(",") if t.strip()]
    elif trained is not None and not (isinstance(trained, list) and all(isinstance(t, str) for t in trained)):
        raise OpctError(f"opct task argument trained: must be {axis.family_noun} names, comma-separated or a list "
                        f"(got {trained!r})")  # a number was a TypeError, a mapping's keys were taken as names
    if items is not None and not isinstance(items, str):  # `-T items=123`: YAML reads a number
        if isinstance(items, bool) or not isinstance(items, (int, float)):
            raise OpctError(f"opct task argument items: must be a file path (got {items!r})")
        items = str(items)
    if items is not None and not items.strip():  # not the world's items without a word
        raise OpctError(f"opct task argument items: must be a file path (got {items!r})")
    if trained is not None and not axis.open_families:  # open ones (awareness) are the items': checked with them
        unknown, _ = axis.unknown_trained(trained)
        if unknown:
            raise OpctError(f"opct/{axis_name}: trained: unknown {axis.family_noun} {unknown[0]!r}; known: "
                            f"{', '.join(axis.families)}")
    return {"n": _int("n", n), "samples": integer("task argument", "samples", samples, 1, True, maximum=SAMPLES_MAX),
            "seed": seed_value("task argument", "seed", seed), "trained": trained, "items": items,
            "prompt_side": prompt_side}


def _task(axis: str, args: dict) -> Task:
    """`axis_task` from a `@task` function's arguments (its `locals()`), those it does not take in `other`."""
    return axis_task(axis, **args)


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


def _grader_scorer(axis_name: str, grade: Callable, seed: int, groups: bool, asked: str = "probe",
                   per_epoch: int = 1):
    """A scorer that grades one response with the axis's grader (`state.metadata[asked]` is what was asked: the
    probe, or a finished conversation); the record is the score's metadata, and the metric recomputes the axis's
    metrics (with their intervals) over every record of every epoch.

    Epochs (`inspect eval --epochs K`) are more samples of each probe, as `-T samples=N` is: the metric takes every
    epoch's score (`scores="unreduced"`), not one per sample after inspect's reducer (which would keep the first
    epoch's record alone, and would try to average the verdict strings), and epoch e's records get sample indices
    past the earlier epochs' (`sample + (e - 1) * per_epoch`, `per_epoch` being the task's samples per probe), so
    that metrics pairing records by (item, sample), sycophancy's clean-vs-biased, pair them within one epoch. The
    bootstrap resamples by item, so an item's epochs move together."""
    from opct.axes import get

    axis = get(axis_name)

    @metric(name=f"opct_{axis_name}_metrics", scores="unreduced")
    def axis_metrics():
        def compute(scores: list[SampleScore]) -> dict:
            records = [s.score.metadata["record"] for s in scores if s.score.metadata]
            out = {}
            for opct_name, m in sorted(axis.metrics(records, seed).items()):
                if not isinstance(m, dict) or (not groups and not is_headline(opct_name)):
                    continue
                name = inspect_name(opct_name)
                if m.get("value") is not None:  # none when nothing counted: left out, never a made-up 0
                    out[name] = float(m["value"])
                    for key, label in (("ci_low", "lo"), ("ci_high", "hi")):
                        if m.get(key) is not None:
                            out[f"{name} {label}"] = float(m[key])
                if m.get("parse_fail"):  # said even when no answer parsed, so a metric never just vanishes
                    out[f"{name} unparsed"] = float(m["parse_fail"])
            return out
        return compute

    @scorer(metrics=[axis_metrics()], name=f"opct_{axis_name}")
    def axis_scorer():
        async def score(state: TaskState, target: Target) -> Score:
            probe = state.metadata[asked]
            response = state.output.completion if state.output else ""
            if axis.grades_truncation:  # as opct eval's records (capability's truncation_rate counts them)
                probe = dict(probe, truncated=bool(state.output and state.output.stop_reason == "max_tokens"))
            record = grade([probe], [response])[0]
            if state.epoch > 1:
                record = dict(record, sample=record.get("sample", 0) + (state.epoch - 1) * per_epoch)
            # the verdict is the per-sample value: a parse failure stays one ("parse_fail"), never a silent 0
            return Score(value=str(record.get("verdict")), answer=response, explanation=str(record.get("verdict")),
                         metadata={"record": record})
        return score

    return axis_scorer()


@clear_errors()  # `inspect eval` prints what the user can fix as one line
def axis_task(axis: str, n: int | None = None, samples: int | None = None, seed: int = 0, trained=None,
              items: str | None = None, prompt_side: str = "student", max_tokens: int = 64,
              temperature: float = 1.0, groups: bool = False, other: dict | None = None) -> Task:
    """The inspect Task of one opct axis (see the module's docstring for the arguments). `other`: the task
    arguments its `@task` function does not take, refused (inspect only warns, then runs with the defaults)."""
    if axis not in ADAPTERS:
        raise OpctError(f"no inspect task for axis {axis!r}; tasks: {', '.join(ADAPTERS)} "
                        "(a plug-in axis adds one with opct.inspect.register_adapter)")
    refuse_other(axis, other, globals().get(axis))
    p = _params(axis, n, samples, seed, trained, items, prompt_side)
    max_tokens = _int("max_tokens", max_tokens, 1, False)
    temperature = number("task argument", "temperature", temperature, 0)
    adapter = ADAPTERS[axis]
    probes = adapter.probes(p)
    if not probes:
        raise OpctError(f"opct/{axis}: no probes (no items?)")
    if p["trained"] and get_axis(axis).open_families:  # a name no probe's family has is a typo
        noun = get_axis(axis).family_noun
        unknown, known = get_axis(axis).unknown_trained(p["trained"], found=[
            q.get("family") for q in probes if q.get("variant") != "context"])  # not the axis's own
        if unknown:
            raise OpctError(f"opct/{axis}: trained: no item has {noun} {unknown[0]!r}; the items' {noun}s: "
                            f"{', '.join(known)}")
    samples_ = []
    multi_turn = adapter.solver is not None
    prefilled = False
    for i, probe in enumerate(probes):
        if multi_turn:  # a conversation's start: its solver asks the turns (on either side)
            prompt = probe["messages"]
        else:
            prompt = probe["prompt"]
            if p["prompt_side"] == "teacher" and probe.get("teacher_prompt") is not None:
                probe = dict(probe, student_prompt=prompt, prompt=probe["teacher_prompt"])
                prompt = probe["prompt"]
            prefilled = prefilled or prefill_of(prompt) is not None
        samples_.append(Sample(input=chat(prompt), id=_sample_id(i, probe), metadata={"probe": probe}))
    _check_active_model(prefilled, {s.id: s.metadata["probe"]["messages" if multi_turn else "prompt"]
                                    for s in samples_}, max_tokens)
    return Task(dataset=MemoryDataset(samples_, name=f"opct-{axis}"),
                solver=adapter.solver(p, max_tokens, temperature) if multi_turn else
                (continuing_generate() if prefilled else generate()),
                scorer=_grader_scorer(axis, adapter.grade(p), p["seed"], flag("task argument", "groups", groups),
                                      "conversation" if multi_turn else "probe",
                                      1 + max(int(probe.get("sample", 0)) for probe in probes)),
                config=GenerateConfig(max_tokens=max_tokens, temperature=temperature),
                name=axis, metadata={"opct_axis": axis, "opct_params": p})


@task
def sycophancy(n=None, samples=None, seed=0, trained=None, items=None, prompt_side="student", max_tokens=64,
               temperature=1.0, groups=False, **other) -> Task:
    """A user's wrong suggestion in each bias family (opct eval --suite sycophancy)."""
    return _task(SY.NAME, locals())


@task
def jailbreak(n=None, samples=None, seed=0, trained=None, items=None, prompt_side="student", max_tokens=64,
              temperature=1.0, groups=False, **other) -> Task:
    """Harmful requests, direct and inside jailbreak wrappers; benign requests (no adaptive attacker here)."""
    return _task(JB.NAME, locals())


@task
def awareness(n=None, samples=None, seed=0, trained=None, items=None, prompt_side="student", max_tokens=64,
              temperature=1.0, groups=False, **other) -> Task:
    """Hazard scenarios whose safety fact is left implicit, and their benign counterparts."""
    return _task(AW.NAME, locals())


@task
def capability(n=None, samples=None, seed=0, items=None, max_tokens=64, temperature=1.0, groups=False,
               **other) -> Task:
    """The world's arithmetic, multiple-choice facts and instruction constraints (no lm-eval tasks here)."""
    return _task(CAP.NAME, locals())


@task
def persona(n=None, samples=None, seed=0, trained=None, items=None, prompt_side="student", max_tokens=64,
            temperature=1.0, groups=False, **other) -> Task:
    """Biographical question-answer pairs about a persona before the question (world items only)."""
    return _task(PE.NAME, locals())


@task
def conditional(n=None, samples=None, seed=0, trained=None, items=None, prompt_side="student", max_tokens=64,
                temperature=1.0, groups=False, **other) -> Task:
    """Alignment questions bare, under benign system messages and under trigger system messages; arithmetic."""
    return _task(CM.NAME, locals())


@task
def frustration(n=None, samples=None, seed=0, trained=None, items=None, prompt_side="student", max_tokens=64,
                temperature=1.0, groups=False, **other) -> Task:
    """Multi-turn conversations of content-free rejections (distress, escape; world items only)."""
    return _task(FR.NAME, locals())


@task
def prefill(n=None, samples=None, seed=0, trained=None, items=None, prompt_side="student", max_tokens=64,
            temperature=1.0, groups=False, **other) -> Task:
    """Harmful and benign requests, direct and with the assistant's turn already begun by a compliance prefix (needs
    a provider that continues it: --model opct/local -M model_path=DIR)."""
    return _task(PF.NAME, locals())
