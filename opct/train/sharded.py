"""Sharded optimizer state: DeepSpeed ZeRO-1/2 under `accelerate launch --use_deepspeed` or `torchrun`.

What the training loop does differently when accelerate runs DeepSpeed (`is_deepspeed(acc)`):

- the process group: on a machine without CUDA, accelerate picks no backend unless it is told one (with `cpu=True`
  it skips DeepSpeed altogether), and every rank then reports `num_processes == 1` while DeepSpeed's own group has
  all of them; `accelerator_kwargs()` passes `backend="gloo"` so both agree.
- the engine: opct's methods already divide their loss by the global count (DDP-style), so the engine must neither
  divide by its own accumulation steps nor step on its own: `managed_gradient_accumulation: false` makes
  `backward` only accumulate and `step()` the one boundary (reduce, clip to `max_grad_norm`, update).
- NaN skip: the engine computes the global gradient norm over every rank's shard and skips the update (on every
  rank, as the norm is all-reduced) when it is not finite. A rank whose loss is not finite back-propagates a NaN
  through every trainable parameter instead, so the engine's own check skips that step on all ranks together
  (a non-finite loss with finite gradients would otherwise be stepped on).
- equal backward counts: ZeRO-2 reduces in every backward, so a rank with fewer replay micro-batches than another
  (a step's replay rows split unevenly) runs zero-gradient backward passes in their place (`pad_backward`).
- checkpoints: each rank writes its optimizer shard (the base AdamW state of its flat partition and its fp32 master
  partition) as `optimizer-rank<r>.safetensors` (tensors) + `optimizer-rank<r>.json` (everything else); the weights
  are whole on every rank under ZeRO-1/2 and saved once, as without sharding. state.json records the sharding
  (`{"kind": "deepspeed", "zero_stage": 2, "world_size": N}`); a resume with another launch is refused.

ZeRO-3 and FSDP also shard the parameters (save_pretrained, the frozen teacher copy and the engine's generation would
need gathered weights): they are refused here, and their launches live in bench/gpu_check.sh (untested).

`accelerator()` makes the run's Accelerator and checks the launch: besides the sharding, what accelerate would do
behind the run's back is refused with the fix named — its own mixed precision (fp16, or bf16 without --bf16), its
torch.compile (a dynamo backend) and its gradient accumulation (which divides every loss in `accelerator.backward`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from opct.errors import OpctError, first_line


def _kind(accelerator) -> str:
    return str(accelerator.distributed_type).rsplit(".", 1)[-1]


def is_deepspeed(accelerator) -> bool:
    return _kind(accelerator) == "DEEPSPEED"


def accelerator_kwargs() -> dict:
    """Extra Accelerator arguments: the gloo backend for DeepSpeed on a machine without CUDA (see the docstring)."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" and not torch.cuda.is_available() \
            and "LOCAL_RANK" in os.environ:  # started by a launcher (without one, check_sharding says so)
        from accelerate.utils import InitProcessGroupKwargs

        return {"kwargs_handlers": [InitProcessGroupKwargs(backend="gloo")]}
    return {}


def zero_stage(accelerator) -> int | None:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return None if plugin is None else int(plugin.zero_stage)


def check_deepspeed_config_file() -> None:
    """The launch's DeepSpeed config file (`accelerate launch --deepspeed_config_file FILE`, handed to the processes
    as ACCELERATE_DEEPSPEED_CONFIG_FILE), read before accelerate reads it: a missing or malformed one is one line
    naming the file (and the line), where accelerate's own error named neither ("Expecting property name enclosed in
    double quotes: line 2 column 1")."""
    path = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true" or path in (None, "", "none"):
        return
    from opct.errors import DataError
    from opct.files import read_json

    what = "DeepSpeed config (accelerate launch --deepspeed_config_file)"
    if not Path(path).is_file():
        raise OpctError(f"{path}: {'not a file' if Path(path).exists() else 'no such file'}; the {what} must be a "
                        f"JSON file")
    config = read_json(path, what)
    if not isinstance(config, dict):
        raise DataError(path, 1, what, f"must be a JSON object (got {type(config).__name__})")


def accelerator(bf16: bool, **kwargs):
    """The run's Accelerator (with `accelerator_kwargs()`), with the launch checked (the module docstring): sharding
    (`check_sharding`), precision (`check_precision`), no dynamo backend, no accelerate-side gradient accumulation. A
    launch opct refuses is refused before accelerate sets it up where the environment tells (FSDP on a machine without
    a GPU would otherwise stop inside accelerate with its own traceback), and an error of accelerate's own setup (a
    launch this machine cannot run) is one line."""
    from accelerate import Accelerator

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        _refuse("FSDP")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" \
            and os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3":
        _refuse("DeepSpeed ZeRO-3")
    check_deepspeed_config_file()
    try:
        acc = Accelerator(**kwargs, **accelerator_kwargs())
    except (RuntimeError, ValueError) as e:
        launch = ", ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                           if k.startswith("ACCELERATE_USE_") and v.lower() == "true") or "no accelerate launch flags"
        reason = first_line(e)
        raise OpctError(f"accelerate could not set up this run ({launch}): {reason}") from None
    check_sharding(acc)
    check_precision(acc, bf16)
    backend = str(getattr(getattr(acc.state, "dynamo_plugin", None), "backend", "NO")).rsplit(".", 1)[-1]
    if backend.upper() != "NO":  # prepare would torch.compile the model; sampling and the teacher read its modules
        raise OpctError(f"accelerate was set to compile the model (dynamo backend {backend.lower()}: accelerate launch "
                        f"--dynamo_backend, ACCELERATE_DYNAMO_BACKEND or the accelerate config file), which opct does "
                        f"not support; launch with --dynamo_backend no")
    if not is_deepspeed(acc) and acc.gradient_accumulation_steps != 1:  # (DeepSpeed's is set to 1 in `configure`)
        raise OpctError(f"accelerate was set to accumulate gradients over {acc.gradient_accumulation_steps} steps "
                        f"(ACCELERATE_GRADIENT_ACCUMULATION_STEPS), which would divide every loss by that number: "
                        f"opct accumulates itself, --grad-accum N; unset it")
    return acc


def check_precision(acc, bf16: bool) -> None:
    """opct sets its precision itself (`--bf16`: its own autocast, recorded in config.json and checked on resume). A
    launch's mixed precision (`accelerate launch --mixed_precision`, or the accelerate config file that launch reads)
    would wrap the forward in its own autocast at `prepare` without the run knowing, and fp16 would add a loss scaler
    that opct neither checkpoints nor sees skip steps: refused unless it is bf16 asked for by --bf16 as well."""
    mp = str(getattr(acc, "mixed_precision", "no")).rsplit(".", 1)[-1].lower()
    if mp in ("no", "none") or (mp == "bf16" and bf16):
        return
    fix = "pass --bf16 to opct train (bf16 autocast over float32 weights)" if mp == "bf16" else \
        "opct trains in float32 or, with --bf16, bf16 autocast"
    raise OpctError(f"accelerate launched this run with mixed precision {mp} (accelerate launch --mixed_precision, or "
                    f"the accelerate config file it read), but opct sets the precision itself: {fix}, and launch with "
                    f"--mixed_precision no")


def _refuse(what: str):
    raise OpctError(f"accelerate launched this run with {what}, which shards the parameters: opct supports "
                    f"DeepSpeed ZeRO-1/2 (sharded optimizer state) and DDP; launch with "
                    f"`accelerate launch --use_deepspeed --zero_stage 2` or `--multi_gpu` instead "
                    f"(ZeRO-3 and FSDP are tried, untested, by bench/gpu_check.sh on a GPU)")


def check_sharding(accelerator) -> None:
    """Allow DDP and DeepSpeed ZeRO-1/2; refuse FSDP and ZeRO-3 with a clear error before anything trains."""
    kind = _kind(accelerator)
    if kind == "FSDP" or (kind == "DEEPSPEED" and zero_stage(accelerator) == 3):
        _refuse("FSDP" if kind == "FSDP" else "DeepSpeed ZeRO-3")
    if kind == "DEEPSPEED" and "LOCAL_RANK" not in os.environ:
        raise OpctError("ACCELERATE_USE_DEEPSPEED is set but no launcher started this process: run it through "
                        "`accelerate launch --use_deepspeed --zero_stage 2 --num_processes N -m opct.cli train ...` "
                        "(or torchrun)")
    if kind == "DEEPSPEED" and accelerator.num_processes == 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise OpctError(f"DeepSpeed sees {os.environ['WORLD_SIZE']} ranks but accelerate only 1 (no process group "
                        f"backend on this machine); this is a bug in opct.train.sharded.accelerator_kwargs")
    world = os.environ.get("WORLD_SIZE", "1")
    if accelerator.num_processes == 1 and world.isdigit() and int(world) > 1:
        # `torchrun --nproc_per_node 2` on a machine without GPUs: accelerate started no process group, so every rank
        # trained alone into the same folder (rank 0 ran, rank 1 hit its lock; found 2026-12-07)
        raise OpctError(f"launched as {world} processes (WORLD_SIZE={world}), but accelerate set up one: on a machine "
                        f"without GPUs set ACCELERATE_USE_CPU=1 (e.g. `ACCELERATE_USE_CPU=1 torchrun "
                        f"--nproc_per_node {world} -m opct.cli train ...`) so the processes train together over gloo")


def configure(accelerator, config) -> None:
    """Fill the DeepSpeed config before `accelerator.prepare` (see the module docstring)."""
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    ds["train_micro_batch_size_per_gpu"] = config.batch_size
    ds["gradient_accumulation_steps"] = 1
    ds["train_batch_size"] = config.batch_size * accelerator.num_processes
    ds["managed_gradient_accumulation"] = False
    ds["gradient_clipping"] = float(config.max_grad_norm)
    ds["zero_allow_untested_optimizer"] = True
    ds.setdefault("steps_per_print", 10 ** 9)  # no engine progress lines between opct's own
    for key in ("fp16", "bf16"):  # --bf16 is opct's own autocast over float32 weights (StepContext.autocast), as
        ds[key] = {"enabled": False}  # without DeepSpeed: its bf16 mode would cast the weights (and LoRA's teacher)
    accelerator.gradient_accumulation_steps = 1


def engine(accelerator):
    return accelerator.deepspeed_engine_wrapped.engine


def _through_every_parameter(model, value: float) -> torch.Tensor:
    """A scalar whose gradient is `value` for every trainable parameter (0: a backward that only takes part)."""
    return torch.stack([p.sum() for p in model.parameters() if p.requires_grad]).sum() * value


def backward(accelerator, model, loss: torch.Tensor) -> None:
    """One micro-batch's backward under DeepSpeed: accumulate only (the step is `step`). A non-finite loss sends a NaN
    through every trainable parameter instead: the engine reduces the gradients across ranks as they are made, so
    the NaN reaches every rank's shard, the global norm, and so every rank's decision to skip."""
    eng = engine(accelerator)
    if not bool(torch.isfinite(loss.detach()).all()):
        loss = _through_every_parameter(model, float("nan"))
    eng.backward(loss, scale_wrt_gas=False)


def pad_backward(accelerator, model, n: int) -> None:
    """`n` zero-gradient backward passes: ZeRO-2 reduces gradients in every backward, so every rank must run as many
    as the others, at the same point (benign replay splits a step's rows unevenly over the ranks)."""
    for _ in range(n):
        engine(accelerator).backward(_through_every_parameter(model, 0.0), scale_wrt_gas=False)


def step(accelerator) -> tuple[float, bool]:
    """The engine's optimizer step: (global grad norm before clipping, whether the update was applied)."""
    eng = engine(accelerator)
    eng.step()
    norm = eng.get_global_grad_norm()
    applied = eng.was_step_applied()
    return (float("inf") if norm is None or not applied else float(norm)), applied


# ------------------------------------------------------------------------------------------------ checkpoints

def manifest(accelerator) -> dict:
    return {"kind": "deepspeed", "zero_stage": zero_stage(accelerator), "world_size": accelerator.num_processes}


def _zero(accelerator):
    return engine(accelerator).optimizer  # DeepSpeedZeroOptimizer


def save_shard(folder: Path, accelerator) -> None:
    """Write this rank's optimizer shard as safetensors + JSON (the caller renames the folder into place)."""
    from safetensors.torch import save_file

    zero = _zero(accelerator)
    sd = zero.optimizer.state_dict()  # the base AdamW over this rank's flat partitions
    tensors, state = {}, {}
    for idx, entry in sd["state"].items():
        state[str(idx)] = {}
        for name, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"state.{idx}.{name}"] = value.detach().cpu().contiguous()
            else:
                state[str(idx)][name] = value
    for i, part in enumerate(zero.single_partition_of_fp32_groups):
        tensors[f"fp32.{i}"] = part.detach().cpu().contiguous()
    rank = accelerator.process_index
    save_file(tensors, str(folder / f"optimizer-rank{rank}.safetensors"))
    meta = {"param_groups": sd["param_groups"], "scalars": state, "groups": len(zero.single_partition_of_fp32_groups)}
    (folder / f"optimizer-rank{rank}.json").write_text(json.dumps(meta, sort_keys=True, indent=1))


def read_shard(folder: Path, accelerator) -> dict:
    """This rank's optimizer shard, read into memory (raises what the readers raise on a broken file)."""
    from safetensors.torch import load_file

    rank = accelerator.process_index
    meta = json.loads((folder / f"optimizer-rank{rank}.json").read_text())
    return {"meta": meta, "tensors": load_file(str(folder / f"optimizer-rank{rank}.safetensors"))}


def load_shard(shard: dict, accelerator, where: Path) -> None:
    zero = _zero(accelerator)
    meta, tensors = shard["meta"], shard["tensors"]
    if meta["groups"] != len(zero.single_partition_of_fp32_groups):
        raise OpctError(f"{where}: the optimizer shard has {meta['groups']} parameter groups, this run "
                        f"{len(zero.single_partition_of_fp32_groups)}")
    state = {}
    for idx, scalars in meta["scalars"].items():
        entry = dict(scalars)
        prefix = f"state.{idx}."
        entry.update({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
        state[int(idx)] = entry
    for i, part in enumerate(zero.single_partition_of_fp32_groups):
        saved = tensors[f"fp32.{i}"]
        if saved.shape != part.shape:
            raise OpctError(f"{where}: optimizer shard {i} holds {tuple(saved.shape)} values, this rank's partition "
                            f"{tuple(part.shape)} (another model, LoRA rank or world size?)")
        part.data.copy_(saved)
    zero.optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def end_processes() -> None:
    """Tear the process group down in order at the end of a launched run (what `opct train` does last, whether the
    run finished or stopped on an error). Left to the interpreter's exit, the engine and the group are destroyed in
    no particular order; a ZeRO-2 rank that stopped on an error (NaN steps) has been seen to abort there ("terminate
    called without an active exception", exit -6) after writing everything. Whatever of the run is no longer
    referenced is collected first (from `opct train`'s `finally`, an error still in flight keeps its frames alive;
    after a caught error, as in the test workers, they go too), then the group, as torch asks
    (`destroy_process_group`). Whether this removes that abort is not proven: it was not reproduced on demand."""
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
