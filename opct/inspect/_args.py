"""Checks of the arguments a user passes on inspect's command line, `-T` to opct's tasks and `-M` to opct's model
provider: inspect hands them over as YAML parsed them (`-T n=50` an int, `-T n=ten` a string), and a bad one is one
OpctError naming it (`opct task argument n: ...`, `opct model argument seed: ...`), never a traceback from inside a
task. Task and model construction run under `clear_errors`, so that inspect prints such an error as one line."""

from __future__ import annotations

from contextlib import contextmanager

from opct.errors import OpctError, user_message

# inspect's exception hook prints a PrerequisiteError as its message alone, exits with status 1 on a SilentException
# and prints anything else with a traceback
try:
    from inspect_ai._util.error import PrerequisiteError, SilentException
except ImportError:  # a later inspect_ai without them: the error still says what is wrong, after inspect's traceback
    PrerequisiteError = SilentException = Exception


class InspectInputError(OpctError):
    """A problem with what the user passed to one of opct's tasks or its model provider (an argument, a file, a model
    directory)."""


class _OneLine(InspectInputError, PrerequisiteError):
    """An InspectInputError that inspect prints as `opct: error: ...` and no traceback (its exception hook, set by
    its command line and by `inspect_ai.eval`, prints a PrerequisiteError's `message` through rich)."""

    def __init__(self, message: str):
        InspectInputError.__init__(self, message)
        from rich.text import Text  # not markup: a message's [brackets] are its own

        self.message = Text(f"opct: error: {message}")


class _Printed(InspectInputError, SilentException):
    """An InspectInputError already printed as `opct: error: ...` on stderr (under `--display none`, where rich's
    console, and so inspect's own printing of a PrerequisiteError, is quiet): inspect's exception hook exits with
    status 1 and prints nothing more."""


for _cls in (_OneLine, _Printed):  # in a traceback (a script's), the class it is
    _cls.__name__ = _cls.__qualname__ = "InspectInputError"


def _rich_is_quiet() -> bool:
    """`--display none` makes rich's console quiet, and inspect's hook would then print nothing at all."""
    import rich

    return rich.get_console().quiet


@contextmanager
def clear_errors():
    """Inside: what the user can fix (an OpctError, an unreadable or malformed file: `opct.errors.user_message`)
    leaves as an `InspectInputError`, which the user sees as one line, `opct: error: ...`, and no traceback (inspect
    prints it; under `--display none`, which quiets inspect's printing, it is written to stderr here); a bug keeps
    its traceback."""
    try:
        yield
    except InspectInputError:
        raise
    except Exception as e:  # noqa: BLE001 - sorted by user_message: the user's problem, or a bug
        message = user_message(e)
        if message is None:
            raise
        if _rich_is_quiet():
            import sys

            print(f"opct: error: {message}", file=sys.stderr)
            raise _Printed(message) from None
        raise _OneLine(message) from None


TRUE, FALSE = ("true", "yes", "1"), ("false", "no", "0")


def integer(what: str, name: str, v, minimum: int, allow_none: bool = False, maximum: int | None = None) -> int | None:
    """`v` as an integer >= minimum (and <= maximum, where given; an integral float or a numeric string counts; a bool
    does not)."""
    if v is None and allow_none:
        return None
    bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
    bad = OpctError(f"opct {what} {name}: must be an integer {bounds} (got {v!r})")
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise bad
    try:
        iv = int(v)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite float (YAML's .inf)
        raise bad from None
    if iv < minimum or (maximum is not None and iv > maximum) or (isinstance(v, float) and v != iv):
        raise bad
    return iv


def seed(what: str, name: str, v) -> int:
    """A seed, in the range every opct command's --seed takes (`opct.config.SEED`: 0 .. 2**32 - 1)."""
    from opct.config import SEED

    return integer(what, name, v, SEED["ge"], maximum=SEED["le"])


def number(what: str, name: str, v, minimum: float) -> float:
    """`v` as a finite number >= minimum (an int, a float or a numeric string; a bool is no number, and an infinite
    or NaN one is refused, not sampled at)."""
    import math

    bad = OpctError(f"opct {what} {name}: must be a finite number >= {minimum} (got {v!r})")
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise bad
    try:
        fv = float(v)
    except ValueError:
        raise bad from None
    if not (math.isfinite(fv) and fv >= minimum):
        raise bad
    return fv


def flag(what: str, name: str, v) -> bool:
    """`v` as a bool: a bool, or true/false, yes/no, 1/0 in any case."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in TRUE + FALSE:
        return v.lower() in TRUE
    raise OpctError(f"opct {what} {name}: must be true or false (got {v!r})")


def refuse_other(axis: str, other: dict | None, task_fn) -> None:
    """A task argument the `@task` function `task_fn` does not take (`-T trained=...` on opct/capability, `-T sample=3`
    for samples) is an error: inspect only warned "param not used" and ran the task with its defaults (2026-12-07).
    `model` is inspect's own (it has passed it to every task)."""
    import inspect

    bad = sorted(set(other or {}) - {"model"})
    if bad:
        known = [q for q in inspect.signature(task_fn).parameters if q != "other"] if callable(task_fn) else []
        raise OpctError(f"opct/{axis}: task argument {bad[0]}: not one of this task's"
                        + (f" ({', '.join(known)})" if known else ""))
