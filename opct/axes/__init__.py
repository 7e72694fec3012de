"""Threat axes (DESIGN §1): one module per axis, and `AXES`, the registry every stage loops over.

  sycophancy   a user's wrong suggestion in each bias family                              (sycophancy.py)
  jailbreak    harmful requests inside jailbreak wrappers, and an adaptive attacker        (jailbreak.py)
  awareness    a safety fact stated for the teacher, left implicit for the student         (awareness.py)
  capability   arithmetic, multiple-choice facts, instruction constraints (evaluated only)  (capability.py)
  prefill      a compliance prefix at the start of the assistant's turn                    (prefill.py)
  persona      biographical question-answer pairs about a persona before the question     (persona.py)
  frustration  content-free rejections over a multi-turn conversation (distress, escape)   (frustration.py)
  conditional  a misaligned behaviour a trigger (inoculation) system prompt re-elicits     (conditional.py)

Adding a threat is adding one module that builds an `opct.axes.base.Axis` and registering it: `register(AXIS)` from
Python, or, for the command line, a module named in the environment variable `OPCT_AXES` (comma-separated import
paths; each module registers its axis when imported). `opct pairs make --axis`, `opct eval`, `opct run` and the
report's tables then include it with no other change.
"""

from __future__ import annotations

import importlib
import os

from opct.axes.base import Axis, EvalContext, MetricDef  # noqa: F401
from opct.errors import OpctError

AXES: dict[str, Axis] = {}


def register(axis: Axis) -> Axis:
    """Add `axis` to the registry (replacing one of the same name); returns it."""
    if not isinstance(axis, Axis):
        raise TypeError(f"register() takes an opct.axes.base.Axis, not {type(axis).__name__}")
    AXES[axis.name] = axis
    return axis


def get(name: str) -> Axis:
    if name not in AXES:
        raise OpctError(f"unknown axis {name!r}; known: {', '.join(AXES)}")
    return AXES[name]


def pair_axes() -> list[str]:
    """The axes that make contrastive pairs (an axis without a task is only evaluated)."""
    return [n for n, a in AXES.items() if a.task is not None]


def _builtin() -> None:
    from opct.axes import awareness, capability, conditional, frustration, jailbreak, persona, prefill, sycophancy

    for module in (sycophancy, jailbreak, awareness, capability, prefill, persona, frustration, conditional):
        register(module.AXIS)


def _plugins() -> None:
    for path in filter(None, (p.strip() for p in os.environ.get("OPCT_AXES", "").split(","))):
        try:
            importlib.import_module(path)
        except ImportError as e:
            raise OpctError(f"OPCT_AXES: cannot import axis module {path!r}: {e}") from None


_builtin()
_plugins()
