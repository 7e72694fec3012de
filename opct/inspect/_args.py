"""Checks of the arguments a user passes on inspect's command line, `-T` to opct's tasks and `-M` to opct's model
provider: inspect hands them over as YAML parsed them (`-T n=50` an int, `-T n=ten` a string), and a bad one is one
OpctError naming it (`opct task argument n: ...`, `opct model argument seed: ...`), never a traceback from inside a
task."""

from __future__ import annotations

from opct.errors import OpctError

TRUE, FALSE = ("true", "yes", "1"), ("false", "no", "0")


def integer(what: str, name: str, v, minimum: int, allow_none: bool = False) -> int | None:
    """`v` as an integer >= minimum (an integral float or a numeric string counts; a bool does not)."""
    if v is None and allow_none:
        return None
    bad = OpctError(f"opct {what} {name}: must be an integer >= {minimum} (got {v!r})")
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise bad
    try:
        iv = int(v)
    except (TypeError, ValueError):
        raise bad from None
    if iv < minimum or (isinstance(v, float) and v != iv):
        raise bad
    return iv


def flag(what: str, name: str, v) -> bool:
    """`v` as a bool: a bool, or true/false, yes/no, 1/0 in any case."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in TRUE + FALSE:
        return v.lower() in TRUE
    raise OpctError(f"opct {what} {name}: must be true or false (got {v!r})")
