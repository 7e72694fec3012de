"""A training run's directory (`opct train --out RUN`): refusing to overwrite a run or to resume one with another
configuration, recognising a run directory that was moved, and trimming metrics.jsonl back to the checkpoint being
resumed."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from opct import files
from opct.config import changes, defaults_of
from opct.errors import OpctError
from opct.resume_check import changed_inputs, files_fingerprint, weights_fingerprint
from opct.train.checkpoint import checkpoint_step, checkpoints, latest_checkpoint, write_json_atomic
from opct.train.config import RESUMABLE_CHANGES, TrainConfig


# Path fields of TrainConfig: a run directory moved together with its files may still be resumed (init_adapter since
# 2026-12-07: a wash-out study's wash, which continues the adapter beside it, was refused once its run was moved)
PATH_FIELDS = ("model", "pairs", "targets", "teacher_model", "init_adapter")


def _same_file(saved: str, now: str, saved_out: str, now_out: str) -> bool:
    """Whether path `saved` (as the run recorded it) and path `now` name the same file, allowing for the run
    directory having been moved (with the file, when it was inside the moved tree)."""
    if saved == now or (saved and now and os.path.realpath(saved) == os.path.realpath(now)):
        return True
    if not saved or not now:
        return False
    return os.path.relpath(os.path.abspath(saved), os.path.abspath(saved_out)) == \
        os.path.relpath(os.path.abspath(now), os.path.abspath(now_out))


CONFIG_DIGEST = "run_config"  # in inputs.json: `config_digest` of the run's config.json written beside it


def config_digest(config: dict) -> str:
    """The SHA-256 of a configuration as JSON reads it back (key order and layout aside)."""
    import hashlib

    canonical = json.dumps(json.loads(json.dumps(config)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def prepare_run_dir(out: Path, config: TrainConfig, is_main: bool, processes: int = 1, barrier=None) -> None:
    """Refuse to overwrite a run, or to resume one with another configuration, or to resume one already past the
    steps asked for; a run without a checkpoint (killed before its first) is started over when resumed. `out` itself
    may differ from the one recorded (a moved run). `processes`: how many train it (the replay plan's steps).
    Every rank checks; then `barrier()` (several processes: `accelerator.wait_for_everyone`), and only then the main
    one writes config.json and inputs.json: a rank still checking read the main one's new inputs.json beside the old
    config.json, refused the resume as "edited since the run last started" and left the others waiting at the next
    collective (ZeRO-2's resume test failed that way about one launch in three, found 2026-12-07)."""
    _check_not_foreign(out, config)
    saved_path = out / "config.json"
    if not config.resume and (latest_checkpoint(out) or (out / "metrics.jsonl").exists()):
        raise OpctError(f"{out}: already holds a run; pass --resume to continue it, or choose another --out")
    if config.resume and saved_path.exists():
        saved = files.read_json(saved_path, "config")
        if not isinstance(saved, dict):
            raise OpctError(f"{saved_path}: not a training configuration (expected a JSON object)")
        # a field added after the run was started counts as its default (so older runs stay resumable)
        diff = changes(saved, asdict(config), (*RESUMABLE_CHANGES, "out"), defaults_of(TrainConfig),
                       same=lambda k, a, b: k in PATH_FIELDS and _same_file(str(a or ""), str(b or ""),
                                                                            str(saved.get("out") or out), str(out)))
        if diff:
            raise OpctError(f"{out}: cannot resume with a different configuration; changed: " + ", ".join(diff))
    resuming = config.resume and bool(checkpoints(out))  # a run with a checkpoint to continue from
    if resuming and saved_path.exists():
        _check_schedule(out, saved, config)
    latest = latest_checkpoint(out) if resuming else None
    if latest is not None:  # else "done" with the checkpoint's weights, and config.json saying fewer steps
        from opct.train import replay

        plan = replay.plan(config, processes)
        total = plan.total_steps if plan else config.max_steps
        step = checkpoint_step(latest)
        if step is not None and step > total:
            raise OpctError(f"{out}: its latest checkpoint ({latest.name}) is past the {total} steps this resume "
                            f"asks for (--max-steps {config.max_steps}); resume with --max-steps {step} or more, or "
                            f"start a new run")
    if resuming and not saved_path.exists():
        raise OpctError(f"{saved_path}: missing, though {out} holds checkpoints: the configuration this run was "
                        f"started with cannot be checked against this one (a resume with other hyperparameters "
                        f"would continue it silently); put config.json back, or start a new run")
    inputs = _inputs(config)
    inputs_path = out / "inputs.json"
    if resuming and not inputs_path.exists() and _records_inputs(latest_checkpoint(out)):
        raise OpctError(f"{inputs_path}: missing, though {out}'s checkpoints were written by an opct that records the "
                        f"run's inputs there: the pairs and weights this run started from cannot be checked against "
                        f"these (a resume on other pairs would mix two data sets in one run); put inputs.json back, or "
                        f"start a new run")
    if resuming and inputs_path.exists():
        saved_inputs = files.read_json(inputs_path, "inputs")
        if not isinstance(saved_inputs, dict):  # read as "nothing recorded", any data set continued the run
            raise OpctError(f"{inputs_path}: not a record of the run's inputs (expected a JSON object); put the "
                            f"original back, or start a new run")
        # every opct that writes inputs.json records the pairs: `{}` compared nothing (2026-12-07)
        problem = next((f"{k}: not a fingerprint" for k, v in saved_inputs.items() if not isinstance(v, str)), None)
        if problem is None and "pairs" in inputs and "pairs" not in saved_inputs:
            problem = "pairs: missing"
        if problem is not None:
            raise OpctError(f"{inputs_path}: {problem} (the file is damaged or was edited): this run's inputs cannot "
                            f"be checked against these; put the original back, or start a new run")
        # config.json as the run last wrote it (recorded since 2026-12-07 evening): a key removed since counted as
        # its default and one edited as the value given now, so a resume went on with other hyperparameters unsaid
        recorded = saved_inputs.get(CONFIG_DIGEST)
        if recorded is not None and saved_path.exists() and recorded != config_digest(saved):
            raise OpctError(f"{saved_path}: edited since the run last started (its contents differ from what "
                            f"{inputs_path} records): a field removed would count as its default and one changed as "
                            f"the value given now, so the run could go on with other settings unsaid; put the "
                            f"original back, or start a new run")
        changed = changed_inputs(saved_inputs, inputs)
        if changed:
            names = ", ".join(_input_named(config, k) for k in changed)
            what = "data sets" if set(changed) <= {"pairs", "targets"} else "inputs"
            raise OpctError(f"{out}: cannot resume: {names} holds other contents than when the run started (its "
                            f"SHA-256 differs from {inputs_path}'s); resuming would mix two {what} in one run: put "
                            f"the original back, or start a new run")
    if config.resume and not resuming and (out / "final").exists():  # was: "no checkpoint yet", and trained over it
        raise OpctError(f"{out}: holds a finished run (final/) but no checkpoint to resume from (checkpoints/ "
                        f"removed?): nothing to continue, and starting over would replace its final/; to train "
                        f"again, choose another --out")
    if barrier is not None:
        barrier()
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
        if config.resume and not resuming and (out / "metrics.jsonl").exists():
            # killed before its first checkpoint: nothing to continue from, so start over cleanly
            print(f"opct train: {out} holds no checkpoint yet; starting the run over", file=sys.stderr)
            (out / "metrics.jsonl").unlink()
            shutil.rmtree(out / "tb", ignore_errors=True)
        # inputs.json first: it marks a training run, so another rank's `_check_not_foreign`, reading the directory
        # meanwhile, never finds a config.json without it (a DDP launch failed on that, 2026-12-07)
        write_json_atomic(inputs_path, {**inputs, CONFIG_DIGEST: config_digest(asdict(config))})
        write_json_atomic(saved_path, asdict(config))


def _check_not_foreign(out: Path, config: TrainConfig) -> None:
    """An OpctError, before anything is written, when `out` holds what a run would overwrite and is no training run
    (no inputs.json, metrics.jsonl or checkpoint): a model or adapter directory (a run writes its config.json over
    the model's; found 2026-12-07, `--out` = `--model` left a model that no longer loaded), or a config.json or
    final/ of something else (final/ is replaced whole when the run ends)."""
    if not out.is_dir():
        return
    for field in ("model", "teacher_model", "init_adapter"):
        given = getattr(config, field)
        if given and Path(given).is_dir() and os.path.realpath(given) == os.path.realpath(out):
            raise OpctError(f"--out {out}: is the --{field.replace('_', '-')} directory; a run writes its own "
                            f"config.json and final/ into --out: choose another directory")
    if (out / "inputs.json").exists() or (out / "metrics.jsonl").exists() or checkpoints(out):
        return  # a training run (one from before inputs.json was recorded has its metrics.jsonl)
    from opct.modeldir import model_files_in

    model = model_files_in(out)
    if model:
        raise OpctError(f"{out}: holds a model or an adapter ({', '.join(model[:3])}), not a training run; a run "
                        f"would write its config.json over the model's: choose another --out")
    ours = [name for name in ("config.json", "final") if (out / name).exists()]
    if ours:
        raise OpctError(f"{out}: holds {' and '.join(ours)} but no training run (no inputs.json, metrics.jsonl or "
                        f"checkpoints/), and a run would replace {'it' if len(ours) == 1 else 'them'}: choose "
                        f"another --out, or move {'it' if len(ours) == 1 else 'them'} away")


def _records_inputs(checkpoint) -> bool:
    """Whether `checkpoint` was written by an opct that also wrote RUN/inputs.json: its state.json holds its own hash
    (`STATE_HASH`, added after inputs.json was), so a run without inputs.json lost it, and a run started before it
    was recorded (which resumes unchecked) has no such hash."""
    from opct.train.checkpoint import STATE_HASH

    try:
        state = json.loads((Path(checkpoint) / "state.json").read_text())
    except (OSError, ValueError, TypeError):
        return False  # a damaged checkpoint is the loader's to name
    return isinstance(state, dict) and STATE_HASH in state


def _check_schedule(out: Path, saved: dict, config: TrainConfig) -> None:
    """max_steps may change on resume, to extend a run, only under a constant learning rate: a linear or cosine
    schedule is a curve over the run's total steps (the scheduler's state is only its step count), so a resumed run
    would follow another curve from its checkpoint on (1e-4 decaying to 0 at step 4, then 3.75e-5 at step 6 of 8).
    (A warmup does not depend on the total: a constant schedule with one is extended too.)"""
    old = saved.get("max_steps", config.max_steps)
    if old != config.max_steps and config.lr_schedule != "constant":
        raise OpctError(f"{out}: cannot resume with --max-steps {config.max_steps}: the run was started with "
                        f"{old}, and under --lr-schedule {config.lr_schedule} every step's learning rate depends on "
                        f"the total, so the steps after the checkpoint would follow another curve; resume with "
                        f"--max-steps {old}, or start a new run (a run to be extended later needs --lr-schedule "
                        f"constant)")


def _inputs(config: TrainConfig) -> dict:
    """What the run reads, by content: the SHA-256 of the data files (pairs, targets) and a fingerprint of the weights
    of the model and of a separate teacher (`weights_fingerprint`), and of their configuration, tokenizer and chat
    template files (`files_fingerprint`, key `FIELD.files`). A resume must find the same contents at those paths."""
    out = {}
    for field in ("pairs", "targets"):
        path = Path(getattr(config, field) or "")
        if getattr(config, field) and path.is_file():
            out[field] = files.sha256(path)
    for field in ("model", "teacher_model"):
        if getattr(config, field):
            weights = weights_fingerprint(getattr(config, field))
            if weights:
                out[field] = weights
            other = files_fingerprint(getattr(config, field))  # its own key: a run before 2026-12-07 lacks it
            if other:
                out[f"{field}.files"] = other
    return out


def _input_named(config: TrainConfig, key: str) -> str:
    """An `_inputs` key as the user gave it: `--pairs FILE`, `--model DIR (its config, tokenizer or chat template)`."""
    field, _, part = key.partition(".")
    return f"--{field.replace('_', '-')} {getattr(config, field)}" + (
        " (its config, tokenizer or chat template)" if part == "files" else "")


def truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines past the checkpoint being resumed (a killed run may have logged further), and any line a
    kill tore."""
    kept, unreadable, steps = [], [], set()
    lines = path.read_bytes().decode("utf-8", "replace").splitlines() if path.exists() else []
    for i, line in enumerate(lines, 1):
        try:
            if (n := json.loads(line)["step"]) <= step:
                kept.append(line)
                steps.add(n)
        except (json.JSONDecodeError, KeyError, TypeError):  # a line torn by the kill
            unreadable.append(i)
    if any(n != len(lines) for n in unreadable):  # only the last line can be torn by a kill: say what was lost
        print(f"opct train: {path}: dropped {len(unreadable)} unreadable line(s) (line "
              + ", ".join(map(str, unreadable[:10])) + (", ..." if len(unreadable) > 10 else "")
              + "); the file was damaged or edited, so those steps have no metrics", file=sys.stderr)
    # lines removed, or the file (found 2026-12-07 evening: the run went on, its curve silently short of them)
    if gone := [n for n in range(1, step + 1) if n not in steps]:
        print(f"opct train: {path}: {'missing' if not lines else 'lacks the lines of ' + _steps(gone)}; the "
              f"checkpoint trained {_steps(list(range(1, step + 1)))}, so {_steps(gone)} "
              f"{'have' if len(gone) > 1 else 'has'} no metrics (the file was removed or edited)", file=sys.stderr)
    if path.exists():
        files.write_atomic(path, "".join(ln + "\n" for ln in kept))


def _steps(ns: list[int]) -> str:
    """Step numbers as runs: 'steps 1-3, 7' / 'step 2'."""
    runs, start = [], ns[0]
    for a, b in zip(ns, ns[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a > start else str(a))
            start = b
    return ("steps " if len(ns) > 1 else "step ") + ", ".join(runs)


def check_finished(out: Path, config: TrainConfig, what: str) -> None:
    """Refuse a finished run (`out/final/`) that a runner (`opct run`, `opct threats`, `opct robustness`) is about
    to evaluate without training, when its config.json or inputs.json say it was not trained as `config` trains
    (other settings, other pairs, another model) or cannot say: a train/ swapped for another run's was evaluated as
    the cell unchecked (found 2026-12-07). `what` names the cell."""
    fix = f"put the cell's own training run back, or remove {out} to train the cell again"
    paths = {"config": out / "config.json", "inputs": out / "inputs.json"}
    for name, path in paths.items():
        if not path.is_file():
            raise OpctError(f"{path}: missing, though {out} holds a finished run (final/): what {what} was trained "
                            f"with cannot be checked; {fix}")
    saved, saved_inputs = (files.read_json(p, name) for name, p in paths.items())
    if not isinstance(saved, dict) or not isinstance(saved_inputs, dict):
        raise OpctError(f"{out}: config.json or inputs.json is not a JSON object (damaged or edited); {fix}")
    if saved_inputs.get(CONFIG_DIGEST) not in (None, config_digest(saved)):
        raise OpctError(f"{paths['config']}: edited since the run was trained (its contents differ from what "
                        f"{paths['inputs']} records); {fix}")
    diff = changes(saved, asdict(config), (*RESUMABLE_CHANGES, "out", "init_adapter"), defaults_of(TrainConfig),
                   same=lambda k, a, b: k in PATH_FIELDS and _same_file(str(a or ""), str(b or ""),
                                                                        str(saved.get("out") or out), str(out)))
    inputs = _inputs(config)
    diff += [f"{_input_named(config, k)} (other contents)" for k in inputs
             if k in ("pairs", "model") and saved_inputs.get(k) != inputs[k]]
    diff += [f"{_input_named(config, k)} (other contents)" for k in changed_inputs(saved_inputs, inputs)
             if k not in ("pairs", "model")]
    if diff:
        raise OpctError(f"{out}: {what} was trained with other settings or inputs than it would be now (changed: "
                        f"{', '.join(diff)}); {fix}")
