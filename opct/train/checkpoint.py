"""Checkpoints that make `--resume` continue exactly where a run stopped.

    RUN/checkpoints/step-000040/
        adapter/ or model/      trainable weights, written by save_pretrained (safetensors; loadable on their own)
        optimizer.pt            optimizer state (one process, or DDP)
        optimizer-rank<r>.*     DeepSpeed ZeRO-1/2: each rank's optimizer shard, safetensors + JSON
                                (opct.train.sharded); state.json then records the sharding
        scheduler.pt            lr scheduler state
        rng-<rank>.pt           python, numpy, torch (and CUDA) RNG states of each process
        state.json              step, data position, NaN counters, world size, the size and SHA-256 of every
                                other file, and the SHA-256 of its own content (`state_sha256`; written last)

A checkpoint is written into `checkpoints/.tmp-step-000040` and renamed into place once complete, so a crash (or a
SIGKILL) never leaves a half-written checkpoint where `--resume` would find it. Older checkpoints are deleted only
after a newer one is in place.

Only finite weights are written: the training loop checks the weights after every update and stops at the step
whose update made one NaN or inf, before any checkpoint holds it (the starting weights were checked when loaded, a
resumed checkpoint's when read); a checkpoint is "good" (`good_checkpoint`, what an error names) only when they are.

`resume` reads the newest checkpoint whole and checks it (state.json against its own hash, every other file against
its recorded size and hash, every file loadable, every weight finite) before touching the model; a damaged one
(truncated, garbled, edited, a disk error, diverged weights) is moved aside to `checkpoints/damaged-step-...`, said
so, and the next older kept checkpoint is used. With none intact it stops with an error naming each checkpoint and
what is wrong with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from opct import files
from opct.errors import OpctError, first_line, os_problem
from opct.modeldir import stable_adapter_config

PREFIX = "step-"


def write_json_atomic(path, obj) -> None:
    """Checkpoint and config JSON: sorted keys, indent 2 (diffable between runs), written atomically."""
    files.write_json_atomic(path, obj, indent=2, sort_keys=True)


def checkpoints(run_dir) -> list[Path]:
    """Every checkpoint directory of a run, oldest first (complete or not; not the temporary or damaged ones); none
    when RUN/checkpoints does not exist. One that cannot be listed is an OpctError: read as "no checkpoint", it would
    have a resume start the run over and drop its metrics."""
    root = Path(run_dir) / "checkpoints"
    if not os.path.lexists(root):
        return []
    if not root.is_dir():
        raise OpctError(f"{root}: not a folder (where the run keeps its checkpoints); move it aside and resume")
    try:
        names = os.listdir(root)
    except OSError as e:
        raise OpctError(f"{root}: cannot list the run's checkpoints ({e.strerror or first_line(e)})") from None
    return sorted(root / n for n in names if n.startswith(PREFIX))


def latest_checkpoint(run_dir) -> Path | None:
    done = [p for p in checkpoints(run_dir) if (p / "state.json").exists()]
    return done[-1] if done else None


def good_checkpoint(run_dir) -> Path | None:
    """The newest complete checkpoint whose weights can be read and are all finite: the "last good checkpoint" an
    error names (this version writes no other kind; one written before it, or damaged, is passed over)."""
    from safetensors.torch import load_file

    from opct.modeldir import non_finite

    for path in reversed([p for p in checkpoints(run_dir) if (p / "state.json").exists()]):
        weights = sorted(w for d in ("adapter", "model") for w in (path / d).glob("*.safetensors"))
        try:
            if weights and all(non_finite(load_file(w).items()) is None for w in weights):
                return path
        except Exception:  # noqa: BLE001 - unreadable: not good, whatever the reader raised
            continue
    return None


def checkpoint_step(folder: Path) -> int | None:
    """The step a checkpoint folder is named for (`step-000012` -> 12), or None for a name without one."""
    number = folder.name[len(PREFIX):]
    return int(number) if folder.name.startswith(PREFIX) and number.isdigit() else None


def _manifest(folder: Path) -> dict:
    """{relative path: {"bytes", "sha256"}} of every file in a checkpoint but state.json."""
    return {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": files.sha256(p)}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "state.json"}


# Everything in a checkpoint is plain data (tensors, numbers, strings, lists), so it loads with
# torch.load(weights_only=True): resuming never unpickles arbitrary objects.

def _rng_state() -> dict:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss,
                                                    gauss], "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextmanager
def rng_kept():
    """Leave the RNG states (python, numpy, torch, CUDA) as they were before the block, whatever it draws.

    The loop runs a method's preparation inside it: offpolicy's trajectories and sampled SFT / BCT targets are drawn
    on a fresh run but read back from the run directory on a resume, so without it the steps after them (LoRA
    dropout) would draw other numbers in a run resumed before its first checkpoint than in the uninterrupted one.
    """
    state = _rng_state()
    try:
        yield
    finally:
        _set_rng_state(state)


def save_checkpoint(run_dir, step: int, accelerator, model, optimizer, scheduler, state: dict, keep: int) -> Path:
    """Write checkpoint `step` atomically; every process must call this (each saves its own RNG state)."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp-{PREFIX}{step:06d}"
    if accelerator.is_main_process:
        if tmp.exists():  # left over from a run killed while writing
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    from opct.train import sharded

    try:
        torch.save(_rng_state(), tmp / f"rng-{accelerator.process_index}.pt")
        if sharded.is_deepspeed(accelerator):
            sharded.save_shard(tmp, accelerator)
        if accelerator.is_main_process:
            unwrapped = accelerator.unwrap_model(model)
            sub = "adapter" if hasattr(unwrapped, "peft_config") else "model"
            unwrapped.save_pretrained(tmp / sub, safe_serialization=True)
            stable_adapter_config(tmp / sub)  # the same adapter, the same bytes (whatever the hash seed)
            if not sharded.is_deepspeed(accelerator):
                torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        accelerator.wait_for_everyone()  # every rank's RNG file (and optimizer shard) is written
        if accelerator.is_main_process:
            extra = {"sharding": sharded.manifest(accelerator)} if sharded.is_deepspeed(accelerator) else {}
            record = {**state, **extra, "step": step, "world_size": accelerator.num_processes,
                      "files": _manifest(tmp)}
            record.pop(STATE_HASH, None)
            write_json_atomic(tmp / "state.json", {**record, STATE_HASH: _state_digest(record)})
    except Exception as e:  # noqa: BLE001 - torch.save and safetensors report a full disk in their own ways
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise write_failed(root, e, f"the checkpoint of step {step}",
                           f"earlier checkpoints are intact: {latest_checkpoint(run_dir) or 'none yet'}") from None
    if accelerator.is_main_process:
        if final.exists():  # the same step written by an earlier, interrupted attempt of this run
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in sorted(p for p in root.glob(f"{PREFIX}*") if p != final)[:-(keep - 1) or None]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def write_failed(path: Path, e: Exception, what: str, note: str) -> OpctError:
    """The error to raise when writing `what` into `path` failed with `e` (torch.save on a full disk says only
    "unexpected pos ...": the free space is checked here)."""
    reason = os_problem(e) if isinstance(e, OSError) else first_line(e)
    try:
        if shutil.disk_usage(path.parent if not path.exists() else path).free < (1 << 20):
            reason = "no space left on device"
    except OSError:
        pass
    return OpctError(f"{path}: cannot write {what} ({reason}); {note}")


class _Damaged(Exception):
    """A checkpoint that cannot be read back as written."""


# state.json's counters and their least values: the loop continues from them (a missing one stopped the resume with
# a KeyError; a negative step re-ran steps from below 1 and dropped every metrics line of the run)
STATE_COUNTERS = {"step": 1, "world_size": 1, "pairs_consumed": 0, "nan_steps": 0, "consecutive_nan": 0}


# state.json's hash of its own content: it holds the other files' hashes, so an edit of its counters (a resume from
# another data position) or an emptied manifest (no file checked) would otherwise pass unseen
STATE_HASH = "state_sha256"


def _state_digest(record: dict) -> str:
    """SHA-256 of a state.json's content but its own hash (canonical JSON: sorted keys, no spaces)."""
    text = json.dumps({k: v for k, v in record.items() if k != STATE_HASH}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _state_problem(state) -> str | None:
    """What is wrong with the shape of a checkpoint's state.json (read as JSON), or None. It is not in the manifest
    (it holds it); its own hash (`STATE_HASH`) is checked after this, which catches any other edit, but cannot say
    which field changed."""
    if not isinstance(state, dict):
        return "state.json is not a JSON object"
    for key, least in STATE_COUNTERS.items():
        v = state.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            return f"state.json's {key} is not an integer >= {least} (got {json.dumps(v)})"
    return None


def _read(path: Path, accelerator) -> dict:
    """Everything in checkpoint `path`, read into memory and checked; raises _Damaged saying what is wrong."""
    from safetensors.torch import load_file

    if not os.access(path / "state.json", os.R_OK) and (path / "state.json").exists():
        raise OpctError(f"{path / 'state.json'}: permission denied (the checkpoint is there, but cannot be read)")
    try:
        state = files.read_json(path / "state.json", "state")
    except OpctError as e:
        raise _Damaged(str(e)) from None
    if (problem := _state_problem(state)) is not None:
        raise _Damaged(problem)
    if path.name != f"{PREFIX}{state['step']:06d}":
        raise _Damaged(f"state.json's step {state['step']} is not this checkpoint's")
    manifest = state.pop("files", None)
    if not isinstance(manifest, dict) or not all(isinstance(w, dict) and isinstance(w.get("bytes"), int)
                                                 and isinstance(w.get("sha256"), str) for w in manifest.values()):
        raise _Damaged("state.json's files is not a manifest (file -> bytes and sha256)")
    if not manifest:  # every checkpoint has weights, scheduler and RNG files: an empty one would check nothing
        raise _Damaged("state.json's files is empty (no file's size and SHA-256 recorded)")
    recorded = state.pop(STATE_HASH, None)
    if recorded is None:  # written before state.json hashed itself: a run started then still resumes
        print(f"opct: note: {path / 'state.json'} records no {STATE_HASH} (written by an opct before 2026-12-06): "
              f"its counters are taken as they are; its other files are checked", file=sys.stderr)
    elif recorded != _state_digest({**state, "files": manifest}):
        raise _Damaged("state.json does not match its recorded SHA-256 (edited or garbled)")
    if state["world_size"] != accelerator.num_processes:  # not damage: the user's launch differs
        raise OpctError(f"{path}: written by {state['world_size']} process(es), resumed with "
                        f"{accelerator.num_processes}; resume with the same number so data order and RNG match")
    from opct.train import sharded

    now = sharded.manifest(accelerator) if sharded.is_deepspeed(accelerator) else None
    if state.get("sharding") != now:  # not damage either: the launch differs
        said = lambda m: ("without sharding" if m is None  # noqa: E731
                          else f"under DeepSpeed ZeRO-{m.get('zero_stage')}")
        raise OpctError(f"{path}: written {said(state.get('sharding'))}, resumed {said(now)}; resume with the same "
                        f"launch (its optimizer state is laid out for it)")
    for name, want in manifest.items():
        f = path / name
        if not f.is_file():
            raise _Damaged(f"{name} is missing")
        if f.stat().st_size != want["bytes"]:
            raise _Damaged(f"{name} is {f.stat().st_size} bytes, {want['bytes']} were written (truncated?)")
        if files.sha256(f) != want["sha256"]:
            raise _Damaged(f"{name} does not match its recorded SHA-256 (garbled)")
    out = {"state": state}
    try:
        sub = next((path / d for d in ("adapter", "model") if (path / d).is_dir()), None)
        weights = sorted(sub.glob("*.safetensors")) if sub is not None else []
        if not weights:
            raise _Damaged("no safetensors weights (adapter/ or model/)")
        out["folder"], out["weights"] = sub, {}
        for w in weights:
            out["weights"].update(load_file(w))
        from opct.modeldir import non_finite

        if (bad := non_finite(out["weights"].items())) is not None:  # written before finite weights were checked
            raise _Damaged(f"{sub.name}/ weight {bad[0]} holds {bad[1]} (the run had diverged)")
        files_ = (("scheduler", "scheduler.pt"), ("rng", f"rng-{accelerator.process_index}.pt"))
        if now is None:
            files_ = (("optimizer", "optimizer.pt"), *files_)
        else:
            out["shard"] = sharded.read_shard(path, accelerator)
        for key, name in files_:
            out[key] = torch.load(path / name, map_location="cpu" if key != "rng" else None, weights_only=True)
    except _Damaged:
        raise
    except PermissionError as e:  # not damage: the file is there, the user can give it back its permissions
        raise OpctError(f"{e.filename or path}: permission denied (the checkpoint is there, but cannot be "
                        f"read)") from None
    except Exception as e:  # noqa: BLE001 - whatever the readers raise on a broken file (OSError, pickle, zip, ...)
        raise _Damaged(f"{type(e).__name__}: {first_line(e, 'unreadable')}") from None
    return out


def _load_weights(module, folder: Path, sd: dict) -> None:
    """Load safetensors tensors `sd` written by save_pretrained (from `folder`) into `module`."""
    if (folder / "adapter_config.json").exists():
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(module, sd)
        missing = [k for k in result.missing_keys if "lora_" in k]
    else:
        result = module.load_state_dict(sd, strict=False)
        # save_pretrained drops tied copies (lm_head tied to the embeddings): they share storage with a loaded key.
        own = module.state_dict()
        loaded = {own[k].data_ptr() for k in sd if k in own}
        missing = [k for k in result.missing_keys if own[k].data_ptr() not in loaded]
    if missing:
        raise OpctError(f"{folder}: checkpoint lacks weights for {missing[:3]}; was it written by another model?")


def _apply(got: dict, accelerator, model, optimizer, scheduler) -> dict:
    unwrapped = accelerator.unwrap_model(model)
    _load_weights(unwrapped, got["folder"], got["weights"])
    if "shard" in got:
        from opct.train.sharded import load_shard

        load_shard(got["shard"], accelerator, got["folder"].parent)
    else:
        optimizer.load_state_dict(got["optimizer"])
    scheduler.load_state_dict(got["scheduler"])
    _set_rng_state(got["rng"])
    return got["state"]


def resume(run_dir, accelerator, model, optimizer, scheduler) -> dict:
    """Restore the newest intact checkpoint of `run_dir` (see the module docstring); return its state.json."""
    root = Path(run_dir) / "checkpoints"
    found = checkpoints(run_dir)[::-1]
    damaged: list[tuple[Path, str]] = []
    for path in found:
        try:
            got = _read(path, accelerator)
        except _Damaged as e:
            damaged.append((path, str(e)))
            continue
        accelerator.wait_for_everyone()  # every rank has chosen before any damaged checkpoint moves
        if damaged and accelerator.is_main_process:
            for bad, why in damaged:
                aside = bad.with_name(f"damaged-{bad.name}")
                n = 1
                while aside.exists():
                    n += 1
                    aside = bad.with_name(f"damaged-{bad.name}.{n}")
                os.replace(bad, aside)
                print(f"opct train: checkpoint {bad} is damaged ({why}); moved it to {aside.name} and resumed "
                      f"from {path.name} instead", file=sys.stderr)
        return _apply(got, accelerator, model, optimizer, scheduler)
    raise OpctError(f"{run_dir}: no intact checkpoint to resume from ("
                    + "; ".join(f"{p.name}: {why}" for p, why in damaged)
                    + f"); delete {root} and metrics.jsonl to start the run over")
