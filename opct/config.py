"""Dataclass configs are the single source of truth: CLI flags and YAML/JSON config files derive from them, and one
loader reads every config file (train, eval, attack, experiment, audit).

  option(default, help, **rules)    a field, with its help text and the rules its value must meet:
                                    choices=[...], ge= / gt= / le= bounds, nonempty=True, device=True (a torch
                                    device string), threads=True (no more than this machine's CPUs), required=True
                                    (checked by `require`), cli=False (not a flag), file=False (a flag only, never
                                    from a file), flag_parse=fn (turns the flag's list of strings into the value)
  validate(obj)                     every config's __post_init__ calls it: each field's value is coerced to its
                                    declared type and checked against its rules; a problem raises ConfigError
  build_config(cls, args, path, data, **overrides)   defaults < file < given flags < overrides, reported as
                                    `FILE: field: problem` (nested: `FILE: train.max_steps: problem`) or
                                    `--flag: problem`, before any work starts
  add_dataclass_args(parser, cls)   one --flag per field
  changes(saved, now, may_change)   the "did the settings change on resume" check (train, run and audit), with
                                    EQUIVALENT, block_defaults, defaults_of, restart_allowed (opct/resume_check.py,
                                    re-exported)

Coercion is strict where a wrong guess would run something else than the user meant, and lenient where YAML reads a
value differently from how users write it:
  int    an int, or an integral float or numeric string (`1e3` -> 1000); `2.5`, `ten` and booleans are errors;
  float  an int, a float or a numeric string (YAML reads `1e-4` as a string); NaN and infinity are errors;
  bool   true or false only: the string "false" is an error (it is not the boolean false);
  str    a string only (write numbers in quotes);
  list   a list only: a scalar is an error (`arms: opct` is not the list [o, p, c, t]), each element coerced;
  dict   a mapping; a nested config dataclass is built from its mapping with the same rules.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import math
import typing

from opct.config_file import MAX_CONFIG_VALUES, load_config_file  # noqa: F401  (re-exported)
from opct.errors import OpctError, first_line
from opct.files import blank
from opct.flags import OnceList
from opct.resume_check import EQUIVALENT, block_defaults, changes, defaults_of, restart_allowed  # noqa: F401


class ConfigError(OpctError, ValueError):
    """A config value that breaks its field's type or rules. `field`: its dotted path ("": a mapping as a whole)."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}" if field else problem)  # not 'arms.x.<file>: ...'

    def under(self, prefix: str) -> "ConfigError":
        return ConfigError(".".join(p for p in (prefix, self.field) if p), self.problem)


def unread(field: str, now: str, reads: str, fix: str = "remove it") -> ConfigError:
    """The error for a setting the run never reads (`opct.train.config.USED_BY`, `opct.evals.used`): `now` is what
    this run has instead, `reads` what would read it."""
    return ConfigError(field, f"does nothing in this run ({now}): it is for {reads}; {fix}")


# The rules of a seed (`option(0, "...", **SEED)`): numpy's generators take 0 .. 2**32 - 1 and nothing else.
SEED = {"ge": 0, "le": 2 ** 32 - 1}


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer (got {text!r})") from None


def seed_arg(text: str) -> int:
    """argparse `type=` for a --seed flag: an integer numpy's generators take (0 .. 2**32 - 1)."""
    value = _integer(text)
    if not SEED["ge"] <= value <= SEED["le"]:
        raise argparse.ArgumentTypeError(f"must be from {SEED['ge']} to {SEED['le']} (got {value})")
    return value


def positive_arg(text: str) -> int:
    """argparse `type=` for a count (--n, --batch-size, --per-family): an integer of at least 1."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def nonneg_arg(text: str) -> int:
    """argparse `type=` for a count that may be 0 (0 meaning none, or "the default"): an integer of at least 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more (got {value})")
    return value


def option(default=dataclasses.MISSING, help: str = "", factory=None, **rules):
    """A config field: `default` (or `factory` for a mutable default), its help text and its rules."""
    meta = {"help": help, **rules}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# ------------------------------------------------------------------------------------------------ coercion

def _shown(v) -> str:
    if isinstance(v, str):
        return f"the string {v!r}"
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return f"a list {json.dumps(list(v), default=str)[:60]}"
    if isinstance(v, dict):
        return "a mapping"
    return repr(v)


def _number(value, name: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(name, f"must be {what} (got {_shown(value)})")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ConfigError(name, f"must be {what} (got {_shown(value)})") from None
    return value


def coerce(value, typ, name: str):
    """`value` as `typ` (see the module docstring), or ConfigError naming `name`."""
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        if value is None and len(inner) < len(args):
            return None
        return coerce(value, inner[0], name)
    if typ is typing.Any:
        return value
    if typ is bool:
        if isinstance(value, bool):
            return value
        hint = " (write it without quotes)" if isinstance(value, str) and value.lower() in ("true", "false") else ""
        raise ConfigError(name, f"must be true or false (got {_shown(value)}){hint}")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        x = _number(value, name, "an integer")
        if not (math.isfinite(x) and float(x).is_integer()):
            raise ConfigError(name, f"must be an integer (got {_shown(value)})")
        return int(x)
    if typ is float:
        x = float(_number(value, name, "a number"))
        if not math.isfinite(x):
            raise ConfigError(name, f"must be a finite number (got {value!r})")
        return x
    if typ is str:
        if isinstance(value, str):
            return value
        raise ConfigError(name, f"must be a string (got {_shown(value)}; write it in quotes)")
    if origin in (list, tuple) or typ in (list, tuple):
        if not isinstance(value, (list, tuple)):
            one = "; leave it out for the default" if value is None else f"; write [{value}] for a list of one"
            raise ConfigError(name, f"must be a list (got {_shown(value)}{one})")
        inner = args[0] if args else typing.Any
        return [coerce(v, inner, f"{name}[{i}]") for i, v in enumerate(value)]
    if origin is dict or typ is dict:
        if not isinstance(value, dict):
            raise ConfigError(name, f"must be a mapping (got {_shown(value)})")
        kt, vt = args if args else (str, typing.Any)
        return {coerce(k, kt, name): coerce(v, vt, f"{name}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(typ):
        if isinstance(value, typ):
            return value
        if isinstance(value, dict):
            return construct(typ, value, prefix=name)
        raise ConfigError(name, f"must be a mapping of {typ.__name__} fields (got {_shown(value)})")
    return value


def _check_rules(value, meta, name: str) -> None:
    if value is None:
        return
    if isinstance(value, str) and value and blank(value):  # `--out ' '` wrote into a directory named ' '
        raise ConfigError(name, "is blank (only whitespace); give a value or leave it out")
    choices = meta.get("choices")
    if choices is not None:
        for i, v in enumerate(value if isinstance(value, list) else [value]):
            if v not in choices:
                where = f"{name}[{i}]" if isinstance(value, list) else name
                known = ", ".join(map(str, choices))
                raise ConfigError(where, f"unknown {meta['noun']} {v!r}; known: {known}" if "noun" in meta
                                  else f"must be one of {known} (got {v!r})")
            if isinstance(value, list) and v in value[:i]:  # `--log-with tensorboard tensorboard`: two hparams runs
                raise ConfigError(f"{name}[{i}]", f"{v!r} is given twice")
    numbers = [(name, value)] if not isinstance(value, list) else [(f"{name}[{i}]", v) for i, v in enumerate(value)]
    for where, v in numbers:  # a bound holds for a number, and for each number of a list
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            for key, ok, word in (("ge", v >= meta.get("ge", -math.inf), ">="),
                                  ("gt", v > meta.get("gt", -math.inf), ">"),
                                  ("le", v <= meta.get("le", math.inf), "<=")):
                if key in meta and not ok:
                    raise ConfigError(where, f"must be {word} {meta[key]} (got {v})")
    if meta.get("threads") and isinstance(value, int) and value > _cpus():  # torch's thread pools: 10^5 crashed
        raise ConfigError(name, f"must be <= {_cpus()}, the CPUs of this machine (got {value}); more threads than "
                                "CPUs only slow torch down")
    if meta.get("nonempty") and not value:
        raise ConfigError(name, "must not be empty")
    if meta.get("device") and isinstance(value, str):  # whether this machine has it is checked where it is used
        import torch

        try:
            torch.device(value)
        except (RuntimeError, TypeError) as e:
            raise ConfigError(name, f"{value!r} is not a torch device ({first_line(e)})") from None


def _cpus() -> int:
    import os

    return os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def validate(obj) -> None:
    """Coerce and check every field of the dataclass instance `obj` in place (call it from __post_init__)."""
    for f in dataclasses.fields(obj):
        setattr(obj, f.name, _checked(type(obj), f, getattr(obj, f.name)))


def _checked(cls, f: dataclasses.Field, value):
    """`value` for field `f` of `cls`, coerced to its declared type and checked against its rules (a ConfigError)."""
    value = coerce(value, _hints(cls)[f.name], f.name)
    if value == "" and f.default is None:  # `--adapter ''` loaded the adapter in '.'
        raise ConfigError(f.name, "is empty; give a value or leave it out (it has none by default)")
    _check_rules(value, f.metadata, f.name)
    return value


def require(obj, *names: str) -> None:
    """Fields marked required=True (or named) must be non-empty, reported as their flag: `--model is required`."""
    for f in dataclasses.fields(obj):
        if (f.metadata.get("required") or f.name in names) and not getattr(obj, f.name):  # blanks: `_check_rules`
            raise OpctError(f"{_flag(f.name)} is required ({f.metadata.get('help', '')})")


def _label(cls) -> str:
    """How a config file of `cls` is named in messages ('unknown experiment field(s)'); 'config' by default."""
    return getattr(cls, "CONFIG_LABEL", "config")


def check_keys(cls, data: dict, prefix: str = "", reserved=(), label: str | None = None) -> None:
    """Every key of `data` names a field of `cls` that a file may set."""
    label = label or cls.__name__
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted((str(k) for k in data if k not in fields))  # YAML keys may be numbers (`1: 2`): a TypeError
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(fields), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(prefix, f"unknown {label} field(s) {', '.join(unknown)}{hint}; known: "
                                            f"{', '.join(sorted(fields))}")
    clash = sorted(set(data) & set(reserved))
    if clash:
        raise ConfigError(prefix,
                          f"{', '.join(clash)} {'is' if len(clash) == 1 else 'are'} set by the runner per arm and "
                          f"seed; remove {'it' if len(clash) == 1 else 'them'}")
    for k in data:
        if fields[k].metadata.get("file") is False and data[k] not in (None, False, fields[k].default):
            raise ConfigError(f"{prefix}.{k}" if prefix else k, f"can only be switched on by the command-line flag "
                                                                 f"{_flag(k)}, never from a file")


def construct(cls, data: dict, prefix: str = "", reserved=()):
    """`cls(**data)` for a mapping read from a file: unknown keys, flag-only fields and bad values are ConfigErrors
    under `prefix` (the field path of a nested block)."""
    if not isinstance(data, dict):
        raise ConfigError(prefix, f"must be a mapping of {cls.__name__} fields (got {_shown(data)})")
    check_keys(cls, data, prefix, reserved)
    try:
        return cls(**data)
    except ConfigError as e:
        raise e.under(prefix) from None


# ------------------------------------------------------------------------------------------------ files and flags

def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_dataclass_args(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or f.metadata.get("cli") is False:
            continue
        typ = hints[f.name]
        if typing.get_origin(typ) is typing.Union:  # Optional[X]
            typ = next(a for a in typing.get_args(typ) if a is not type(None))
        origin = typing.get_origin(typ)
        kw = dict(dest=f.name, default=argparse.SUPPRESS, help=f.metadata.get("help", ""))
        if "choices" in f.metadata and typ is not list and origin is not list:
            kw["choices"] = f.metadata["choices"]
        if "flag_parse" in f.metadata:
            parser.add_argument(_flag(f.name), nargs="*", action=OnceList, metavar=f.metadata.get("metavar"), **kw)
        elif typ is bool:
            parser.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, **kw)
        elif origin in (list, tuple):
            (inner,) = typing.get_args(typ)[:1]
            parser.add_argument(_flag(f.name), nargs="*", action=OnceList, type=inner, **kw)
        else:
            parser.add_argument(_flag(f.name), type=typ, **kw)


def flag_values(cls, args: argparse.Namespace | None) -> dict:
    """The fields of `cls` given as flags on the command line (parsed by their `flag_parse` where they have one)."""
    if args is None:
        return {}
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in vars(args):
            v = getattr(args, f.name)
            parse = f.metadata.get("flag_parse")
            if parse is not None:
                try:
                    v = parse(v)
                except ValueError as e:
                    raise OpctError(f"{_flag(f.name)}: {e}") from None
            out[f.name] = v
    return out


def build_config(cls, args: argparse.Namespace | None = None, config_file=None, data: dict | None = None, *,
                 check=None, **overrides):
    """`cls` from its defaults < the config file (or `data`, already read from `config_file`) < the flags given on
    the command line < `overrides`. A bad value is an OpctError naming the file and field or the flag; so is a
    ConfigError from `check(config)`, a command's own rule on the whole config."""
    source: dict[str, str] = {}
    values: dict = {}
    flags = flag_values(cls, args)
    if config_file is not None or data is not None:
        file_data = load_config_file(config_file) if data is None else data
        where = str(config_file) if config_file is not None else "config"
        try:
            check_keys(cls, file_data, label=_label(cls))
            for f in dataclasses.fields(cls):  # a value a flag replaces is still checked (exit status 0 until 12-07)
                if f.name in file_data and f.name in flags and f.name not in overrides:
                    _checked(cls, f, file_data[f.name])
        except ConfigError as e:
            raise OpctError(f"{where}: {e}") from None
        values.update(file_data)
        source.update(dict.fromkeys(file_data, where))
    values.update(flags)
    source.update(dict.fromkeys(flags, "--"))
    values.update(overrides)
    for k in overrides:
        source.pop(k, None)
    try:
        config = cls(**values)
        if check is not None:
            check(config)
        return config
    except ConfigError as e:
        top = e.field.split(".")[0].split("[")[0]
        src = source.get(top)
        # a field given nowhere that is a flag of this command is named as that flag
        unset_flag = src is None and args is not None and top not in overrides and any(
            f.name == top and f.metadata.get("cli", True) for f in dataclasses.fields(cls))
        if src == "--" or unset_flag:
            # a switch turned off is named as the user typed it (`--no-rl-attack`, not `--rl-attack`)
            off = src == "--" and values.get(top) is False and defaults_of(cls).get(top) is True
            flag = "--no-" + top.replace("_", "-") if off else _flag(top)
            raise OpctError(f"{flag}{e.field[len(top):]}: {e.problem}") from None
        raise OpctError(f"{src or _label(cls)}: {e}") from None
    except TypeError as e:  # a field name that is not one of cls's (from overrides)
        raise OpctError(f"invalid {cls.__name__}: {e}") from None
