"""The shapes of the JSON files opct reads back (a report's run files, an audit's records), checked before use: a
hand-edited or damaged file is an error naming the file (and line), the field and what it must be, never a TypeError
traceback from deep inside a report.

A shape is written as data:

    NUM, INT, STR, BOOL, OBJECT, LIST   a value of that JSON type (NUM: int or float, never a bool)
    FINITE                              a number that is not NaN or infinite
    NAME                                a string that names one folder (no '/', not '..')
    {"key": shape, "opt?": shape}       an object with these keys (one ending in "?" may be absent), others free
    {"*": shape}                        an object whose every value has `shape`
    [shape]                             a list whose every item has `shape`
    (None, shape)                       null or `shape`
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from opct.errors import DataError, OpctError
from opct.files import is_dir_name, read_json


@dataclass(frozen=True)
class Is:
    """A leaf shape: `want` says it in words ("a number"), `ok` tests a value."""

    want: str
    ok: Callable[[object], bool]


NUM = Is("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
FINITE = Is("a finite number", lambda v: NUM.ok(v) and math.isfinite(v))  # a rate: NaN passes every comparison
INT = Is("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
STR = Is("a string", lambda v: isinstance(v, str))
BOOL = Is("a boolean", lambda v: isinstance(v, bool))
OBJECT = Is("an object", lambda v: isinstance(v, dict))
LIST = Is("a list", lambda v: isinstance(v, list))
NAME = Is("a name of one folder", is_dir_name)  # an arm, a threat, a study: a run's folder is named by it


def _want(shape) -> str:
    if isinstance(shape, tuple):
        wants = [_want(s) for s in shape if s is not None] + ["null"] * (None in shape)
        return ", ".join(wants[:-1]) + " or " + wants[-1]
    return shape.want if isinstance(shape, Is) else "an object" if isinstance(shape, dict) else "a list"


def _fits(value, shape) -> bool:
    """Whether `value` is of `shape`'s JSON type (what is inside not looked at)."""
    return shape.ok(value) if isinstance(shape, Is) else isinstance(value, dict if isinstance(shape, dict) else list)


def _got(value) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def mismatch(value, shape, field: str = "") -> tuple[str, str] | None:
    """(field, problem) of the first place `value` differs from `shape`, or None when it has it."""
    if isinstance(shape, tuple):  # null or one of the others: the first of the value's type
        if value is None and None in shape:
            return None
        shape = next((s for s in shape if s is not None and _fits(value, s)), shape)
    if isinstance(shape, tuple) or not _fits(value, shape):
        return field, f"must be {_want(shape)} (got {_got(value)})"
    if isinstance(shape, Is):
        return None
    if isinstance(shape, list):
        return next((m for i, v in enumerate(value) if (m := mismatch(v, shape[0], f"{field}[{i}]"))), None)
    if set(shape) == {"*"}:
        items = [(k, shape["*"]) for k in value]
    else:
        items = [(k.rstrip("?"), s) for k, s in shape.items() if not k.endswith("?") or k.rstrip("?") in value]
    for key, s in items:
        sub = f"{field}.{key}" if field else str(key)
        if key not in value:
            return sub, "missing"
        if (m := mismatch(value[key], s, sub)) is not None:
            return m
    return None


def check(value, shape, path, line: int = 0, field: str = ""):
    """`value` (read from `path`, on `line` of a JSONL file) if it has `shape`; otherwise a DataError
    (`file:line: field: problem`) or, for a whole file, an OpctError (`file: field: problem`)."""
    m = mismatch(value, shape, field)
    if m is None:
        return value
    where, problem = m
    if line:
        raise DataError(path, line, where or "<record>", problem)
    raise OpctError(f"{path}: {where + ': ' if where else ''}{problem}")


def read_checked(path, what: str, shape):
    """The JSON value in `path` (`opct.files.read_json`), checked against `shape`."""
    return check(read_json(path, what), shape, path)


# ------------------------------------------------------------------------------------------------ done.json
# A finished cell's marker, written last by the runner of many cells, with the fields that say which cell it marks;
# read back by the runner (to skip the cell), the reports and the studies, all through `read_done`.
SECONDS = (None, {"*": NUM})
METRICS = (None, {"*": {"value?": (None, NUM)}})
DONE_SHAPES = {
    "experiment": {"arm": NAME, "seed": INT, "seconds?": SECONDS},  # OUT/NAME/<arm>/<seed>/
    "threats": {"seed": INT, "threat": STR, "method": NAME, "seconds?": SECONDS, "metrics?": METRICS},
    "evaluation": {"model": STR, "adapter": (None, STR), "metrics?": METRICS},  # a robustness study's evaluation
}


def read_done(path, kind: str, folder: str = "", **cell) -> dict:
    """The done.json at `path` of a cell of `kind` (`DONE_SHAPES`), checked: each field that says which cell it marks
    there with its type, and equal to `cell` (field -> what the cell's `folder` says). Until 2026-12 a done.json
    without them (or with a seed of "0") was taken as its folder's, so one written by hand or by another tool marked
    any cell done; one of another cell (copied, moved or linked from another folder, 2026-12-07) was read as this
    one's."""
    done = read_checked(path, "done", DONE_SHAPES[kind])
    for key, want in cell.items():
        if done[key] != want:
            raise OpctError(f"{path}: {key}: {done[key]!r}, but the cell's folder is {folder}: a cell copied, moved "
                            f"or linked from another folder; put it back, or remove {Path(path).parent} to run it "
                            f"again")
    return done
