"""What loading a model or adapter directory checks first, so that a damaged or mismatched one is an error naming
the file instead of a traceback from deep inside transformers — or, worse, a model that loads with some of its
weights silently re-initialised at random.

  check_device(device)          the device exists here (`--device cuda` on a machine without CUDA is an error)
  check_weights(model_dir)      safetensors weights are there and their headers read (a truncated file fails here);
                                pickle weights alone (pytorch_model.bin) are refused: opct never unpickles a model
  check_adapter(adapter_dir)    the same for a peft adapter (adapter_config.json + adapter_model.safetensors)
  check_loading_info(...)       every weight the configuration asks for was in the files and had its shape, and no
                                stored weight went unused (config.json describes these weights)
  check_adapter_loaded(...)     the same for a loaded adapter: its file holds exactly the tensors its config calls for
  check_finite_weights(...)     no weight holds NaN or inf (`non_finite`: the first that does, in one host sync)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from opct.errors import OpctError, first_line

PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def check_device(device, flag: str = "--device", instead: str = "--device cpu"):
    """`device` as a torch.device, or an OpctError naming `flag` when it is malformed or absent on this machine (and
    `instead`, the same setting on the CPU, where it is absent)."""
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise OpctError(f"{flag} {device}: not a torch device ({first_line(e)})") from None
    if d.type not in ("cpu", "cuda", "mps"):  # torch knows more (xla, meta, ...): opct's paths are not built for them
        raise OpctError(f"{flag} {device}: opct runs on cpu, cuda or mps, not {d.type}")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise OpctError(f"{flag} {device}: CUDA is not available ({why}); use {instead}")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise OpctError(f"{flag} {device}: there are only {torch.cuda.device_count()} CUDA device(s)")
    if d.type == "mps" and not torch.backends.mps.is_available():
        raise OpctError(f"{flag} {device}: MPS is not available on this machine; use {instead}")
    return d


def _check_safetensors(files: list[Path]) -> None:
    from safetensors import safe_open

    for f in files:
        try:
            with safe_open(str(f), "pt") as g:
                g.keys()
        except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: the file is damaged or unreadable
            raise OpctError(f"{f}: damaged or truncated safetensors file ({first_line(e)})") from None


def _refuse_pickles(folder: Path, what: str) -> None:
    pickles = sorted(p.name for pattern in PICKLES for p in folder.glob(pattern))
    if pickles:
        raise OpctError(f"{folder}: holds {what} only as pickles ({', '.join(pickles)}), which opct never loads "
                        f"(loading a pickle can run arbitrary code); save it as safetensors "
                        f"(save_pretrained(..., safe_serialization=True))")


_MODEL_FILE = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


def model_files_in(folder) -> list[str]:
    """The weights and adapter files at the top of `folder` (a model or adapter directory holds them), sorted: a
    run's --out that holds them is refused (train would write its config.json over the model's, eval its files
    among the model's)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.suffix in _MODEL_FILE or p.name == "adapter_config.json")


def refuse_model_dir(out, what: str) -> None:
    """An OpctError when `out`, a command's output directory, holds a model or an adapter (`model_files_in`): `opct
    eval`, `opct report` and `opct audit` wrote their files among the model's (`what`: what --out should be)."""
    if model := model_files_in(out):
        raise OpctError(f"{out}: holds a model or an adapter ({', '.join(model[:3])}), not {what}; choose another "
                        "--out")


def check_model_dir(model_dir) -> None:
    """A save_pretrained model directory: config.json and safetensors weights that open (`check_weights`)."""
    folder = Path(model_dir)
    if not (folder / "config.json").exists():
        raise OpctError(f"{folder}: not a model directory (no config.json); pass a directory written by "
                        f"save_pretrained")
    _json_object(folder / "config.json", "model config")
    for name in _JSON_FILES:  # damaged, each was "cannot load model or tokenizer (Expecting property name ...)",
        if (folder / name).is_file():  # naming no file (2026-12-07)
            _json_object(folder / name, name.removesuffix(".json").replace("_", " "))
    check_weights(folder)


# The JSON files of a save_pretrained directory besides config.json that transformers reads as it loads a model
_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
               "generation_config.json")


def _json_object(path: Path, what: str) -> dict:
    """The JSON object in `path`; an OpctError naming the file when it is not one (malformed, a list, a string)."""
    from opct.files import read_json

    data = read_json(path, what, strict=False)  # transformers and peft read these as json does
    if not isinstance(data, dict):
        raise OpctError(f"{path}: not a {what} (expected a JSON object, got {type(data).__name__})")
    return data


def _lines(e: BaseException) -> list[str]:
    """The non-blank lines of `e`'s message, stripped (its type's name when it has none)."""
    return [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]


def unbuildable(path, e: BaseException) -> OpctError:
    """The error for a config.json the model cannot be built from (a string for a size, 0 heads, an unknown dtype:
    TypeError, ZeroDivisionError, AttributeError, the hub's validation errors), `e` what transformers raised."""
    lines = _lines(e)  # a first line ending in ':' introduces the reason on the next ("Validation error for field
    # 'hidden_size':" / "TypeError: Field 'hidden_size' expected int, got str"), which was left out until 2026-12-07
    said = f"{lines[0]} {lines[1]}" if len(lines) > 1 and lines[0].endswith(":") else first_line(e, "no message")
    return OpctError(f"{Path(path) / 'config.json'}: the model cannot be built from it ({type(e).__name__}: {said})")


def load_tokenizer(path: Path, trust_remote_code: bool = False):
    """AutoTokenizer.from_pretrained(path); an OpctError naming config.json when that is what cannot be read (the
    tokenizer reads it too: a value the model cannot be built from), else naming the tokenizer's files, with what
    transformers looked for (its "... from one of:" and the list, not the cut-off first line)."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - no tokenizer files, or ones it cannot be built from
        try:
            AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        except Exception as c:  # noqa: BLE001 - as load_policy says of a model that cannot be built
            raise unbuildable(path, c) from None
        lines = _lines(e)
        said = " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]
        raise OpctError(f"{path}: cannot load the tokenizer (tokenizer.json, tokenizer_config.json: {said})") \
            from None


def check_weights(model_dir) -> None:
    folder = Path(model_dir)
    files = sorted(folder.glob("*.safetensors"))
    for f in files:  # a folder of that name was "damaged or truncated safetensors file (No such device)"
        if not f.is_file():
            raise OpctError(f"{f}: is {'a directory' if f.is_dir() else 'not a regular file'}, expected a "
                            "safetensors file")
    if not files:
        _refuse_pickles(folder, "its weights")
        raise OpctError(f"{folder}: no safetensors weights (model.safetensors) in the model directory")
    _check_safetensors(files)


def check_adapter(adapter_dir) -> None:
    folder = Path(adapter_dir)
    if folder.is_file():  # `--adapter RUN/final/adapter_config.json` said "(no adapter_config.json)" of that file
        raise OpctError(f"{folder}: is a file, not a peft adapter directory; give the directory that holds "
                        f"adapter_config.json and adapter_model.safetensors ({folder.parent})")
    if not (folder / "adapter_config.json").is_file():
        raise OpctError(f"{folder}: not a peft adapter directory (no adapter_config.json)")
    config = _json_object(folder / "adapter_config.json", "peft adapter config")
    if config.get("peft_type") != "LORA":  # PREFIX_TUNING and the like were a TypeError from inside peft
        raise OpctError(f"{folder / 'adapter_config.json'}: peft_type: opct loads LoRA adapters (\"LORA\"), got "
                        f"{config.get('peft_type')!r}")
    _check_lora_fields(config, folder / "adapter_config.json")
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        _refuse_pickles(folder, "the adapter")
        raise OpctError(f"{folder}: no adapter_model.safetensors in the adapter directory")
    _check_safetensors([weights])


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _names(v) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))


# The fields of a LoRA adapter_config.json that peft reads as it builds the adapter, and what each must be: a value of
# another type was a TypeError traceback from inside peft, a NaN lora_alpha a "loss not finite" at the first step
# (found 2026-12-07). Fields left out are peft's defaults.
_LORA_FIELDS = {
    "r": ("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
    "lora_alpha": ("a finite number", _number),
    "lora_dropout": ("a number in [0, 1)", lambda v: _number(v) and 0 <= v < 1),
    "target_modules": ("a module name or a list of them", lambda v: v is None or _names(v)),
    "modules_to_save": ("a list of module names", lambda v: v is None or _names(v)),
    "bias": ("one of none, all, lora_only", lambda v: v in ("none", "all", "lora_only")),
    "use_rslora": ("true or false", lambda v: isinstance(v, bool)),
    "use_dora": ("true or false", lambda v: isinstance(v, bool)),
    "fan_in_fan_out": ("true or false", lambda v: isinstance(v, bool)),
    "layers_to_transform": ("a layer index or a list of them", lambda v: v is None or (
        isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, list) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in v))),
    "rank_pattern": ("a mapping", lambda v: v is None or isinstance(v, dict)),
    "alpha_pattern": ("a mapping", lambda v: v is None or isinstance(v, dict)),
}


def stable_adapter_config(folder) -> None:
    """Write `folder/adapter_config.json` (peft's save_pretrained) with `target_modules` sorted. peft keeps the names
    as a set (`all-linear` resolves to one) and writes them in set order, which changes with each process's string
    hash seed: the same adapter saved again (a finished run resumed rewrites final/) got other bytes, so an eval that
    fingerprints its adapter refused to resume on it (found 2026-12-07). No adapter there: nothing done."""
    from opct.files import write_atomic

    path = Path(folder) / "adapter_config.json"
    if not path.exists():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
        write_atomic(path, json.dumps(config, indent=2, sort_keys=True))


def _check_lora_fields(config: dict, path: Path) -> None:
    for key, (want, ok) in _LORA_FIELDS.items():
        if key in config and not ok(config[key]):
            raise OpctError(f"{path}: {key}: must be {want} (got {json.dumps(config[key], default=str)[:40]})")


def adapter_load_problem(e: BaseException) -> str:
    """What a one-line error quotes of peft's failure to load an adapter: its "size mismatch" line when there is one
    (the first line only says "Error(s) in loading state_dict"), else its first line."""
    lines = _lines(e)
    return next((ln for ln in lines if "size mismatch" in ln), lines[0])


def check_adapter_loaded(peft_model, adapter_dir) -> None:
    """Every tensor the adapter's configuration calls for was in its adapter_model.safetensors, and nothing else: peft
    only warns of missing ones (left at their initial values: the adapter half loaded) and drops unexpected ones. An
    OpctError naming the file and the first few tensors otherwise."""
    from peft import get_peft_model_state_dict
    from safetensors import safe_open

    path = Path(adapter_dir) / "adapter_model.safetensors"
    with safe_open(str(path), "pt") as f:
        saved = set(f.keys())
    wanted = set(get_peft_model_state_dict(peft_model))
    problems = []
    for names, what in ((wanted - saved, "missing (the configuration's target modules need them)"),
                        (saved - wanted, "in the file but in no module the configuration adapts")):
        if names:
            shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
            problems.append(f"{len(names)} tensor(s) {what}: {shown}")
    if problems:
        raise OpctError(f"{path}: does not match its adapter_config.json on this model: " + "; ".join(problems))


def check_loading_info(model_dir, info: dict) -> None:
    """`info`: from_pretrained(..., output_loading_info=True)'s report. Missing or mismatched weights would be
    initialised at random, unexpected ones dropped: either way config.json does not describe the weights."""
    problems = []
    for key, what in (("missing_keys", "missing from the weights"), ("mismatched_keys", "of another shape"),
                      ("unexpected_keys", "in the weights but not in the configuration")):
        names = sorted(str(k if isinstance(k, str) else k[0]) for k in info.get(key) or ())
        if names:
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            problems.append(f"{len(names)} weight(s) {what} ({shown})")
    if problems:
        raise OpctError(f"{Path(model_dir) / 'config.json'}: does not match the weights: " + "; ".join(problems))


def check_finite_weights(model, path, adapter=None, dtype: str = "float32") -> None:
    """Every floating-point weight is finite; else an OpctError naming the file the tensor came from (the adapter's
    directory for a LoRA weight) and the tensor. A diverged or damaged checkpoint failed only at its first sample
    (under `inspect eval`: a traceback per sample and exit status 0); a weight too large for a 16-bit `dtype` becomes
    inf when loaded, which the message says."""
    bad = non_finite(model.named_parameters())
    if bad is not None:
        name, what = bad
        where = adapter if adapter is not None and "lora_" in name else path
        cast = "" if dtype == "float32" else f" (loaded as {dtype}: out of its range, or damaged)"
        raise OpctError(f"{where}: weight {name} holds {what}{cast}; a diverged or damaged checkpoint cannot be "
                        f"sampled from")


def non_finite(named) -> tuple[str, str] | None:
    """The first (name, "NaN" or "inf") of `named`, (name, tensor) pairs, whose floating-point tensor holds a value
    that is not finite; None when all are finite. One host sync for all of them (the training loop checks its
    trainable weights after every update), then a search only when something is wrong. The one pass is the tensors'
    norms in a fused multi-tensor op (a NaN or inf makes a norm so; about 7x cheaper than an isfinite per tensor, 0.4
    vs 2.7 ms per step over the default organism's 56 LoRA tensors); a norm that overflows on finite values only
    leads to the search, which then finds nothing."""
    import torch

    named = [(n, t) for n, t in named if t.is_floating_point()]
    if not named:
        return None
    device = named[0][1].device
    try:
        finite = bool(torch.isfinite(torch.stack([x.to(device) for x in torch._foreach_norm([t for _, t in named])]))
                      .all())
    except (RuntimeError, TypeError):  # a mix the fused op does not take: one isfinite per tensor
        finite = bool(torch.stack([torch.isfinite(t).all().to(device) for _, t in named]).all())
    if finite:
        return None
    bad = next(((n, t) for n, t in named if not bool(torch.isfinite(t).all())), None)
    return None if bad is None else (bad[0], "NaN" if bool(torch.isnan(bad[1]).any()) else "inf")
