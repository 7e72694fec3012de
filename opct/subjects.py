"""Subjects (DESIGN §1): the models opct studies by name, each with where its model comes from and, per axis, the
items it is trained and evaluated on.

  default   the shipped model organism (opct/organisms/default): the synthetic world's items on every axis
  test      a tiny organism built on the spot (about a minute): the world's items

`model: NAME` in an experiment and `--model NAME` on `opct train` / `opct eval` name a subject; anything else is a
`save_pretrained` directory (the world's items, unless `--items` says otherwise). A subject that brings its own
items (a real model, whose knowledge is not the world's) lists an items file per axis: the runner makes that axis's
training pairs from it and evaluates on it, with the judge the axis uses on a user's items. `register(Subject(...))`
adds one (a module of opct, or a plugin imported through OPCT_AXES).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from opct.errors import OpctError


@dataclass(frozen=True)
class Subject:
    name: str
    doc: str
    resolve: Callable[[], Path]  # the model directory, built or fetched as needed (slow work happens here)
    items: dict = field(default_factory=dict)  # axis -> items file (JSONL, the axis's user-item format)


def _organism(size: str) -> Callable[[], Path]:
    def resolve() -> Path:
        from opct.organism.build import build_organism

        return build_organism(size)
    return resolve


SUBJECTS: dict[str, Subject] = {}


def register(subject: Subject) -> Subject:
    SUBJECTS[subject.name] = subject
    return subject


register(Subject("default", "the shipped model organism (the synthetic world)", _organism("default")))
register(Subject("test", "a tiny organism, built on the spot (about a minute)", _organism("test")))


def resolve(model: str) -> tuple[str, Subject | None]:
    """(model directory, the subject it names or None) for a subject name or a save_pretrained directory."""
    if model in SUBJECTS:
        s = SUBJECTS[model]
        return str(s.resolve()), s
    if not Path(model).is_dir():
        raise OpctError(f"model {model!r}: not a directory (give a subject — {', '.join(SUBJECTS)} — or a "
                        f"save_pretrained directory)")
    return model, None


def items_of(subject: Subject | None, axis: str) -> str | None:
    """The subject's items file for `axis`, or None for the world's."""
    if subject is None:
        return None
    path = subject.items.get(axis)
    return None if path is None else str(path)
