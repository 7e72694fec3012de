"""Reading a config file (YAML or JSON) into a mapping, safely: a key set twice is an error naming both lines, a
string that is not valid Unicode names its field, YAML aliases may not expand past MAX_CONFIG_VALUES values, and a
config given through a pipe (`--config <(...)`) is read once and remembered. `opct.config` builds the dataclass
configs from what this returns (`opct.config.load_config_file` is this module's)."""

from __future__ import annotations

import copy
import os
import stat
from collections.abc import Hashable
from pathlib import Path

from opct.errors import OpctError, first_line, os_problem
from opct.files import check_unicode, read_text, strict_loads

PIPE_WAIT_S, PIPE_MAX_BYTES = 10.0, 16 << 20
_PIPED: dict = {}  # (path, device, inode) of a pipe -> the config read from it


def _read_pipe(path) -> str:
    """What a writer sends through the pipe `path` (UTF-8): waiting at most PIPE_WAIT_S for it to start (a named pipe
    no process writes to blocked forever), and at most PIPE_MAX_BYTES (`<(yes)` would fill memory)."""
    import select

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise OpctError(f"{path}: {os_problem(e)}") from None
    try:
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        if not poll.poll(int(PIPE_WAIT_S * 1000)):
            raise OpctError(f"{path}: a named pipe that nothing was written to within {PIPE_WAIT_S:g} s; give a file")
        os.set_blocking(fd, True)
        data = bytearray()
        while block := os.read(fd, 1 << 16):
            data += block
            if len(data) > PIPE_MAX_BYTES:
                raise OpctError(f"{path}: more than {PIPE_MAX_BYTES >> 20} MiB came through the pipe; give a file")
    finally:
        os.close(fd)
    try:
        return bytes(data).decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise OpctError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None


def _strict_yaml(text: str, path: Path):
    """yaml.safe_load, but a key set twice in one mapping is an OpctError naming both lines (YAML keeps the last one
    without a word, so a second `lr:` further down would silently win)."""
    import yaml

    class _Strict(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        lines: dict = {}
        for key_node, _ in node.value:
            # a merge key (`<<: *defaults`) brings in keys that the mapping's own may override, as YAML says:
            # only the mapping's own keys are checked here, and construct_mapping expands the merge
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if not isinstance(key, Hashable):
                kind = "mapping" if isinstance(key, dict) else type(key).__name__
                raise OpctError(f"{path}:{line}: a key must be a name, not a {kind}")
            if key in lines:
                raise OpctError(f"{path}:{line}: {key} is set twice (first on line {lines[key]}); keep one")
            lines[key] = line
        return loader.construct_mapping(node, deep=deep)

    _Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(text, Loader=_Strict)  # noqa: S506 - a SafeLoader


# A config is a few hundred values; YAML's aliases can make a few lines expand to billions (each alias a reference
# to an earlier node, "billion laughs"), which every walk over the settings (checks, run.json) would then visit.
MAX_CONFIG_VALUES = 100_000


def _check_expanded(data, path) -> None:
    """An OpctError when `data`, its aliases expanded, holds more than MAX_CONFIG_VALUES values (counted once per
    node: a shared node's count is remembered, so the count itself stays cheap)."""
    sizes: dict[int, int] = {}

    def size(v) -> int:
        if not isinstance(v, (dict, list)):
            return 1
        if id(v) not in sizes:
            sizes[id(v)] = 0  # a node that holds itself (a recursive alias) counts once
            items = [*v.keys(), *v.values()] if isinstance(v, dict) else v
            sizes[id(v)] = min(1 + sum(size(x) for x in items), MAX_CONFIG_VALUES + 1)
        return sizes[id(v)]

    if size(data) > MAX_CONFIG_VALUES:
        raise OpctError(f"{path}: expands to more than {MAX_CONFIG_VALUES:,} values (YAML aliases referring to "
                        "aliases); a config holds a few hundred: write the values out")


def _where(path, e) -> str:
    """`path`, with the line of a YAML error when the parser marked one (its message's first line does not say it)."""
    import yaml

    mark = (e.problem_mark or e.context_mark) if isinstance(e, yaml.MarkedYAMLError) else None
    return f"{path}:{mark.line + 1}" if mark is not None else str(path)


def _problem(e) -> str:
    """A parse error in words: YAML's own problem (not its context lines), and a tag no config may use named as such
    (safe loading constructs no Python objects: `!!python/tuple` and the like)."""
    import yaml

    problem = (e.problem if isinstance(e, yaml.MarkedYAMLError) else None) or first_line(e)
    if problem.startswith("could not determine a constructor for the tag"):
        tag = problem.split("'")[1] if problem.count("'") >= 2 else problem
        return f"unsupported tag {tag.replace('tag:yaml.org,2002:', '!!')} (a config holds plain values: names, " \
               "numbers, lists and mappings)"
    return problem


def _yaml(text: str, path: Path):
    data = _strict_yaml(text, path)
    _check_expanded(data, path)
    data = check_unicode(data)
    if data is None:  # nothing but blanks and comments: a mistake more likely than "every default"
        raise OpctError(f"{path}: holds no settings (empty, or comments only); leave the file out to use the defaults")
    return data


def _json_or_yaml(text: str, path: Path):
    """JSON when the text parses as JSON, else YAML; when neither does, the error of the one it looks like (JSON
    when it starts with a brace or a bracket)."""
    import json

    try:
        return strict_loads(text)
    except json.JSONDecodeError as json_error:
        try:
            return _yaml(text, path)
        except OpctError:
            raise
        except Exception:  # noqa: BLE001 - reported as the parse error of the format it looks like
            if text.lstrip()[:1] in ("{", "["):
                raise json_error from None
            raise


def load_config_file(path) -> dict:
    path = Path(path)
    if not path.exists():
        raise OpctError(f"{path}: config file not found")
    if path.is_dir():
        raise OpctError(f"{path}: is a directory, not a config file")
    st = os.stat(path)
    piped = (str(path), st.st_dev, st.st_ino) if stat.S_ISFIFO(st.st_mode) else None
    if piped in _PIPED:  # a pipe can be read once; `opct run <(...)` reads its file again for each loader
        return copy.deepcopy(_PIPED[piped])
    # a byte-order mark is dropped; `--config <(...)` is read (once)
    text = _read_pipe(path) if piped is not None else read_text(path)
    try:
        if path.suffix in (".yaml", ".yml"):
            data = _yaml(text, path)
        elif not text.strip():
            raise OpctError(f"{path}: holds no settings (empty); leave the file out to use the defaults")
        elif path.suffix == ".json":
            data = strict_loads(text)
        else:  # a pipe (`--config <(...)`, /dev/fd/63) or another name: JSON, else YAML (a YAML config through a
            data = _json_or_yaml(text, path)  # pipe was "Expecting value: line 1 column 1" until 2026-12-07)
    except OpctError:
        raise
    except RecursionError:
        raise OpctError(f"{path}: cannot parse config: nested too deeply") from None
    except Exception as e:  # noqa: BLE001 - any parse error becomes a user error naming the file
        raise OpctError(f"{_where(path, e)}: cannot parse config: {_problem(e)}") from None
    if not isinstance(data, dict):
        raise OpctError(f"{path}: a config file must hold a mapping of field names to values")
    if piped is not None:
        _PIPED[piped] = copy.deepcopy(data)
    return data
