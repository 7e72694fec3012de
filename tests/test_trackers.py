"""Trackers through accelerate (`--log-with`): training metrics per step, evaluation metrics, an experiment's cells;
a tracker whose package is missing is left out with one line saying so. The TensorBoard and wandb tests run when
tensorboard / wandb are installed (`make test-extras` installs both; wandb in offline mode, no network)."""

import importlib.util

import pytest

import tiny_lm
from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)
from opct.cli import main

from tiny_lm import model_dir_fixture, pairs_file  # noqa: E402,F401  (module-scoped fixtures shared with other suites)


def _scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = {}
    for events in folder.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            tags[tag] = [e.value for e in acc.Scalars(tag)]
    return tags


def _train(model_dir, pairs_file, out, *extra):
    return main(["train", "--model", str(model_dir), "--pairs", str(pairs_file), "--out", str(out), "--max-steps", "3",
                 "--batch-size", "2", "--n-samples", "2", "--max-new-tokens", "6", "--lora-r", "4", *extra])


def test_a_missing_tracker_is_left_out_with_one_line(tmp_path, model_dir, pairs_file, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert _train(model_dir, pairs_file, tmp_path / "run", "--log-with", "wandb") == 0
    err = capsys.readouterr().err
    assert err.count("--log-with wandb: the wandb package is not installed (pip install 'opct[wandb]'); "
                     "not logging") == 1
    assert (tmp_path / "run" / "final").exists()


def test_unknown_tracker_is_a_clear_error(tmp_path, model_dir, pairs_file, capsys):
    err = tiny_lm.cli_error(capsys, ["train", "--model", str(model_dir), "--pairs", str(pairs_file), "--out",
                                     str(tmp_path / "run"), "--log-with", "notebook"])
    assert "--log-with[0]: must be one of tensorboard, wandb" in err and not (tmp_path / "run").exists()


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_training_and_eval_metrics_reach_tensorboard(tmp_path, model_dir, pairs_file, test_organism):
    assert _train(model_dir, pairs_file, tmp_path / "run", "--log-with", "tensorboard") == 0
    tags = _scalars(tmp_path / "run" / "trackers")
    assert len(tags["train/loss"]) == 3 and "train/grad_norm" in tags
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(test_organism), "--suite", "capability", "--n", "3", "--out", str(out),
                 "--no-progress", "--max-new-tokens", "8", "--log-with", "tensorboard"]) == 0
    tags = _scalars(out / "trackers")
    assert "eval/capability.accuracy" in tags


def test_trackers_under_a_launch_accelerate_cannot_set_up_here_are_one_line(tmp_path):
    """`accelerate launch --use_fsdp` on a machine without a GPU: accelerate's FSDP setup raises inside
    Accelerator(); opct eval's trackers (an Accelerator for its tracker API) say so in one line, no traceback."""
    import subprocess
    import sys
    from pathlib import Path

    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU accelerate can set FSDP up")
    pytest.importorskip("tensorboard")
    p = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines",
                        "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--use_fsdp", "-m", "opct.cli",
                        "eval", "--model", "test", "--suite", "capability", "--n", "2", "--out", str(tmp_path / "e"),
                        "--log-with", "tensorboard"], capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode != 0
    assert "opct: error: --log-with: accelerate could not set up its trackers here" in p.stderr, p.stderr[-2000:]
    assert f'File "{Path(__file__).resolve().parents[1] / "opct"}' not in p.stderr  # no traceback through opct


def _steps(folder, tag):
    """The steps of `tag` as TensorBoard shows them: every events file of a run's directory read together, in order
    (a resumed run's `purge_step` drops the earlier events it logs again)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = []
    for run in sorted({f.parent for f in folder.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(run))
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            steps += [(e.step, e.value) for e in acc.Scalars(tag)]
    return steps


def _interrupted_at_step_4(model_dir, pairs_file, run, tracker, monkeypatch) -> None:
    """`run` trained to 5 steps with a checkpoint every 2 and logging to `tracker`, interrupted (Ctrl-C) at step 4:
    steps 1-3 logged, the last checkpoint at step 2. `_resume` continues it."""
    import opct.methods as M

    real, calls = M.METHODS["opct"], []

    def interrupted(run, micro):
        calls.append(run.step)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(run, micro)

    monkeypatch.setitem(M.METHODS, "opct", interrupted)
    assert _train(model_dir, pairs_file, run, "--max-steps", "5", "--save-every", "2", "--log-with", tracker) != 0
    monkeypatch.setitem(M.METHODS, "opct", real)


def _resume(model_dir, pairs_file, run, tracker) -> None:
    assert _train(model_dir, pairs_file, run, "--max-steps", "5", "--save-every", "2", "--log-with", tracker,
                  "--resume") == 0


def _eval_twice(test_organism, out, tracker) -> None:
    """An evaluation into `out` logging to `tracker`, then the same with --resume (after it finished)."""
    args = ["eval", "--model", str(test_organism), "--suite", "capability", "--n", "2", "--out", str(out),
            "--no-progress", "--max-new-tokens", "4", "--log-with", tracker]
    assert main(args) == 0 and main(args + ["--resume"]) == 0


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_a_resumed_run_continues_the_trackers_steps_without_logging_one_twice(tmp_path, model_dir, pairs_file,
                                                                          test_organism, monkeypatch):
    """Interrupted at step 4 with its checkpoint at step 2, a run has logged steps 1-3; resumed, it logs 3-5 again.
    TensorBoard shows each step once, with the resumed run's values (before 2026-12-06: step 3 twice). An evaluation
    resumed after it finished logs its step 0 once, too."""
    run = tmp_path / "run"
    _interrupted_at_step_4(model_dir, pairs_file, run, "tensorboard", monkeypatch)
    assert [s for s, _ in _steps(run / "trackers", "train/loss")] == [1, 2, 3]
    _resume(model_dir, pairs_file, run, "tensorboard")
    logged = _steps(run / "trackers", "train/loss")
    assert [s for s, _ in logged] == [1, 2, 3, 4, 5]
    assert [v for _, v in logged] == pytest.approx([r["loss"] for r in tiny_lm.read_metrics(run)])
    out = tmp_path / "eval"
    _eval_twice(test_organism, out, "tensorboard")
    assert [s for s, _ in _steps(out / "trackers", "eval/capability.accuracy")] == [0]


def test_a_tracker_that_is_installed_but_does_not_import_is_left_out_with_one_line(tmp_path, model_dir, pairs_file,
                                                                                  capsys, monkeypatch):
    """A tracker package that is there but fails to import (a broken install, another protobuf) is left out as a
    missing one is, with its reason; before 2026-12-06 the run stopped at its first step with a traceback from inside
    accelerate."""
    import sys

    pytest.importorskip("tensorboard")
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # `import torch.utils.tensorboard` fails
    assert _train(model_dir, pairs_file, tmp_path / "run", "--log-with", "tensorboard") == 0
    err = capsys.readouterr().err
    assert err.count("opct: note: --log-with tensorboard: the tensorboard package is installed but cannot be "
                     "imported (ModuleNotFoundError: ") == 1, err[-2000:]
    assert (tmp_path / "run" / "final").exists() and not list((tmp_path / "run").rglob("events.out.tfevents.*"))


def _wandb_records(folder):
    """(run folder name, record) for every record of every offline wandb run under `folder`, read from its
    transaction log (`run-*.wandb`: LevelDB's log format, 32 KiB blocks of records split into full / first / middle /
    last chunks, each a `wandb_internal_pb2.Record`), since wandb itself only reads it back by syncing to a server.
    wandb's service may write a finished run's file after `finish` returns, so it is shut down first
    (`wandb.teardown` waits for it; a later run starts it again)."""
    import struct

    import wandb
    from wandb.proto import wandb_internal_pb2 as pb

    wandb.teardown()

    for f in sorted(folder.rglob("run-*.wandb")):
        data, pos, block, chunks = f.read_bytes(), 7, 32768, b""
        assert data[:4] == b":W&B", f
        while pos + 7 <= len(data):
            if block - pos % block < 7:  # a block's tail too short for a header is padding
                pos += block - pos % block
                continue
            _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if kind == 0 and n == 0:  # zero padding to the block's end
                pos += block - pos % block
                continue
            chunks += data[pos + 7:pos + 7 + n]
            pos += 7 + n
            if kind in (1, 4):  # full / last: a whole record
                record = pb.Record()
                record.ParseFromString(chunks)
                chunks = b""
                yield f.parent.name, record


def _wandb_history(folder) -> list[dict]:
    """The logged rows (`history` records) of every offline wandb run under `folder`."""
    import json

    return [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            for _, record in _wandb_records(folder) if record.WhichOneof("record_type") == "history"]


def _wandb_runs(folder) -> list[tuple[str, str]]:
    """(project, run id) of each offline wandb run under `folder`."""
    return [(r.run.project, r.run.run_id) for _, r in _wandb_records(folder) if r.WhichOneof("record_type") == "run"]


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """wandb offline (no account, no network), writing under tmp_path/wandb. wandb reads its settings once per process
    (`wandb.setup`), so its state is torn down before and after: each test's runs land in its own folder."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    (tmp_path / "wandb").mkdir()
    wandb.teardown()
    yield
    wandb.teardown()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_training_and_eval_metrics_reach_wandb_offline(tmp_path, model_dir, pairs_file, test_organism, wandb_offline):
    """`--log-with wandb` (offline: no account, no network): each optimizer step's training metrics, with the
    values of metrics.jsonl, and an evaluation's metrics reach wandb's own run files (untested before 2026-12-06)."""
    run = tmp_path / "run"
    assert _train(model_dir, pairs_file, run, "--log-with", "wandb") == 0
    rows = [r for r in _wandb_history(tmp_path / "wandb") if "train/loss" in r]
    assert [r["_step"] for r in rows] == [1, 2, 3]
    assert [r["train/loss"] for r in rows] == pytest.approx([r["loss"] for r in tiny_lm.read_metrics(run)])
    assert all("train/grad_norm" in r for r in rows)
    import json

    settings = {i.key: json.loads(i.value_json) for _, r in _wandb_records(tmp_path / "wandb")
                if r.WhichOneof("record_type") == "config" for i in r.config.update}
    assert settings["method"] == "opct" and settings["max_steps"] == 3  # the run's settings, on its own run

    out = tmp_path / "eval"
    assert main(["eval", "--model", str(test_organism), "--suite", "capability", "--n", "3", "--out", str(out),
                 "--no-progress", "--max-new-tokens", "8", "--log-with", "wandb"]) == 0
    measured = json.loads((out / "metrics.json").read_text())["capability.accuracy"]["value"]
    logged = [r for r in _wandb_history(tmp_path / "wandb") if "eval/capability.accuracy" in r]
    assert [r["eval/capability.accuracy"] for r in logged] == pytest.approx([measured])


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_a_resumed_run_continues_its_wandb_run(tmp_path, model_dir, pairs_file, test_organism, wandb_offline,
                                               monkeypatch):
    """A training interrupted and resumed, and an evaluation run again with --resume, each log into one wandb run
    (the id kept in RUN/trackers/wandb-run-id, resume="allow"), where each resume used to start a new wandb run.
    Offline, each part is a run folder with that id; steps 1-3 before the interruption, 3-5 after it (online, wandb
    drops the repeated step 3)."""
    run = tmp_path / "run"
    _interrupted_at_step_4(model_dir, pairs_file, run, "wandb", monkeypatch)
    _resume(model_dir, pairs_file, run, "wandb")
    run_id = (run / "trackers" / "wandb-run-id").read_text().strip()
    assert _wandb_runs(tmp_path / "wandb") == [("run-opct", run_id)] * 2
    assert [r["_step"] for r in _wandb_history(tmp_path / "wandb") if "train/loss" in r] == [1, 2, 3, 3, 4, 5]

    out = tmp_path / "eval"
    _eval_twice(test_organism, out, "wandb")
    eval_id = (out / "trackers" / "wandb-run-id").read_text().strip()
    assert eval_id != run_id
    assert sorted(_wandb_runs(tmp_path / "wandb")) == sorted([("run-opct", run_id)] * 2 + [("eval-eval", eval_id)] * 2)


def test_the_wandb_run_id_is_kept_with_the_run_and_a_damaged_one_replaced(tmp_path, capsys, monkeypatch):
    """`tracker_kwargs` gives wandb the run folder's own id (one made on the first call, the same after), with
    resume="allow"; a file that holds no id is replaced with a note; `WANDB_RUN_ID` (wandb's own setting) wins; a run
    that passes no folder (an experiment, whose steps are seeds) gets a new wandb run; every wandb run may open
    beside another (reinit="create_new"); TensorBoard's purge is as before."""
    from opct.trackers import WANDB_ID_FILE, tracker_kwargs

    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    first = tracker_kwargs(["wandb"], None, tmp_path)["wandb"]
    assert first["resume"] == "allow" and first["reinit"] == "create_new" and len(first["id"]) == 16
    assert (tmp_path / WANDB_ID_FILE).read_text() == first["id"] + "\n"
    assert tracker_kwargs(["tensorboard", "wandb"], 4, tmp_path) == {"tensorboard": {"purge_step": 4}, "wandb": first}
    assert tracker_kwargs(["wandb"], 4, None) == {"wandb": {"reinit": "create_new"}}
    assert tracker_kwargs(["tensorboard"], None, tmp_path) is None
    (tmp_path / WANDB_ID_FILE).write_text("not an id!\n")
    again = tracker_kwargs(["wandb"], None, tmp_path)["wandb"]
    assert again["id"] != first["id"] and (tmp_path / WANDB_ID_FILE).read_text() == again["id"] + "\n"
    assert f"opct: note: {tmp_path / WANDB_ID_FILE}: not a wandb run id; starting a new wandb run" in \
        capsys.readouterr().err
    monkeypatch.setenv("WANDB_RUN_ID", "mine")
    assert tracker_kwargs(["wandb"], None, tmp_path) == {"wandb": {"reinit": "create_new"}}


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_an_experiment_logs_to_wandb_beside_its_cells_runs(tmp_path, test_organism, wandb_offline):
    """`log_with: [wandb]` in an experiment: its own run stays open while each cell's training and evaluation open
    and finish theirs in the same process. Before 2026-12-06 the first cell's training finished the experiment's run
    (wandb's default on a second init) and logging the cell's metrics to it stopped the experiment with wandb's
    UsageError."""
    from opct.experiment.config import ExperimentConfig
    from opct.experiment.runner import run_experiment

    cfg = ExperimentConfig(name="tiny", model=str(test_organism), out=str(tmp_path), arms=["base", "bct"],
                           per_family=2, trained={"sycophancy": ["suggested_answer"]}, log_with=["wandb"],
                           train={"max_steps": 1, "batch_size": 2, "n_samples": 1, "max_new_tokens": 4, "lora_r": 4},
                           eval={"suite": "sycophancy", "n": 2, "max_new_tokens": 4}, report=False)
    run_experiment(cfg, log=lambda m: None)
    runs = _wandb_runs(tmp_path / "wandb")
    assert sorted(p for p, _ in runs) == ["eval-eval", "eval-eval", "experiment-tiny", "train-bct"]
    logged = [r for r in _wandb_history(tmp_path / "wandb") if any(k.startswith(("base/", "bct/")) for k in r)]
    assert sorted(k.split("/")[0] for r in logged for k in r if "/" in k and k.endswith("sycophancy_rate")) == \
        ["base", "bct"]
