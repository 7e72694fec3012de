"""Experiment trackers through accelerate's tracker API (`log_with`, `init_trackers`, `log`, `end_training`).

`--log-with tensorboard wandb ...` on `opct train`, `opct eval` and `opct run` (or `log_with: [...]` in a config)
logs training metrics per optimizer step, evaluation metrics (every metric's value, under its name) and, for an
experiment, each finished cell's headline metrics. A tracker whose package is not installed is left out with one
line saying so (`pip install 'opct[tensorboard]'`, `pip install 'opct[wandb]'`); nothing is installed by opct.
TensorBoard writes under the run directory (`RUN/trackers/`); wandb follows its own settings (`WANDB_MODE=offline`
for no network, `WANDB_DIR`), and a resumed training or evaluation continues its wandb run (the id in
`RUN/trackers/wandb-run-id`).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import secrets
import sys
from contextlib import contextmanager
from pathlib import Path

from opct.errors import OpctError, first_line
from opct.files import read_text, write_atomic

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


WANDB_ID_FILE = "wandb-run-id"


def wandb_run_id(folder) -> str:
    """The wandb run id of the run whose tracker files live in `folder`: made on its first call and kept in
    `folder/wandb-run-id`, so a resumed training (or evaluation) logs into the wandb run it began rather than a new
    one. A file that does not hold an id (damaged) is replaced by a new id, with one line saying so: a tracker's id
    is not worth stopping a run for."""
    path = Path(folder) / WANDB_ID_FILE
    run_id = ""
    if path.is_file():
        run_id = read_text(path).strip()
        if not re.fullmatch(r"[0-9a-z]{8,64}", run_id):
            print(f"opct: note: {path}: not a wandb run id; starting a new wandb run", file=sys.stderr)
            run_id = ""
    if not run_id:
        run_id = secrets.token_hex(8)
        write_atomic(path, run_id + "\n")
    return run_id


def tracker_kwargs(names, first_step: int | None, folder=None) -> dict | None:
    """accelerate's `init_kwargs` for `names`' trackers, in a run that may log again from `first_step` over one
    that logged past it (a resumed training: the steps after its checkpoint, which the killed run may have logged
    already; an evaluation resumed or run again: its step 0).

    TensorBoard is told `purge_step`, so its readers drop the earlier events at those steps rather than show each
    step twice. wandb runs with `reinit="create_new"`: opct opens runs inside runs in one process (an experiment's,
    around each cell's training and evaluation), where wandb's default would finish the open one. When `folder` is
    given (the run's tracker folder), wandb also gets the run's own id with `resume="allow"` (`wandb_run_id`): one
    wandb run across resumes, whose steps only go forward, so a step logged again after a resume (the same value:
    resume is exact) is dropped by wandb rather than kept twice; offline, each part is a run folder with that id
    (`wandb sync --id ID` joins them). `WANDB_RUN_ID` in the environment takes precedence (wandb's own setting).
    Other trackers keep both."""
    names, kwargs = names or (), {}
    if first_step is not None and "tensorboard" in names:
        kwargs["tensorboard"] = {"purge_step": first_step}
    if "wandb" in names:
        kwargs["wandb"] = {"reinit": "create_new"}
        if folder is not None and not os.environ.get("WANDB_RUN_ID"):
            kwargs["wandb"].update(id=wandb_run_id(folder), resume="allow")
    return kwargs or None


def start(acc, name: str, config: dict, init_kwargs: dict | None) -> None:
    """`acc.init_trackers(name, ...)`, with the run's settings (`config`) stored by each tracker: wandb's on its own
    run, where accelerate would write them to wandb's global run, which a run opened with `reinit="create_new"` (see
    `tracker_kwargs`) is not."""
    acc.init_trackers(name, init_kwargs=init_kwargs)
    for tracker in acc.trackers:
        if tracker.name == "wandb":
            tracker.run.config.update(config, allow_val_change=True)
        else:
            tracker.store_init_configuration(config)


@contextmanager
def ended(acc, on: bool = True):
    """The block's trackers ended (`finish`) however it is left, an error or an interrupt included: wandb's run
    finished and TensorBoard's events flushed, so a caller in the same process (an experiment's next cell, a resume
    after a caught KeyboardInterrupt) starts its own run rather than writing into an unfinished one."""
    try:
        yield
    finally:
        if on:
            finish(acc)


def finish(acc) -> None:
    """`acc.end_training()` less its last act, which destroys the process group: a run of several processes still
    saves final/ and waits for every rank after its trackers end (until 2026-12-07 `--log-with` under a launch of 2
    processes failed there: "Default process group has not been initialized")."""
    for tracker in acc.trackers:
        tracker.finish()


class Trackers:
    """Trackers outside a training loop (an evaluation, an experiment): an accelerate Accelerator used for its
    tracker API only; a context manager that closes them. `None`-safe: with no usable tracker every call does
    nothing."""

    def __init__(self, log_with, project_dir, name: str, config: dict | None = None, where: str = "--log-with",
                 first_step: int | None = None, resumable: bool = False):
        """`first_step`: the first step this run logs, when earlier events at it and after it are replaced (an
        evaluation's step 0; see `tracker_kwargs`). `resumable`: a run logged into `project_dir` before is continued
        (wandb: the same run; see `tracker_kwargs`) — for runs whose steps only go forward across resumes."""
        self.acc = None
        names = usable(log_with, where)
        if names:
            from accelerate import Accelerator

            try:
                self.acc = Accelerator(log_with=names, project_dir=str(project_dir))
            except (RuntimeError, ValueError) as e:  # a launch accelerate cannot set up here (FSDP without a GPU)
                reason = first_line(e)
                raise OpctError(f"{where}: accelerate could not set up its trackers here: {reason}") from None
            start(self.acc, name, scalars(config or {}),
                  tracker_kwargs(names, first_step, project_dir if resumable else None))

    def log(self, values: dict, step: int | None = None) -> None:
        if self.acc is not None and values:
            self.acc.log(values, step=step)

    def close(self) -> None:
        if self.acc is not None:
            finish(self.acc)
            self.acc = None

    def __enter__(self) -> "Trackers":
        return self

    def __exit__(self, *exc) -> None:  # closed however the block is left (see `ended`)
        self.close()
