"""What a subject is (see opct.subjects): a name, where its model comes from, and its items per axis."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Subject:
    name: str
    doc: str
    resolve: Callable[[], Path]  # the model directory, built or fetched as needed (slow work happens here)
    items: dict = field(default_factory=dict)  # axis -> items file (JSONL, the axis's user-item format)
    profile: Path | None = None  # its behaviour profile (profile.json), when one is shipped
    experiment: Path | None = None  # its experiment file (what `opct demo --subject NAME` runs), when one is shipped
    judge: str | None = None  # the jailbreak judge `--judge auto` means on its items (opct.evals.judges.JUDGES)
