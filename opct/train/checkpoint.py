"""Checkpoints that make `--resume` continue exactly where a run stopped.

    RUN/checkpoints/step-000040/
        adapter/ or model/      trainable weights, written by save_pretrained (safetensors; loadable on their own)
        optimizer.pt            optimizer state
        scheduler.pt            lr scheduler state
        rng-<rank>.pt           python, numpy, torch (and CUDA) RNG states of each process
        state.json              step, data position, NaN counters, world size

A checkpoint is written into `checkpoints/.tmp-step-000040` and renamed into place once complete, so a crash (or a
SIGKILL) never leaves a half-written checkpoint where `--resume` would find it. Older checkpoints are deleted only
after a newer one is in place.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from opct import files
from opct.errors import OpctError

PREFIX = "step-"


def write_json_atomic(path, obj) -> None:
    """Checkpoint and config JSON: sorted keys, indent 2 (diffable between runs), written atomically."""
    files.write_json_atomic(path, obj, indent=2, sort_keys=True)


def latest_checkpoint(run_dir) -> Path | None:
    root = Path(run_dir) / "checkpoints"
    done = sorted(p for p in root.glob(f"{PREFIX}*") if (p / "state.json").exists()) if root.exists() else []
    return done[-1] if done else None


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
    torch.save(_rng_state(), tmp / f"rng-{accelerator.process_index}.pt")
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        sub = "adapter" if hasattr(unwrapped, "peft_config") else "model"
        unwrapped.save_pretrained(tmp / sub, safe_serialization=True)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        write_json_atomic(tmp / "state.json", {**state, "step": step, "world_size": accelerator.num_processes})
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():  # the same step written by an earlier, interrupted attempt of this run
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in sorted(p for p in root.glob(f"{PREFIX}*") if p != final)[:-(keep - 1) or None]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def _load_weights(module, folder: Path) -> None:
    """Load safetensors written by save_pretrained (single file or shards) into `module`."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise OpctError(f"{folder}: no safetensors weights in checkpoint")
    if (folder / "adapter_config.json").exists():
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(module, load_file(files[0]))
        missing = [k for k in result.missing_keys if "lora_" in k]
    else:
        sd = {}
        for f in files:
            sd.update(load_file(f))
        result = module.load_state_dict(sd, strict=False)
        # save_pretrained drops tied copies (lm_head tied to the embeddings): they share storage with a loaded key.
        own = module.state_dict()
        loaded = {own[k].data_ptr() for k in sd if k in own}
        missing = [k for k in result.missing_keys if own[k].data_ptr() not in loaded]
    if missing:
        raise OpctError(f"{folder}: checkpoint lacks weights for {missing[:3]}; was it written by another model?")


def load_checkpoint(path: Path, accelerator, model, optimizer, scheduler) -> dict:
    """Restore weights, optimizer, scheduler and this process's RNG from `path`; return its state.json."""
    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    if state["world_size"] != accelerator.num_processes:
        raise OpctError(f"{path}: written by {state['world_size']} process(es), resumed with "
                        f"{accelerator.num_processes}; resume with the same number so data order and RNG match")
    unwrapped = accelerator.unwrap_model(model)
    _load_weights(unwrapped, path / ("adapter" if hasattr(unwrapped, "peft_config") else "model"))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    _set_rng_state(torch.load(path / f"rng-{accelerator.process_index}.pt", weights_only=True))
    return state
