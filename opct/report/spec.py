"""What a report table is, as data: which metric goes in which column. Each axis declares its own tables
(`opct.axes`); `opct.report.tables` fills them from a run and renders them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Column:
    label: str
    metric: str  # the metric's full name, e.g. 'sycophancy.sycophancy_rate[split=heldout]'
    higher_is_better: bool | None = None  # used when no metrics file says
    delta: bool = False  # show the change from the base arm


@dataclass
class Table:
    key: str
    title: str
    columns: list[Column]
    note: str = ""
    groups: list = field(default_factory=list)  # per-group tables: the group values (for the plots)
    train_groups: set = field(default_factory=set)  # per-group tables: the groups trained on (shaded in the plots)
    ylabel: str = ""  # per-group tables: the plot's y-axis label
    arm_marks: dict = field(default_factory=dict)  # method -> a mark after the names of that method's arms (rows)
