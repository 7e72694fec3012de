"""Experiment trackers through accelerate's tracker API (`log_with`, `init_trackers`, `log`, `end_training`).

`--log-with tensorboard wandb ...` on `opct train`, `opct eval` and `opct run` (or `log_with: [...]` in a config)
logs training metrics per optimizer step, evaluation metrics (every metric's value, under its name) and, for an
experiment, each finished cell's headline metrics. A tracker whose package is not installed is left out with one
line saying so (`pip install 'opct[tensorboard]'`, `pip install 'opct[wandb]'`); nothing is installed by opct.
TensorBoard writes under the run directory (`RUN/trackers/`); wandb follows its own settings (`WANDB_MODE=offline`
for no network, `WANDB_DIR`).
"""

from __future__ import annotations

import importlib.util
import math
import sys

from opct.errors import OpctError, first_line

# tracker name (accelerate's) -> the module it needs
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "comet_ml": "comet_ml", "aim": "aim",
            "clearml": "clearml", "dvclive": "dvclive", "swanlab": "swanlab", "trackio": "trackio"}
HINTS = {"tensorboard": "pip install 'opct[tensorboard]'", "wandb": "pip install 'opct[wandb]'"}
# the module accelerate's tracker imports, where it is not the package itself
IMPORTS = {"tensorboard": "torch.utils.tensorboard"}


def usable(log_with, where: str = "--log-with") -> list[str]:
    """The requested trackers whose packages are installed and import; one line on stderr for each that does not
    (a package that is there but fails to import, e.g. against another protobuf, would otherwise stop the run with a
    traceback from inside accelerate once the model is loaded)."""
    out = []
    for name in log_with or ():
        module = PACKAGES.get(name, name)
        if importlib.util.find_spec(module) is None:
            hint = HINTS.get(name, f"pip install {module}")
            print(f"opct: note: {where} {name}: the {module} package is not installed ({hint}); not logging to it",
                  file=sys.stderr)
            continue
        try:
            importlib.import_module(IMPORTS.get(name, module))
        except Exception as e:  # noqa: BLE001 - whatever a broken install raises, the run goes on without it
            print(f"opct: note: {where} {name}: the {module} package is installed but cannot be imported "
                  f"({type(e).__name__}: {first_line(e)}); not logging to it", file=sys.stderr)
            continue
        out.append(name)
    return out


def scalars(values: dict) -> dict:
    """The finite numbers (and booleans as 0/1) of a flat dict; a tracker's hyper-parameters and metrics."""
    out = {}
    for k, v in values.items():
        if isinstance(v, bool):
            out[k] = int(v)
        elif isinstance(v, (int, float)) and math.isfinite(v):
            out[k] = v
        elif isinstance(v, str):
            out[k] = v
    return out


def metric_values(metrics: dict, prefix: str = "eval/") -> dict:
    """opct metrics ({name: {"value", ...}}) as tracker scalars: name -> value, the unmeasured left out."""
    return {prefix + k: m["value"] for k, m in metrics.items()
            if isinstance(m, dict) and isinstance(m.get("value"), (int, float)) and math.isfinite(m["value"])}


def resume_kwargs(names, first_step: int | None) -> dict | None:
    """accelerate's `init_kwargs` for trackers that log again from `first_step` over a run that logged past it (a
    resumed training: the steps after its checkpoint, which the killed run may have logged already; an evaluation
    resumed or run again: its step 0). TensorBoard is told `purge_step`, so its readers drop the earlier events at
    those steps rather than show each step twice. Other trackers keep what they have: a step logged before a kill
    and again after the resume is there twice (wandb starts a new run on each resume)."""
    if first_step is None or "tensorboard" not in (names or ()):
        return None
    return {"tensorboard": {"purge_step": first_step}}


class Trackers:
    """Trackers outside a training loop (an evaluation, an experiment): an accelerate Accelerator used for its
    tracker API only. `None`-safe: with no usable tracker every call does nothing."""

    def __init__(self, log_with, project_dir, name: str, config: dict | None = None, where: str = "--log-with",
                 first_step: int | None = None):
        """`first_step`: the first step this run logs, when earlier events at it and after it are replaced (an
        evaluation's step 0; see `resume_kwargs`)."""
        self.acc = None
        names = usable(log_with, where)
        if names:
            from accelerate import Accelerator

            try:
                self.acc = Accelerator(log_with=names, project_dir=str(project_dir))
            except (RuntimeError, ValueError) as e:  # a launch accelerate cannot set up here (FSDP without a GPU)
                reason = first_line(e)
                raise OpctError(f"{where}: accelerate could not set up its trackers here: {reason}") from None
            self.acc.init_trackers(name, config=scalars(config or {}), init_kwargs=resume_kwargs(names, first_step))

    def log(self, values: dict, step: int | None = None) -> None:
        if self.acc is not None and values:
            self.acc.log(values, step=step)

    def close(self) -> None:
        if self.acc is not None:
            self.acc.end_training()
            self.acc = None
