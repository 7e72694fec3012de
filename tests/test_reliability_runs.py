"""Reliability of run directories: a lock that refuses a second process writing the same run (and that a killed run
does not leave behind), appended JSONL files that repair a torn last line, `opct run` continuing a cell killed before
its first checkpoint and an experiment whose directory was moved, damaged checkpoints falling back to the previous
kept one, and an HTTP judge that gives up on a silent endpoint in time."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from safetensors.torch import load_file

import tiny_lm
from opct.cli import main
from opct.files import append_jsonl, read_appended_jsonl
from tiny_lm import cli_error, fill_disk, model_dir_fixture, one_thread, pairs_file, small_disk  # noqa: F401
from tiny_lm import read_metrics as metrics

ROOT = Path(__file__).resolve().parents[1]
transformers.utils.logging.get_verbosity()  # its log handler keeps the first stderr it sees: the session's


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _train_args(model_dir, pairs, out, *extra):
    return ["train", "--model", str(model_dir), "--pairs", str(pairs), "--out", str(out), "--lora-r", "4",
            "--batch-size", "4", "--n-samples", "2", "--max-new-tokens", "8", "--no-tensorboard", *extra]


def _start(argv, wait_for, timeout=120):
    """Start `python -m opct.cli ARGV`; return it once `wait_for()` holds (it must still be running)."""
    proc = subprocess.Popen([sys.executable, "-m", "opct.cli", *argv], env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    while not wait_for():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.time() < deadline, "timed out waiting for the subprocess"
        time.sleep(0.02)
    assert proc.poll() is None, "the subprocess finished before the test could use it"
    return proc


def _kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _has_lines(path: Path, n=1):
    return lambda: path.exists() and path.read_text().count("\n") >= n


# ------------------------------------------------------------------------------------------------ locks

def test_a_second_train_into_the_same_run_is_refused_and_a_killed_one_leaves_no_lock(tmp_path, model_dir,
                                                                                       pairs_file, capsys):
    out = tmp_path / "run"
    first = _start(_train_args(model_dir, pairs_file, out, "--max-steps", "100000", "--save-every", "100000"),
                   _has_lines(out / "metrics.jsonl"))
    try:
        err = cli_error(capsys, _train_args(model_dir, pairs_file, out, "--max-steps", "3", "--resume"))
        assert err == (f"opct: error: {out}: training run in use by another opct process (pid {first.pid}); wait "
                       f"for it to finish, or write elsewhere")
        # another command into a training run's directory is refused before it would wait for the lock
        assert cli_error(capsys, ["eval", "--model", str(model_dir), "--out", str(out)]) == (
            f"opct: error: {out}: holds a training run (`opct train`) (inputs.json), not an eval run; choose another "
            "directory")
    finally:
        _kill(first)  # killed before its first checkpoint, perhaps mid-line
    assert not (out / "checkpoints").exists() and len(read_appended_jsonl(out / "metrics.jsonl")) >= 1
    # the lock died with its holder; --resume with no checkpoint starts the run over cleanly
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "3", "--resume")) == 0
    assert "starting the run over" in capsys.readouterr().err
    assert [r["step"] for r in metrics(out)] == [1, 2, 3]


HOLD = "import sys, time\nfrom opct.files import dir_lock\nwith dir_lock(sys.argv[1]):\n    print('held', " \
       "flush=True)\n    time.sleep(120)\n"


@pytest.mark.parametrize("verb", ["eval", "audit"])
def test_eval_and_audit_refuse_a_directory_another_process_holds(tmp_path, model_dir, capsys, verb):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], env=_env(), stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        argv = ["eval", "--model", str(model_dir), "--suite", "capability"] if verb == "eval" else ["audit", "--quick"]
        err = cli_error(capsys, [*argv, "--out", str(out)])
        assert f"opct: error: {out}: " in err and f"in use by another opct process (pid {holder.pid})" in err
    finally:
        _kill(holder)
    assert not (out / "results.jsonl").exists() and not (out / "metrics.json").exists()


# ------------------------------------------------------------------------------------------------ torn lines

def test_append_repairs_a_torn_last_line(tmp_path):
    path = tmp_path / "results.jsonl"
    append_jsonl(path, {"n": 1})
    with open(path, "a") as f:
        f.write('{"n": 2, "torn')  # a kill mid-write
    append_jsonl(path, {"n": 3})
    assert path.read_text() == '{"n": 1}\n{"n": 3}\n'
    with open(path, "a") as f:
        f.write('{"n": 4}')  # killed between the record and its newline: the record is whole, keep it
    append_jsonl(path, {"n": 5})
    assert [v["n"] for _, v in read_appended_jsonl(path)] == [1, 3, 4, 5]
    with open(path, "a") as f:
        f.write('{"n": 6, "to')
    assert [v["n"] for _, v in read_appended_jsonl(path)] == [1, 3, 4, 5]  # readers leave a torn last line out
    path.write_text('{"n": 1}\n{"n": \n{"n": 3}\n')
    with pytest.raises(Exception, match=f"{path}:2"):  # a bad line elsewhere is no tear: an error naming it
        read_appended_jsonl(path)


def test_the_audit_loses_no_record_after_a_torn_line(tmp_path):
    from opct.audit.run import _append, read_results

    m = {"misalignment": 0.5, "unparsed": 0.0, "capability": 1.0, "items": {}, "capability_items": {}}  # its shape
    _append(tmp_path, {"kind": "organism", "organism": "sycophancy", "seed": 0, "failure": "f", "base": m,
                       "derived": {**m, "n": 4},
                       "coherence": dict.fromkeys(("agreement", "margin", "forms", "misaligned", "unparsed"))})
    with open(tmp_path / "results.jsonl", "a") as f:
        f.write('{"kind": "before", "orga')
    _append(tmp_path, {"kind": "cell", "organism": "sycophancy", "method": "k1", "seed": 0, "after": m,
                       "seconds": {"total": 1.0}})
    assert [r["kind"] for r in read_results(tmp_path)] == ["organism", "cell"]


def test_the_report_reads_a_training_curve_with_a_torn_last_line(tmp_path):
    from opct.report.rundir import read_curve

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "lo')
    assert [r["step"] for r in read_curve(path)] == [1]


# ------------------------------------------------------------------------------------------------ damaged checkpoints

def test_a_damaged_checkpoint_falls_back_to_the_previous_one_exactly(tmp_path, model_dir, pairs_file, capsys):
    ref, out = tmp_path / "ref", tmp_path / "run"
    common = ("--seed", "3", "--lr", "0.003", "--save-every", "1", "--keep-checkpoints", "2")
    assert main(_train_args(model_dir, pairs_file, ref, *common, "--max-steps", "4")) == 0
    assert main(_train_args(model_dir, pairs_file, out, *common, "--max-steps", "3")) == 0
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-000002", "step-000003"]
    opt = ckpts / "step-000003" / "optimizer.pt"
    data = bytearray(opt.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one garbled byte: torch.load may well not notice, the recorded hash does
    opt.write_bytes(bytes(data))
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "lo')  # and a line torn by the kill
    capsys.readouterr()
    assert main(_train_args(model_dir, pairs_file, out, *common, "--max-steps", "4", "--resume")) == 0
    err = capsys.readouterr().err
    assert f"checkpoint {ckpts / 'step-000003'} is damaged (optimizer.pt does not match its recorded SHA-256" in err
    assert "resumed from step-000002 instead" in err
    assert (ckpts / "damaged-step-000003" / "optimizer.pt").exists()
    # resumed exactly from step 2: the same adapter and losses as the uninterrupted run
    a, b = (load_file(r / "final" / "adapter_model.safetensors") for r in (ref, out))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [(r["step"], r["loss"]) for r in metrics(out)] == [(r["step"], r["loss"]) for r in metrics(ref)]

    # none intact: a clear error naming each checkpoint and what is wrong with it
    for step in ("step-000003", "step-000004"):
        w = ckpts / step / "adapter" / "adapter_model.safetensors"
        w.write_bytes(w.read_bytes()[:100])
    err = cli_error(capsys, _train_args(model_dir, pairs_file, out, *common, "--max-steps", "5", "--resume"))
    assert err.startswith(f"opct: error: {out}: no intact checkpoint to resume from (step-000004: "
                          f"adapter/adapter_model.safetensors is 100 bytes")
    assert "step-000003: adapter/adapter_model.safetensors is 100 bytes" in err


EDITED = "state.json does not match its recorded SHA-256 (edited or garbled)"


@pytest.mark.parametrize("edit, why", [
    ({"pairs_consumed": None}, "state.json's pairs_consumed is not an integer >= 0 (got null)"),
    ({"step": -5}, "state.json's step is not an integer >= 1 (got -5)"),
    ({"nan_steps": "x"}, "state.json's nan_steps is not an integer >= 0 (got \"x\")"),
    ({"world_size": "1"}, "state.json's world_size is not an integer >= 1 (got \"1\")"),
    ({"step": 7}, "state.json's step 7 is not this checkpoint's"),
    ({"pairs_consumed": 3}, EDITED),
    ({"pairs_consumed": 10 ** 12}, EDITED),
    ({"consecutive_nan": 0, "nan_steps": 1}, EDITED),
    ({"files": {}}, "state.json's files is empty (no file's size and SHA-256 recorded)"),
])
def test_a_checkpoint_whose_state_json_is_broken_is_damaged(tmp_path, model_dir, pairs_file, capsys, edit, why):
    """state.json is not in its own manifest: a missing counter stopped the resume with a KeyError traceback, and a
    negative step re-ran steps from -4 and dropped every metrics line of the run. A plausible edit (pairs_consumed
    3, or 10**12) resumed from another data position without a word, and `"files": {}` checked no file: state.json
    now records the SHA-256 of its own content."""
    out = tmp_path / "run"
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "2", "--save-every", "1")) == 0
    state = out / "checkpoints" / "step-000002" / "state.json"
    edited = {**json.loads(state.read_text()), **edit}
    state.write_text(json.dumps({k: v for k, v in edited.items() if v is not None or k != "state_sha256"}))
    capsys.readouterr()
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "3", "--save-every", "1", "--resume")) == 0
    err = capsys.readouterr().err
    assert f"checkpoint {state.parent} is damaged ({why}); moved it to damaged-step-000002 and resumed from " \
           f"step-000001 instead" in err, err
    assert [r["step"] for r in metrics(out)] == [1, 2, 3]


def test_a_checkpoint_written_before_state_json_hashed_itself_resumes_exactly(tmp_path, model_dir, pairs_file,
                                                                             capsys):
    """A run started before 2026-12-06 (state.json without state_sha256) still resumes, from that checkpoint, with a
    note, and ends as the uninterrupted run does: counting it damaged would have left every such run unresumable."""
    full, out = tmp_path / "full", tmp_path / "run"
    assert main(_train_args(model_dir, pairs_file, full, "--max-steps", "3", "--save-every", "1")) == 0
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "2", "--save-every", "1")) == 0
    state = out / "checkpoints" / "step-000002" / "state.json"
    state.write_text(json.dumps({k: v for k, v in json.loads(state.read_text()).items() if k != "state_sha256"}))
    capsys.readouterr()
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "3", "--save-every", "1", "--resume")) == 0
    err = capsys.readouterr().err
    assert f"opct: note: {state} records no state_sha256 (written by an opct before 2026-12-06)" in err, err
    assert "damaged" not in err, err
    assert (out / "final" / "adapter_model.safetensors").read_bytes() == \
        (full / "final" / "adapter_model.safetensors").read_bytes()


@pytest.mark.parametrize("how", ["a-file", "unlistable"])
def test_checkpoints_that_cannot_be_listed_stop_a_resume_before_it_touches_the_metrics(tmp_path, model_dir,
                                                                                      pairs_file, capsys,
                                                                                      monkeypatch, how):
    """A checkpoints folder that cannot be listed (no permission; a file in its place) used to read as "no checkpoint
    yet": the resume started the run over and deleted metrics.jsonl, with the checkpoints still there."""
    out = tmp_path / "run"
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "2", "--save-every", "1")) == 0
    before = (out / "metrics.jsonl").read_text()
    ckpts = out / "checkpoints"
    if how == "a-file":
        shutil.move(ckpts, tmp_path / "aside")
        ckpts.write_text("")
        needle = f"{ckpts}: not a folder (where the run keeps its checkpoints)"
    else:
        listdir = os.listdir

        def refuse(path="."):
            if Path(path) == ckpts:
                raise PermissionError(13, "Permission denied", str(path))
            return listdir(path)

        monkeypatch.setattr(os, "listdir", refuse)
        needle = f"{ckpts}: cannot list the run's checkpoints (Permission denied)"
    err = cli_error(capsys, _train_args(model_dir, pairs_file, out, "--max-steps", "3", "--resume"))
    assert err.startswith(f"opct: error: {needle}"), err
    assert (out / "metrics.jsonl").read_text() == before


def _refused_until_restored(capsys, args, named: str, what: str, restore):
    """A resume (`args` + 3 steps) is refused, naming `named` whose contents changed since the run (`args`' --out)
    started, until `restore()` puts the original back."""
    out = Path(args[args.index("--out") + 1])
    err = cli_error(capsys, [*args, "--max-steps", "3", "--resume"])
    assert err == (f"opct: error: {out}: cannot resume: {named} holds other contents than when the run started (its "
                   f"SHA-256 differs from {out / 'inputs.json'}'s); resuming would mix two {what} in one run: put "
                   f"the original back, or start a new run")
    restore()
    assert main([*args, "--max-steps", "3", "--resume"]) == 0


def test_a_resume_refuses_a_pairs_file_whose_contents_changed(tmp_path, model_dir, capsys):
    """Only the path used to be compared: new pairs at the old path made one run of two data sets, silently."""
    pairs, out = tiny_lm.write_pairs(tmp_path / "p.jsonl"), tmp_path / "run"
    assert main(_train_args(model_dir, pairs, out, "--max-steps", "2", "--save-every", "1")) == 0
    assert json.loads((out / "inputs.json").read_text())["pairs"] == __import__("hashlib").sha256(
        pairs.read_bytes()).hexdigest()
    original = pairs.read_text()
    pairs.write_text("".join(reversed(original.splitlines(keepends=True))))
    _refused_until_restored(capsys, _train_args(model_dir, pairs, out), f"--pairs {pairs}", "data sets",
                            lambda: pairs.write_text(original))


def test_a_resume_refuses_an_inputs_json_that_is_no_object(tmp_path, model_dir, pairs_file, capsys):
    """An inputs.json holding no JSON object was read as "nothing recorded": the resume went on with any data set and
    overwrote the record."""
    out = tmp_path / "run"
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "2", "--save-every", "1")) == 0
    (out / "inputs.json").write_text("[1]")
    err = cli_error(capsys, _train_args(model_dir, pairs_file, out, "--max-steps", "3", "--resume"))
    assert err == f"opct: error: {out / 'inputs.json'}: not a record of the run's inputs (expected a JSON object); " \
                  f"put the original back, or start a new run"
    assert (out / "inputs.json").read_text() == "[1]"
    # `{}` (or a fingerprint that is no string) compared nothing (2026-12-07): every inputs.json records the pairs
    saved = {"pairs": __import__("hashlib").sha256(pairs_file.read_bytes()).hexdigest()}
    for text, says in (("{}", "pairs: missing"), (json.dumps({**saved, "model": 7}), "model: not a fingerprint")):
        (out / "inputs.json").write_text(text)
        err = cli_error(capsys, _train_args(model_dir, pairs_file, out, "--max-steps", "3", "--resume"))
        assert err == f"opct: error: {out / 'inputs.json'}: {says} (the file is damaged or was edited): this run's " \
                      f"inputs cannot be checked against these; put the original back, or start a new run"
        assert (out / "inputs.json").read_text() == text


def test_a_resume_with_fewer_steps_than_its_checkpoint_is_refused(tmp_path, model_dir, pairs_file, capsys):
    """Resumed with --max-steps below its latest checkpoint's step, a run said "done" with the checkpoint's weights in
    final/ and a config.json saying fewer steps than it had trained."""
    out = tmp_path / "run"
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "2", "--save-every", "1")) == 0
    config = (out / "config.json").read_text()
    err = cli_error(capsys, _train_args(model_dir, pairs_file, out, "--max-steps", "1", "--resume"))
    assert err == f"opct: error: {out}: its latest checkpoint (step-000002) is past the 1 steps this resume asks for " \
                  f"(--max-steps 1); resume with --max-steps 2 or more, or start a new run"
    assert (out / "config.json").read_text() == config
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "2", "--resume")) == 0  # finished: as it was


def test_a_resume_extends_max_steps_only_under_a_constant_learning_rate(tmp_path, model_dir, pairs_file, capsys):
    """A linear or cosine schedule is a curve over max_steps, and the scheduler's state is only its step count: a run
    of 4 steps resumed with --max-steps 8 trained at 1e-4, 7.5e-5, 5e-5, 2.5e-5, 0.0, then 3.75e-5, 2.5e-5, 1.25e-5."""
    out = tmp_path / "run"
    linear = ("--save-every", "1", "--lr-schedule", "linear")
    assert main(_train_args(model_dir, pairs_file, out, *linear, "--max-steps", "2")) == 0
    config = (out / "config.json").read_text()
    err = cli_error(capsys, _train_args(model_dir, pairs_file, out, *linear, "--max-steps", "4", "--resume"))
    assert err == f"opct: error: {out}: cannot resume with --max-steps 4: the run was started with 2, and under " \
                  f"--lr-schedule linear every step's learning rate depends on the total, so the steps after the " \
                  f"checkpoint would follow another curve; resume with --max-steps 2, or start a new run (a run to " \
                  f"be extended later needs --lr-schedule constant)"
    assert (out / "config.json").read_text() == config and [r["step"] for r in metrics(out)] == [1, 2]
    assert main(_train_args(model_dir, pairs_file, out, *linear, "--max-steps", "2", "--resume")) == 0  # as it was
    # a constant learning rate is extended as before, with a warmup too (it does not depend on the total); the warmup
    # is taken (transformers' "constant" has none: until 2026-12-06 --warmup-steps was dropped without a word)
    const = tmp_path / "constant"
    assert main(_train_args(model_dir, pairs_file, const, "--save-every", "1", "--max-steps", "1")) == 0
    assert main(_train_args(model_dir, pairs_file, const, "--max-steps", "3", "--resume")) == 0
    assert [(r["step"], r["lr"]) for r in metrics(const)] == [(1, 1e-4), (2, 1e-4), (3, 1e-4)]
    warm = tmp_path / "warmup"
    capsys.readouterr()
    assert main(_train_args(model_dir, pairs_file, warm, "--save-every", "1", "--max-steps", "2", "--warmup-steps",
                            "4", "--lr", "0.0004")) == 0
    # a warmup past the run is allowed (a resume may raise --max-steps, as here) but said (2026-12-07: it was not)
    assert "opct: warning: --warmup-steps 4 is not below the run's 2 steps: the learning rate never reaches --lr " \
           "0.0004 (the last step's is 0.25 of it)" in capsys.readouterr().err
    assert main(_train_args(model_dir, pairs_file, warm, "--max-steps", "6", "--resume", "--warmup-steps", "4",
                            "--lr", "0.0004")) == 0
    assert "--warmup-steps" not in capsys.readouterr().err
    assert [r["lr"] for r in metrics(warm)] == pytest.approx([0.0, 1e-4, 2e-4, 3e-4, 4e-4, 4e-4])


def test_a_resume_refuses_a_model_whose_weights_changed(tmp_path, model_dir, pairs_file, capsys):
    """The model used to be compared by path only: other weights at the old path continued the run on them, silently
    (the LoRA adapter trained on one base, resumed on another)."""
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    out = tmp_path / "run"
    assert main(_train_args(model, pairs_file, out, "--max-steps", "2", "--save-every", "1")) == 0
    assert len(json.loads((out / "inputs.json").read_text())["model"]) == 64
    weights = model / "model.safetensors"
    original = weights.read_bytes()
    tok = tiny_lm.make_tokenizer()
    retrained = tiny_lm.save(tiny_lm.make_model(tok, seed=1), tok, tmp_path / "retrained") / "model.safetensors"
    assert retrained.stat().st_size == len(original) and retrained.read_bytes() != original
    shutil.copy(retrained, weights)
    _refused_until_restored(capsys, _train_args(model, pairs_file, out), f"--model {model}", "inputs",
                            lambda: weights.write_bytes(original))


def test_a_resume_refuses_a_model_whose_chat_template_or_config_changed(tmp_path, model_dir, pairs_file, capsys):
    """Only the weights used to be fingerprinted: an edited chat template (other prompts), tokenizer or config.json
    at the model's path continued the run on them, silently. A run whose inputs.json predates `model.files` resumes
    (nothing recorded to compare)."""
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    out = tmp_path / "run"
    assert main(_train_args(model, pairs_file, out, "--max-steps", "2", "--save-every", "1")) == 0
    recorded = json.loads((out / "inputs.json").read_text())
    assert set(recorded) == {"pairs", "model", "model.files", "run_config"}
    template = model / "chat_template.jinja"
    original = template.read_bytes()
    edited = original.replace(b"<|assistant|>", b"<|assistant|> answer:", 1)
    assert edited != original
    template.write_bytes(edited)
    _refused_until_restored(capsys, _train_args(model, pairs_file, out),
                            f"--model {model} (its config, tokenizer or chat template)", "inputs",
                            lambda: template.write_bytes(original))
    recorded = json.loads((out / "inputs.json").read_text())  # as the resume above rewrote it
    del recorded["model.files"]  # a run started before the files were recorded: compared by weights only
    (out / "inputs.json").write_text(json.dumps(recorded))
    template.write_bytes(edited)
    assert main([*_train_args(model, pairs_file, out), "--max-steps", "4", "--resume"]) == 0


def test_a_resume_without_the_runs_config_is_refused(tmp_path, model_dir, pairs_file, capsys):
    """With config.json gone, any hyperparameters used to continue the run."""
    out = tmp_path / "run"
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "2", "--save-every", "1")) == 0
    (out / "config.json").unlink()
    before = (out / "metrics.jsonl").read_text()
    err = cli_error(capsys, _train_args(model_dir, pairs_file, out, "--max-steps", "3", "--resume", "--lr", "1"))
    assert err.startswith(f"opct: error: {out / 'config.json'}: missing, though {out} holds checkpoints"), err
    assert (out / "metrics.jsonl").read_text() == before and not (out / "config.json").exists()


def test_train_refuses_an_out_that_holds_a_model_or_files_a_run_would_replace(tmp_path, model_dir, pairs_file,
                                                                              capsys):
    """Found 2026-12-07: `opct train --out` wrote its config.json over a model directory's (--out = --model left a
    model that no longer loaded; a copy of the model as --out lost its config silently), and replaced a final/ it had
    not written. Each is refused before anything is written, the files as they were."""
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    notes = tmp_path / "notes"
    (notes / "final").mkdir(parents=True)
    (notes / "final" / "notes.txt").write_text("mine\n")
    for argv, says in [
            (_train_args(model, pairs_file, model), f"--out {model}: is the --model directory; a run writes its own "
                                                    "config.json and final/ into --out: choose another directory"),
            (_train_args(model, pairs_file, other), f"{other}: holds a model or an adapter (model.safetensors), not a "
                                                    "training run; a run would write its config.json over the "
                                                    "model's: choose another --out"),
            (_train_args(model, pairs_file, notes), f"{notes}: holds final but no training run (no inputs.json, "
                                                    "metrics.jsonl or checkpoints/), and a run would replace it: "
                                                    "choose another --out, or move it away")]:
        before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.name != ".opct.lock"}
        assert cli_error(capsys, [*argv, "--max-steps", "1"]) == f"opct: error: {says}"
        assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.name != ".opct.lock"} == before


def test_a_resume_of_a_finished_run_without_its_checkpoints_is_refused_not_trained_over(tmp_path, model_dir,
                                                                                      pairs_file, capsys):
    """With checkpoints/ pruned from a finished run, --resume said "holds no checkpoint yet; starting the run over",
    removed its metrics.jsonl and replaced its final/ (before 2026-12-07)."""
    out = tmp_path / "run"
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "2", "--save-every", "1")) == 0
    shutil.rmtree(out / "checkpoints")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".opct.lock"}
    err = cli_error(capsys, _train_args(model_dir, pairs_file, out, "--max-steps", "2", "--resume"))
    assert err == (f"opct: error: {out}: holds a finished run (final/) but no checkpoint to resume from "
                   "(checkpoints/ removed?): nothing to continue, and starting over would replace its final/; to "
                   "train again, choose another --out")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".opct.lock"} == before


def test_a_large_file_is_fingerprinted_by_blocks(tmp_path, monkeypatch):
    from opct import files

    monkeypatch.setattr(files, "FINGERPRINT_WHOLE", 1 << 20)
    path = tmp_path / "w.bin"
    data = bytearray(os.urandom(9 << 20))
    path.write_bytes(data)
    first = files.fingerprint(path)
    assert first.startswith("blocks:") and files.fingerprint(path) == first
    sampled = (len(data) - (1 << 20)) * 32 // 65 + 5  # inside the 32nd of the blocks between
    for where in (0, 1000, sampled, len(data) - 1):  # the first MiB, a block between, the last MiB
        changed = bytearray(data)
        changed[where] ^= 0xFF
        path.write_bytes(changed)
        assert files.fingerprint(path) != first, where
    path.write_bytes(data + b"\0")
    assert files.fingerprint(path) != first


def test_a_state_json_whose_manifest_is_garbled_is_damage(tmp_path, model_dir, pairs_file, capsys):
    out = tmp_path / "run"
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "2", "--save-every", "1")) == 0
    state = out / "checkpoints" / "step-000002" / "state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "files": "x"}))
    capsys.readouterr()
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "3", "--resume")) == 0
    err = capsys.readouterr().err
    assert "state.json's files is not a manifest" in err and "resumed from step-000001 instead" in err


def test_a_disk_that_fills_up_during_training_damages_nothing(small_disk, model_dir, pairs_file, capsys):
    out = small_disk / "run"
    args = _train_args(model_dir, pairs_file, out, "--save-every", "1", "--resume")
    assert main([*args, "--max-steps", "1"]) == 0
    filler = fill_disk(small_disk, leave=8192)  # room for a metrics line or two, not for a checkpoint
    err = cli_error(capsys, [*args, "--max-steps", "3"])
    assert err.startswith(f"opct: error: {out}") and "no space left on device" in err
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000001"]  # nothing half-written left
    filler.unlink()
    rc = main([*args, "--max-steps", "3"])
    assert rc == 0, capsys.readouterr().err[-3000:]  # and the run continues from its intact checkpoint
    assert [r["step"] for r in metrics(out)] == [1, 2, 3]


def test_a_moved_run_directory_resumes(tmp_path, model_dir, capsys):
    a = tmp_path / "a"
    a.mkdir()
    pairs = tiny_lm.write_pairs(a / "pairs.jsonl")  # inside the run's tree: it moves with it
    assert main(_train_args(model_dir, pairs, a / "run", "--max-steps", "2", "--save-every", "1")) == 0
    b = tmp_path / "elsewhere" / "b"
    b.parent.mkdir()
    shutil.move(a, b)
    assert main(_train_args(model_dir, b / "pairs.jsonl", b / "run", "--max-steps", "3", "--resume")) == 0
    assert [r["step"] for r in metrics(b / "run")] == [1, 2, 3]
    # a run continuing an adapter of the moved tree (a wash-out study's wash: "changed: init_adapter" before)
    assert main(_train_args(model_dir, b / "pairs.jsonl", b / "cont", "--max-steps", "1", "--init-adapter",
                            str(b / "run" / "final"))) == 0
    c = tmp_path / "third" / "c"
    c.parent.mkdir()
    shutil.move(b, c)
    assert main(_train_args(model_dir, c / "pairs.jsonl", c / "cont", "--max-steps", "2", "--init-adapter",
                            str(c / "run" / "final"), "--resume")) == 0
    assert [r["step"] for r in metrics(c / "cont")] == [1, 2]
    # another pairs file is still another configuration
    other = tiny_lm.write_pairs(tmp_path / "other.jsonl", tiny_lm.make_pairs()[:-1])
    err = cli_error(capsys, _train_args(model_dir, other, c / "run", "--max-steps", "4", "--resume"))
    assert "cannot resume with a different configuration; changed: pairs" in err


# ------------------------------------------------------------------------------------------------ opct run

def test_run_continues_a_cell_killed_before_its_first_checkpoint_after_a_move(test_organism, tmp_path, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(dict(
        name="tiny", model=str(test_organism), out=str(tmp_path / "runs"), arms=["opct"], per_family=4,
        jailbreak_wrappers=[], awareness_domains=[], report=False,
        train={"max_steps": 40, "batch_size": 2, "n_samples": 2, "max_new_tokens": 12, "save_every": 1000,
               "tensorboard": False},
        eval={"suite": "sycophancy", "n": 4, "max_new_tokens": 8, "progress": False})))
    root = tmp_path / "runs" / "tiny"
    first = _start(["run", str(exp)], _has_lines(root / "opct" / "0" / "train" / "metrics.jsonl"))
    try:  # a second `opct run` of the same experiment is refused while the first runs
        err = cli_error(capsys, ["run", str(exp)])
        assert err.startswith(f"opct: error: {root}: experiment in use by another opct process (pid {first.pid})")
    finally:
        _kill(first)
    cell = root / "opct" / "0"
    assert not (cell / "train" / "checkpoints").exists() and not (cell / "done.json").exists()
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.move(root, moved / "tiny2")
    assert main(["run", str(exp), "--out", str(moved), "--name", "tiny2"]) == 0
    cell = moved / "tiny2" / "opct" / "0"
    assert (cell / "done.json").exists()
    assert [r["step"] for r in metrics(cell / "train")] == list(range(1, 41))  # started over: no duplicate steps


# ------------------------------------------------------------------------------------------------ the HTTP judge

@pytest.fixture
def silent_endpoint():
    """A server that accepts every connection and never answers. Yields its base URL."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.05)
    held, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/v1"
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def test_the_http_judge_gives_up_on_a_silent_endpoint_within_its_timeout(silent_endpoint):
    from opct.errors import OpctError
    from opct.evals.judges import HTTPJudge, make_judge
    from opct.evals.run import EvalConfig

    assert EvalConfig().judge_timeout < 60  # the default: fails within a minute, retries included
    judge = make_judge("http", silent_endpoint, "grader", timeout=1.0)
    assert isinstance(judge, HTTPJudge) and judge.timeout == 1.0
    t0 = time.monotonic()
    with pytest.raises(OpctError) as e:
        judge.judge(["q"], ["r"])
    assert time.monotonic() - t0 < 3
    assert silent_endpoint in str(e.value) and "no answer within" in str(e.value)


@pytest.mark.parametrize("url", ["notaurl", "ftp://host/v1", "http://", "http://host:port/v1", "http://h:99999/v1"])
def test_a_judge_url_that_is_not_one_is_refused_before_anything_runs(url, tmp_path, capsys):
    """From the flag and from an experiment file: one line naming the flag or the file's field, and nothing written
    (urllib raised a bare ValueError at the first grade, after every response had been sampled)."""
    err = cli_error(capsys, ["eval", "--model", "nodir-never-loaded", "--suite", "jailbreak", "--judge", "http",
                             "--judge-url", url, "--judge-model", "g", "--out", str(tmp_path / "e")])
    assert err.startswith(f"opct: error: --judge-url: {url!r} is not an http:// or https:// URL"), err
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"name": "j", "arms": ["base"], "eval": {"judge": "http", "judge_url": url,
                                                                           "judge_model": "g"}}))
    err = cli_error(capsys, ["run", str(exp), "--out", str(tmp_path / "runs")])
    assert err.startswith(f"opct: error: {exp}: eval.judge_url: {url!r} is not"), err
    exp.write_text(yaml.safe_dump({"name": "j", "arms": ["base"], "eval": {"judge": "http"}}))
    err = cli_error(capsys, ["run", str(exp), "--out", str(tmp_path / "runs")])
    assert err == f"opct: error: {exp}: eval.judge_url: judge http needs it (an OpenAI-compatible base URL)", err
    # the same in a cross-threat file (it was found only after the run directory was made) and on the command line
    threats = {"kind": "threats", "name": "t", "eval": {"judge": "http", "judge_url": "http://h/v1"}}
    exp.write_text(yaml.safe_dump(threats))
    err = cli_error(capsys, ["run", str(exp), "--out", str(tmp_path / "runs")])
    assert err == f"opct: error: {exp}: eval.judge_model: judge http needs it (the judge's model)", err
    err = cli_error(capsys, ["eval", "--model", "nodir-never-loaded", "--judge", "http", "--out", str(tmp_path / "e")])
    assert err == "opct: error: --judge-url: judge http needs it (an OpenAI-compatible base URL)", err
    # a URL or model given with another judge would be ignored: refused, on the command line and in a file
    err = cli_error(capsys, ["eval", "--model", "nodir-never-loaded", "--judge", "world", "--judge-url", "http://h/v1",
                             "--out", str(tmp_path / "e")])
    assert err == "opct: error: --judge-url: only the http judge reads it, and the judge is 'world' (use judge http)"
    exp.write_text(yaml.safe_dump({"name": "j", "arms": ["base"], "eval": {"judge_model": "g"}}))
    err = cli_error(capsys, ["run", str(exp), "--out", str(tmp_path / "runs")])
    assert err == f"opct: error: {exp}: eval.judge_model: only the http judge reads it, and the judge is 'auto' " \
                  "(use judge http)", err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml"]


def test_a_run_file_of_an_unknown_kind_is_named_as_such(tmp_path, capsys):
    """`kind:` selects a robustness or threats file; any other kind is a misspelling, not an unknown experiment
    field."""
    f = tmp_path / "k.yaml"
    f.write_text("kind: robustnes\nseeds: [0]\n")
    err = cli_error(capsys, ["run", str(f), "--out", str(tmp_path / "runs")])
    assert err == f"opct: error: {f}: kind: must be robustness or threats (got 'robustnes'); an experiment file has " \
                  "no kind", err
    assert not (tmp_path / "runs").exists()


def test_an_experiments_own_pairs_file_is_checked_before_any_cell_runs(tmp_path, capsys):
    """`opct run --pairs FILE`: a malformed file stops the experiment before the base arm is evaluated (it was read
    only when the first trained arm started, a whole evaluation later)."""
    bad = tmp_path / "pairs.jsonl"
    bad.write_text('{"id": "p1", "axis": "sycophancy"\n')
    err = cli_error(capsys, ["run", "--pairs", str(bad), "--arms", "base", "opct", "--out", str(tmp_path / "runs")])
    assert err.startswith(f"opct: error: {bad}:1: "), err
    assert not list((tmp_path / "runs").rglob("done.json")) and not list((tmp_path / "runs").rglob("records.jsonl"))


def test_eval_judge_timeout_flag(test_organism, tmp_path, capsys, silent_endpoint):
    t0 = time.monotonic()
    err = cli_error(capsys, ["eval", "--model", str(test_organism), "--suite", "jailbreak", "--n", "1", "--samples",
                             "1", "--no-attack", "--max-new-tokens", "4", "--no-progress", "--judge", "http",
                             "--judge-url", silent_endpoint, "--judge-model", "grader", "--judge-timeout", "1",
                             "--out", str(tmp_path / "e")])
    assert time.monotonic() - t0 < 30
    assert f"judge endpoint {silent_endpoint}/chat/completions: gave up" in err and "--judge-timeout" in err
    assert "--judge-timeout: must be > 0" in cli_error(capsys, ["eval", "--model", str(test_organism), "--judge",
                                                               "http", "--judge-url", silent_endpoint, "--judge-model",
                                                               "g", "--judge-timeout", "0", "--out",
                                                               str(tmp_path / "e")])


def test_resuming_trims_metrics_and_says_when_lines_other_than_a_torn_last_one_are_lost(tmp_path, capsys):
    from opct.train.rundir import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    row = lambda s: json.dumps({"step": s, "loss": 0.5})  # noqa: E731
    path.write_text("\n".join([row(1), row(2), row(3), '{"step": 4, "lo']))  # killed while writing step 4
    truncate_metrics(path, 2)
    assert path.read_text() == row(1) + "\n" + row(2) + "\n"
    assert capsys.readouterr().err == ""  # a torn last line is what a kill leaves: nothing to say
    path.write_text("\n".join([row(1), "{damaged", row(2), "[3]"]) + "\n")
    truncate_metrics(path, 2)
    assert path.read_text() == row(1) + "\n" + row(2) + "\n"
    err = capsys.readouterr().err
    assert f"{path}: dropped 2 unreadable line(s) (line 2, 4)" in err and "those steps have no metrics" in err


def test_an_init_adapter_missing_tensors_is_refused_before_training(tmp_path, model_dir, pairs_file, capsys):
    """`--init-adapter` whose adapter_model.safetensors lacks some of its configuration's tensors: peft left them at
    their initial values with a warning and training went on from half an adapter; now one error naming the file."""
    from safetensors.torch import load_file, save_file

    first = tmp_path / "first"
    assert main(_train_args(model_dir, pairs_file, first, "--max-steps", "1")) == 0
    weights = first / "final" / "adapter_model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if ".layers.0." not in k}, weights)
    capsys.readouterr()
    err = cli_error(capsys, _train_args(model_dir, pairs_file, tmp_path / "second", "--max-steps", "1",
                                        "--init-adapter", str(first / "final")))
    assert err.startswith(f"opct: error: {weights}: does not match its adapter_config.json on this model: "), err
    assert "tensor(s) missing" in err and not (tmp_path / "second" / "final").exists()


def test_an_init_adapter_of_another_rank_or_alpha_than_the_flags_is_refused(tmp_path, model_dir, pairs_file, capsys):
    """`--init-adapter A --lora-r 8` on a rank-4 adapter trained at rank 4 while the run's config.json said 8 (found
    2026-12-07): refused, naming both; with the adapter's own values it continues."""
    first = tmp_path / "first"
    assert main(_train_args(model_dir, pairs_file, first, "--max-steps", "1")) == 0  # --lora-r 4, alpha 32
    capsys.readouterr()
    for extra, says in [(["--lora-r", "8"], "--lora-r 8: the adapter of --init-adapter {a} has lora_r 4"),
                        (["--lora-alpha", "16"], "--lora-alpha 16: the adapter of --init-adapter {a} has lora_alpha "
                                                 "32"),
                        # and --lora-targets, --lora-dropout (found that evening: ignored, config.json recording them)
                        (["--lora-targets", "q_proj"], "--lora-targets q_proj: the adapter of --init-adapter {a} adapts "
                                                       "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj, "
                                                       "which continuing it keeps"),
                        (["--method", "bct", "--lora-dropout", "0.3"], "--lora-dropout 0.3: an adapter continued from "
                                                                       "--init-adapter trains without dropout")]:
        argv = _train_args(model_dir, pairs_file, tmp_path / "second", "--max-steps", "1", "--init-adapter",
                           str(first / "final"))
        if "bct" in extra:  # --n-samples is OPCT's (refused for bct since the evening after)
            i = argv.index("--n-samples")
            argv = argv[:i] + argv[i + 2:]
        err = cli_error(capsys, [*argv, *extra])
        assert err.startswith("opct: error: " + says.format(a=first / "final")), err
        assert not (tmp_path / "second" / "final").exists()
    assert main(_train_args(model_dir, pairs_file, tmp_path / "second", "--max-steps", "1", "--init-adapter",
                            str(first / "final"))) == 0
    # an adapter of some layers: continued under their names (in any order), not under the default all-linear
    some = tmp_path / "some"
    assert main(_train_args(model_dir, pairs_file, some, "--max-steps", "1", "--lora-targets", "q_proj,v_proj")) == 0
    capsys.readouterr()
    err = cli_error(capsys, _train_args(model_dir, pairs_file, tmp_path / "third", "--max-steps", "1",
                                        "--init-adapter", str(some / "final")))
    assert err.startswith(f"opct: error: --lora-targets all-linear: the adapter of --init-adapter {some / 'final'} "
                          "adapts q_proj, v_proj"), err
    assert main(_train_args(model_dir, pairs_file, tmp_path / "third", "--max-steps", "1", "--init-adapter",
                            str(some / "final"), "--lora-targets", "v_proj,q_proj")) == 0


def test_a_resume_whose_inputs_json_was_removed_is_refused_unless_the_run_predates_it(tmp_path, model_dir, capsys):
    """Removing RUN/inputs.json let a resume go on with other pairs at the same path, and wrote the new pairs' hash
    over the evidence (found 2026-12-07). A checkpoint that records its own hash (state_sha256, written by every opct
    that writes inputs.json) now needs it; a run from before both resumes unchecked, as before."""
    pairs, out = tiny_lm.write_pairs(tmp_path / "p.jsonl"), tmp_path / "run"
    assert main(_train_args(model_dir, pairs, out, "--max-steps", "2", "--save-every", "1")) == 0
    (out / "inputs.json").unlink()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".opct.lock"}
    err = cli_error(capsys, _train_args(model_dir, pairs, out, "--max-steps", "3", "--save-every", "1", "--resume"))
    assert err.startswith(f"opct: error: {out / 'inputs.json'}: missing, though {out}'s checkpoints were written by "
                          "an opct that records the run's inputs there"), err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".opct.lock"} == before
    for state in (out / "checkpoints").glob("*/state.json"):  # as a run from before 2026-12-06 wrote them
        state.write_text(json.dumps({k: v for k, v in json.loads(state.read_text()).items() if k != "state_sha256"}))
    assert main(_train_args(model_dir, pairs, out, "--max-steps", "3", "--save-every", "1", "--resume")) == 0


def test_a_resume_whose_config_json_was_edited_is_refused(tmp_path, model_dir, capsys):
    """A key removed from RUN/config.json counted as its default, so `--resume` went on at another batch size and
    wrote that into config.json as the run's (found 2026-12-07 evening); a value edited to what the resume gives
    passed as unchanged. inputs.json now records config.json's digest; a run from before it resumes unchecked."""
    pairs, out = tiny_lm.write_pairs(tmp_path / "p.jsonl"), tmp_path / "run"
    assert main(_train_args(model_dir, pairs, out, "--max-steps", "2", "--save-every", "1", "--batch-size", "2")) == 0
    original = (out / "config.json").read_text()
    resume = _train_args(model_dir, pairs, out, "--max-steps", "3", "--save-every", "1", "--resume")
    for edit in ({k: v for k, v in json.loads(original).items() if k != "batch_size"},  # removed: the default, 4
                 {**json.loads(original), "batch_size": 4}):  # edited to the value the resume gives
        (out / "config.json").write_text(json.dumps(edit))
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".opct.lock"}
        err = cli_error(capsys, [*resume, "--batch-size", "4"])
        assert err == (f"opct: error: {out / 'config.json'}: edited since the run last started (its contents differ "
                       f"from what {out / 'inputs.json'} records): a field removed would count as its default and one "
                       "changed as the value given now, so the run could go on with other settings unsaid; put the "
                       "original back, or start a new run"), err
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".opct.lock"} == before
    (out / "config.json").write_text(original)  # as it was: resumes, and the record follows the new config.json
    assert main([*resume, "--batch-size", "2"]) == 0
    assert main(_train_args(model_dir, pairs, out, "--max-steps", "4", "--save-every", "1", "--resume",
                            "--batch-size", "2")) == 0
    inputs = json.loads((out / "inputs.json").read_text())
    (out / "inputs.json").write_text(json.dumps({k: v for k, v in inputs.items() if k != "run_config"}))
    (out / "config.json").write_text(json.dumps({**json.loads((out / "config.json").read_text()), "lr": 0.5}))
    err = cli_error(capsys, _train_args(model_dir, pairs, out, "--max-steps", "5", "--resume", "--batch-size", "2"))
    assert "cannot resume with a different configuration; changed: lr" in err, err  # a run from before: compared


def test_a_resume_says_which_steps_metrics_jsonl_lost(tmp_path, model_dir, capsys):
    """metrics.jsonl removed, or a line of it, before a resume: the run went on and its curve was silently short of
    those steps (found 2026-12-07 evening); a torn or garbled line was already said."""
    from opct.train.rundir import _steps

    assert _steps([2]) == "step 2" and _steps([1, 2, 3, 7, 9, 10]) == "steps 1-3, 7, 9-10"
    pairs, out = tiny_lm.write_pairs(tmp_path / "p.jsonl"), tmp_path / "run"
    assert main(_train_args(model_dir, pairs, out, "--max-steps", "2", "--save-every", "1")) == 0
    (out / "metrics.jsonl").unlink()
    capsys.readouterr()
    assert main(_train_args(model_dir, pairs, out, "--max-steps", "3", "--save-every", "1", "--resume")) == 0
    assert f"opct train: {out / 'metrics.jsonl'}: missing; the checkpoint trained steps 1-2, so steps 1-2 have no " \
           "metrics (the file was removed or edited)" in capsys.readouterr().err
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [3]
    assert main(_train_args(model_dir, pairs, out, "--max-steps", "4", "--save-every", "1", "--resume")) == 0
    assert "lacks the lines of steps 1-2; the checkpoint trained steps 1-3, so steps 1-2 have no metrics" in \
        capsys.readouterr().err  # said at every resume: the file keeps the gap
    rows = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text(rows[1] + "\n")  # step 3's line removed too
    assert main(_train_args(model_dir, pairs, out, "--max-steps", "5", "--save-every", "1", "--resume")) == 0
    assert "lacks the lines of steps 1-3; the checkpoint trained steps 1-4, so steps 1-3 have no metrics" in \
        capsys.readouterr().err


def test_a_teacher_model_that_is_no_directory_is_named_by_its_flag(tmp_path, model_dir, pairs_file, capsys):
    """`--teacher-model X` that is no directory said "model 'X': not a directory", which reads as --model (found
    2026-12-07)."""
    missing = tmp_path / "nosuch"
    err = cli_error(capsys, _train_args(model_dir, pairs_file, tmp_path / "run", "--max-steps", "1",
                                        "--teacher-model", str(missing)))
    assert err.startswith(f"opct: error: --teacher-model '{missing}': not a directory (give a subject"), err


def test_a_finished_run_resumed_rewrites_final_with_the_same_bytes_whatever_the_hash_seed(tmp_path, model_dir,
                                                                                            pairs_file):
    """peft writes `target_modules` in set order, which follows the process's string hash seed: a finished LoRA run
    resumed rewrote final/adapter_config.json with the names in another order, and an eval resumed on that adapter
    was refused ("holds other contents than when the run started"); a wash-out study killed between a dose's wash
    and its evaluation could never be resumed (found 2026-12-07)."""
    out = tmp_path / "run"
    argv = _train_args(model_dir, pairs_file, out, "--max-steps", "1", "--no-progress")

    def train(seed: str, *extra):
        done = subprocess.run([sys.executable, "-m", "opct.cli", *argv, *extra], capture_output=True, text=True,
                              env={**_env(), "PYTHONHASHSEED": seed}, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return {p.relative_to(out / "final"): p.read_bytes() for p in (out / "final").rglob("*") if p.is_file()}

    first = train("1")
    names = json.loads(first[Path("adapter_config.json")])["target_modules"]
    assert isinstance(names, list) and names == sorted(names) and len(names) > 1
    for seed in ("2", "3", "4"):
        assert train(seed, "--resume") == first


def test_every_rank_checks_a_resume_before_the_main_one_rewrites_its_config(tmp_path, model_dir, pairs_file):
    """The main rank rewrote inputs.json and config.json while another rank was still checking them: that rank read
    the new digest beside the old config.json, refused the resume as "edited since the run last started" and left
    the main one waiting at the next collective (the ZeRO-2 resume test failed that way about one launch in three).
    The writes now come after a barrier every rank reaches once its checks are done."""
    from opct.train.config import TrainConfig
    from opct.train.rundir import prepare_run_dir

    out = tmp_path / "run"
    assert main(_train_args(model_dir, pairs_file, out, "--max-steps", "1", "--lr-schedule", "constant")) == 0
    before = {name: (out / name).read_bytes() for name in ("config.json", "inputs.json")}
    seen = []
    cfg = json.loads(before["config.json"])
    resumed = TrainConfig(**{**cfg, "max_steps": 2, "resume": True})
    prepare_run_dir(out, resumed, True, barrier=lambda: seen.append({n: (out / n).read_bytes() for n in before}))
    assert seen == [before]  # at the barrier: nothing rewritten yet
    assert json.loads((out / "config.json").read_text())["max_steps"] == 2
