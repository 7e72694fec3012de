"""Dataclass configs are the single source of truth: CLI flags and YAML/JSON config files derive from them.

`add_dataclass_args(parser, Cls)` adds one `--flag` per field (help text from the field's `metadata["help"]`);
`build_config(Cls, args, config_file)` layers defaults < config file < flags that were given on the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from pathlib import Path

from opct.errors import OpctError


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_dataclass_args(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or f.metadata.get("cli") is False:
            continue
        typ = hints[f.name]
        origin = typing.get_origin(typ)
        if origin is typing.Union:  # Optional[X]
            typ = next(a for a in typing.get_args(typ) if a is not type(None))
            origin = typing.get_origin(typ)
        kw = dict(dest=f.name, default=argparse.SUPPRESS, help=f.metadata.get("help", ""))
        if "choices" in f.metadata:
            kw["choices"] = f.metadata["choices"]
        if typ is bool:
            parser.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, **kw)
        elif origin in (list, tuple):
            (inner,) = typing.get_args(typ)[:1]
            parser.add_argument(_flag(f.name), nargs="*", type=inner, **kw)
        else:
            parser.add_argument(_flag(f.name), type=typ, **kw)


def load_config_file(path) -> dict:
    path = Path(path)
    if not path.exists():
        raise OpctError(f"{path}: config file not found")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001 - any parse error becomes a user error naming the file
        raise OpctError(f"{path}: cannot parse config: {e}") from None
    if not isinstance(data, dict):
        raise OpctError(f"{path}: a config file must hold a mapping of field names to values")
    return data


def build_config(cls, args: argparse.Namespace | None = None, config_file=None, **overrides):
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict = {}
    if config_file:
        data = load_config_file(config_file)
        unknown = set(data) - names
        if unknown:
            raise OpctError(f"{config_file}: unknown config field(s): {', '.join(sorted(unknown))}; "
                            f"known: {', '.join(sorted(names))}")
        values.update(data)
    if args is not None:
        values.update({k: v for k, v in vars(args).items() if k in names})
    values.update(overrides)
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise OpctError(f"invalid {cls.__name__}: {e}") from None
