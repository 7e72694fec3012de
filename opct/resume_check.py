"""The "did the settings change on resume" check of train, run, threats and audit (re-exported by opct.config).

  changes(saved, now, may_change, defaults, same)   fields whose values differ, as 'field (old -> new)'
  EQUIVALENT[field] = fn            values of `field` that `fn` maps to the same thing are no change
                                    (cpu_matmul: `auto` is whichever backend it picks on this machine)
  block_defaults(saved, **blocks), defaults_of(cls)   what a field missing from a saved config counts as
  restart_allowed(root, settings, changed)   other settings are fine where nothing was run with the saved ones
  check_extended(saved, path, **shapes)      the lists and mappings a rerun extends have the shape it wrote

and "did the inputs change on resume" (a run's files, by content, where its settings hold only their paths), of
train's RUN/inputs.json and an eval's run.json:
  weights_fingerprint(model)        one fingerprint of a model's or adapter's safetensors files
  files_fingerprint(model)          one of its configuration, tokenizer and chat-template files (MODEL_FILES)
  folder_fingerprint(folder)        one fingerprint of every file under a folder (lm-eval task YAMLs)
  changed_inputs(saved, now)        the inputs whose recorded fingerprint differs from the one found now
"""

from __future__ import annotations

import dataclasses
import typing

# field name -> what a value stands for on this machine (registered by the config that owns the field)
EQUIVALENT: dict[str, typing.Callable[[object], object]] = {}


def _meaning(field: str, value):
    """`value` of `field` as EQUIVALENT maps it (the value itself for other fields, or one it cannot map)."""
    try:
        return EQUIVALENT.get(field, lambda v: v)(value)
    except (TypeError, ValueError):
        return value


def changes(saved: dict, now: dict, may_change=(), defaults: dict | None = None, same=None) -> list[str]:
    """Fields whose value differs between a run's saved settings and the current ones, as 'field (old -> new)': the
    one "did the settings change on resume" check of train, run and audit. A field missing from `saved` counts as
    its entry in `defaults` (a field added after the run started); `same(field, old, new)` may accept two values
    that differ (e.g. paths of a moved run directory). A field that is a mapping on both sides (a nested config's
    block: an experiment's `train` and `eval`) is compared key by key and named by its dotted path
    ('train.lr (0.01 -> 0.02)'), never as two whole mappings; `may_change` may name such a path too, and a mapping
    in `defaults` is that block's defaults (a TrainConfig field added after an experiment started). Two values that
    EQUIVALENT maps to the same thing here are no change."""
    saved = {**(defaults or {}), **saved}
    out = []
    for k in sorted(set(saved) | set(now)):
        old, new = saved.get(k), now.get(k)
        if (k in may_change or old == new or (same is not None and same(k, old, new))
                or (k in EQUIVALENT and _meaning(k, old) == _meaning(k, new))):
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            inner = tuple(m[len(k) + 1:] for m in may_change if isinstance(m, str) and m.startswith(f"{k}."))
            inner_defaults = (defaults or {}).get(k)
            out += [f"{k}.{c}" for c in changes(old, new, inner,
                                                inner_defaults if isinstance(inner_defaults, dict) else None)]
        else:
            out.append(f"{k} ({_changed(k, old)} -> {_changed(k, new)})")
    return out


def _changed(field: str, value) -> str:
    """`value` for a changes() message, with what it stands for here where EQUIVALENT maps it to something else."""
    meaning = _meaning(field, value)
    return _short(value) + ("" if meaning == value else f" (= {_short(meaning)} here)")


def _short(value, limit: int = 120) -> str:
    """A value's repr for an error message, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 4] + " ..."


def block_defaults(saved: dict, **blocks) -> dict:
    """`changes`' defaults for the nested config blocks (name -> config class) that `saved` holds: a field added to
    a block after the run started counts as that field's default."""
    return {name: defaults_of(cls) for name, cls in blocks.items() if isinstance(saved.get(name), dict)}


def defaults_of(cls) -> dict:
    """Each field's default value (fields without one are left out)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = f.default_factory()  # type: ignore[misc]
    return out


def restart_allowed(root, settings: str, changed: list[str]) -> bool:
    """Whether a run directory whose saved settings differ (`changed`, from `changes`) may start again with the new
    ones: it holds only its settings file `settings` (and its lock and run_inputs.json), so nothing was run with
    the old ones (e.g. a mistyped model path stopped it before its first pairs or cell). Says so in a note on stderr
    when it may."""
    import sys
    from pathlib import Path

    from opct.files import LOCK_NAME

    root = Path(root)
    if not changed or not {p.name for p in root.iterdir()} <= {settings, LOCK_NAME, "run_inputs.json"}:
        return False
    print(f"opct: note: {root}: nothing was run with its earlier settings; starting again with these "
          f"({', '.join(changed)})", file=sys.stderr)
    return True


# What check_extended accepts for each shape: a list of seeds, a list of names, a JSON object, one of JSON objects.
_SHAPES = {
    "seeds": ("a list of seeds (integers from 0 to 4294967295)", lambda v: isinstance(v, list) and all(
        isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2 ** 32 for x in v)),  # -1 was "not started"
    "names": ("a list of names", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "mapping": ("a mapping", lambda v: isinstance(v, dict)),
    "mappings": ("a mapping of names to settings", lambda v: isinstance(v, dict) and all(
        isinstance(x, dict) for x in v.values())),
}


def check_extended(saved: dict, path, **shapes: str) -> None:
    """The saved settings a rerun extends (the seeds, arms or methods it adds to, the mappings it merges), as the run
    wrote them: `shapes` maps a key to "seeds", "names", "mapping" or "mappings". A key of another shape (a
    hand-edited or damaged file) is an OpctError naming the file and the key, where the rerun stopped with a
    TypeError traceback, or ran its cells and wrote the mix back."""
    from opct.errors import OpctError

    for key, shape in shapes.items():
        want, ok = _SHAPES[shape]
        if key in saved and not ok(saved[key]):
            raise OpctError(f"{path}: {key}: expected {want}, got {_short(saved[key])}")


def _model_folder(model: str):
    """The directory of a model or adapter (or of the subject's model `model` names); None when there is none (the
    loader names the problem)."""
    from pathlib import Path

    from opct.subjects import SUBJECTS, resolve

    if model not in SUBJECTS and not Path(model).is_dir():
        return None
    return Path(resolve(model)[0])


def _digest(named, where=None) -> str:
    """One SHA-256 over (name, `opct.files.fingerprint` of the file) for each (name, path) of `named`, in order; a
    file that cannot be read is an OpctError naming it (or `where`)."""
    import hashlib

    from opct import files
    from opct.errors import OpctError

    h = hashlib.sha256()
    for name, p in named:
        try:
            h.update(f"{name}:{files.fingerprint(p)}\n".encode())
        except OSError as e:
            raise OpctError(f"{where or p}: {files.os_problem(e)}") from None
    return h.hexdigest()


def weights_fingerprint(model: str) -> str | None:
    """One fingerprint (`opct.files.fingerprint`) over the safetensors files of a model or adapter directory (or of
    the subject's model it names), by file name; None when there are none to read (the loader reports that).
    Gigabytes of weights are not hashed whole on every start and resume: a replaced or retrained model is what this
    catches."""
    folder = _model_folder(model)
    weights = sorted(p for p in folder.glob("*.safetensors") if p.is_file()) if folder is not None else []
    return _digest([(p.name, p) for p in weights]) if weights else None


# The files beside a model's or adapter's weights that change what it computes or the prompts it is given.
MODEL_FILES = ("config.json", "generation_config.json", "adapter_config.json", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
               "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model")


def files_fingerprint(model: str) -> str | None:
    """One fingerprint (`opct.files.fingerprint`) over the MODEL_FILES of a model or adapter directory (or of the
    subject's model it names), by file name: an edited chat template, tokenizer or config.json changes the prompts
    or the model as surely as new weights. None when there are none (or no such directory: the loader says so)."""
    folder = _model_folder(model)
    found = [folder / n for n in MODEL_FILES if (folder / n).is_file()] if folder is not None else []
    return _digest([(p.name, p) for p in found]) if found else None


def folder_fingerprint(folder) -> str | None:
    """One fingerprint (`opct.files.fingerprint`) over every file under `folder`, by relative path (a file added,
    removed, renamed or changed changes it); None when `folder` is not a folder (its reader names the problem)."""
    from pathlib import Path

    from opct import files
    from opct.errors import OpctError

    folder = Path(folder)
    if not folder.is_dir():
        return None
    try:
        found = sorted(p for p in folder.rglob("*") if p.is_file())
    except OSError as e:
        raise OpctError(f"{folder}: {files.os_problem(e)}") from None
    return _digest([(p.relative_to(folder).as_posix(), p) for p in found], where=folder)


def changed_inputs(saved: dict, now: dict) -> list[str]:
    """The inputs of `now` (name -> fingerprint) whose fingerprint in `saved` (what the run recorded) differs; an
    input the run did not record (a run started before it was, or a file not there then) is not compared."""
    return [k for k, v in now.items() if saved.get(k, v) != v]
