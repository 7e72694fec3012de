"""What `--trained` and `pair_options` name, parsed and checked (`opct eval`, experiments, `opct pairs`)."""

from __future__ import annotations

from opct.config import ConfigError


def parse_trained(values: list[str]) -> dict[str, list[str]]:
    """`--trained AXIS=F1,F2 AXIS2=...` -> {AXIS: [F1, F2], AXIS2: [...]} (`AXIS=` for nothing trained)."""
    out: dict[str, list[str]] = {}
    for v in values:
        axis, sep, fams = v.partition("=")
        if not sep or not axis.strip() or axis.strip() in out:  # an axis named twice: the last one won silently
            raise ValueError(f"expected AXIS=FAMILY,FAMILY,... once per axis (got {v!r})")
        names = [f.strip() for f in fams.split(",")] if fams.strip() else []
        if "" in names:  # `AXIS=a,,b` dropped the empty name
            raise ValueError(f"an empty family name in {v!r} (write AXIS= for nothing trained)")
        out[axis.strip()] = names
    return out


def check_trained(trained: dict | None, field: str = "trained") -> None:
    """Every axis of `trained` is registered and makes pairs; every family is one of the axis's."""
    from opct.axes import AXES

    for axis, fams in (trained or {}).items():
        if axis not in AXES or AXES[axis].task is None:
            known = [n for n, a in AXES.items() if a.task is not None]
            raise ConfigError(f"{field}.{axis}", f"not an axis that trains on pairs (known: {', '.join(known)})")
        a = AXES[axis]
        if any(not f.strip() for f in fams):
            raise ConfigError(f"{field}.{axis}", "an empty family name (an empty list for nothing trained)")
        bad = [f for f in fams if f not in a.families]
        if bad and not a.open_families:
            raise ConfigError(f"{field}.{axis}", f"unknown {', '.join(bad)}; known: {', '.join(a.families)}")
        if len(set(fams)) != len(fams):
            raise ConfigError(f"{field}.{axis}", "families must not repeat")


def check_pair_options(options: dict, field: str = "pair_options") -> None:
    """Every option names one the axis declares, with one of its allowed values."""
    from opct.axes import AXES

    for axis, opts in (options or {}).items():
        if axis not in AXES:
            raise ConfigError(f"{field}.{axis}", f"not an axis (known: {', '.join(AXES)})")
        if not isinstance(opts, dict):
            raise ConfigError(f"{field}.{axis}", f"must be a mapping of option names to values (got {opts!r})")
        known = AXES[axis].pair_options
        for k, v in opts.items():
            if k not in known:
                raise ConfigError(f"{field}.{axis}.{k}", f"unknown option; {axis} takes: "
                                                         f"{', '.join(known) or 'none'}")
            if v not in known[k]:
                raise ConfigError(f"{field}.{axis}.{k}", f"must be one of {', '.join(known[k])} (got {v!r})")
