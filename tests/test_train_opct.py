"""OPCT training end to end: objective sanity, learning, checkpoints and resume, DDP, the CLI, bad input."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tiny_lm
from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)
from opct.cli import main
from opct.errors import OpctError
from opct.losses import ESTIMATORS, log_probs, response_mask, reverse_kl_full
from opct.pairs.schema import load_pairs
from opct.policy import HFPolicy, Samples, load_policy, pack, response_logits
from opct.train.config import TrainConfig
from opct.train.loop import METRIC_KEYS, train

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(lora_r=4, batch_size=4, n_samples=2, max_new_tokens=8, tensorboard=False)


from tiny_lm import model_dir_fixture, pairs_file  # noqa: E402,F401  (module-scoped fixtures shared with other suites)
from tiny_lm import read_metrics as metrics  # noqa: E402


def _env():
    # one thread, like this process (see tiny_lm.one_thread): runs compared bit for bit must use the same kernels
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


# ------------------------------------------------------------------------------------------------ the objective

@pytest.mark.parametrize("estimator,lora", [("full", True), ("topk", True), ("sampled", True), ("full", False)])
def test_identical_prompts_give_zero_loss_and_zero_gradient(tmp_path, model_dir, estimator, lora):
    pairs = [dict(p, teacher=p["student"]) for p in tiny_lm.make_pairs()]
    pf = tiny_lm.write_pairs(tmp_path / "same.jsonl", pairs)
    run = train(TrainConfig(model=str(model_dir), pairs=str(pf), out=str(tmp_path / "run"), max_steps=1, lr=1e-2,
                            estimator=estimator, lora=lora, topk=5, **SMALL))
    (m,) = metrics(run)
    assert m["loss"] == 0.0 and m["mean_delta"] == 0.0 and m["grad_norm"] == 0.0
    assert m["tokens"] > 0 and m["teacher_ce"] > 0  # there was something to learn from
    if lora:  # B starts at zero and a zero gradient leaves Adam's update at zero
        adapter = load_file(run / "final" / "adapter_model.safetensors")
        assert all(float(v.abs().max()) == 0.0 for k, v in adapter.items() if "lora_B" in k)
    else:
        before, after = load_file(model_dir / "model.safetensors"), load_file(run / "final" / "model.safetensors")
        assert all(torch.equal(before[k], after[k]) for k in before)


def _heldout_kl(policy: HFPolicy, base: HFPolicy, pairs) -> float:
    """Mean per-token KL(student || starting model on the teacher prompt) along the student's own samples."""
    torch.manual_seed(123)
    s_ids = [policy.render(p.student) for p in pairs for _ in range(8)]
    t_ids = [policy.render(p.teacher) for p in pairs for _ in range(8)]
    smp = policy.sample(s_ids, 8)
    with torch.no_grad():
        s_logits = response_logits(policy.model, pack(s_ids, smp.response_ids, policy.pad_id, "cpu"))
        t_batch = pack(t_ids, smp.response_ids, base.pad_id, "cpu")
        t_logits = response_logits(base.model, t_batch)
    mask = response_mask(t_batch.response_ids_B_R, t_batch.response_lengths_B, policy.eos_ids)
    return float((reverse_kl_full(log_probs(s_logits), log_probs(t_logits)) * mask).sum() / mask.sum())


def test_opct_lowers_heldout_kl_and_leaves_the_base_model_unchanged(tmp_path, model_dir, pairs_file):
    heldout = [p for p in load_pairs(pairs_file) if p.split == "heldout"]
    base = load_policy(model_dir)
    before = _heldout_kl(base, base, heldout)
    # 60 steps: at 30 the ratio over training seeds spreads over ~0.1-0.7 (with either sampler), at 60 over ~0.01-0.25
    run = train(TrainConfig(model=str(model_dir), pairs=str(pairs_file), out=str(tmp_path / "run"), max_steps=60,
                            lr=3e-3, save_every=100, **SMALL))
    trained = load_policy(model_dir, adapter=run / "final")
    after = _heldout_kl(trained, base, heldout)
    assert before > 0.3 and after < 0.4 * before, (before, after)

    ids = [base.render(p.student) for p in heldout]
    batch = pack(ids, [[base.eos_ids[0]]] * len(ids), base.pad_id, "cpu")
    with torch.no_grad():
        original = response_logits(base.model, batch)
        adapted = response_logits(trained.model, batch)
        with trained.model.disable_adapter():
            disabled = response_logits(trained.model, batch)
    # Same numbers up to float rounding (two separately loaded copies may take different matmul kernel paths) ...
    assert torch.allclose(disabled, original, atol=1e-5, rtol=0)
    assert not torch.allclose(adapted, original, atol=1e-3)
    # ... because the base weights under the adapter are bit-for-bit the starting ones.
    start = load_file(model_dir / "model.safetensors")
    under = {k.replace("base_model.model.", "").replace("base_layer.", ""): v
             for k, v in trained.model.state_dict().items() if "lora_" not in k}
    assert start.keys() == under.keys() and all(torch.equal(start[k], under[k]) for k in start)


def test_loss_scale_does_not_depend_on_gradient_accumulation(tmp_path, model_dir, pairs_file, monkeypatch):
    """Normalisation by the step's token count: 1x4, 2x2 and 4x1 micro-batches give the same loss and gradient."""
    answer = tiny_lm.make_tokenizer().encode("the color is red . the", add_special_tokens=False)

    def fixed_sample(self, prompts_ids, max_new_tokens, temperature=1.0, min_new_tokens=0):
        responses = [answer[:2 + sum(p) % 5] + self.eos_ids for p in prompts_ids]  # lengths differ by prompt
        return Samples(responses, [""] * len(responses), [[0.0] * len(r) for r in responses], [False] * len(responses))

    monkeypatch.setattr(HFPolicy, "sample", fixed_sample)
    results = []
    for bs, accum in ((4, 1), (2, 2), (1, 4)):
        cfg = dict(SMALL, batch_size=bs)
        run = train(TrainConfig(model=str(model_dir), pairs=str(pairs_file), out=str(tmp_path / f"r{bs}"),
                                max_steps=1, grad_accum=accum, **cfg))
        results.append(metrics(run)[0])
    assert len({r["tokens"] for r in results}) == 1
    for r in results[1:]:
        assert r["loss"] == pytest.approx(results[0]["loss"], rel=1e-5)
        assert r["grad_norm"] == pytest.approx(results[0]["grad_norm"], rel=1e-4)


# ------------------------------------------------------------------------------------------------ runs and resume

def _cli_args(model_dir, pairs_file, out, *extra):
    return ["train", "--model", str(model_dir), "--pairs", str(pairs_file), "--out", str(out), "--lora-r", "4",
            "--batch-size", "4", "--n-samples", "2", "--max-new-tokens", "8", "--no-tensorboard", *extra]


def test_cli_smoke_config_file_and_resume(tmp_path, model_dir, pairs_file, capsys):
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(json.dumps({"lr": 0.002, "seed": 5, "max_steps": 9}))
    out = tmp_path / "run"
    assert main(_cli_args(model_dir, pairs_file, out, "--config", str(cfg_file), "--max-steps", "2",
                          "--save-every", "1")) == 0
    saved = json.loads((out / "config.json").read_text())
    assert (saved["lr"], saved["seed"], saved["max_steps"]) == (0.002, 5, 2)  # file < flags
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2] and all(set(METRIC_KEYS) <= set(r) for r in rows)
    assert {p.name for p in (out / "checkpoints").iterdir()} == {"step-000001", "step-000002"}
    ckpt = out / "checkpoints" / "step-000002"
    assert {"adapter", "optimizer.pt", "scheduler.pt", "rng-0.pt", "state.json"} <= {p.name for p in ckpt.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json"} <= {
        p.name for p in (out / "final").iterdir()}
    err = capsys.readouterr().err
    assert "more than once" not in err and "opct train: 100%" in err  # the progress bar
    # continue the finished run for one more step, without the bar (a setting a resume may change)
    assert main(_cli_args(model_dir, pairs_file, out, "--config", str(cfg_file), "--max-steps", "3", "--resume",
                          "--no-progress")) == 0
    assert [r["step"] for r in metrics(out)] == [1, 2, 3]
    err = capsys.readouterr().err
    assert "opct train" not in err and "Loading weights" not in err, err
    # a step larger than the pairs file repeats pairs within the step: said, not silent
    few = tiny_lm.write_pairs(tmp_path / "few.jsonl", tiny_lm.make_pairs()[:3])
    assert main(_cli_args(model_dir, few, tmp_path / "few", "--max-steps", "1", "--grad-accum", "2")) == 0
    err = capsys.readouterr().err
    assert "opct: note: a step takes 8 pairs (batch size x grad accum x processes) but " in err, err[:600]
    assert f"{few} has 2 of split 'train': each step holds some of them more than once" in err, err[:600]


def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path, model_dir, pairs_file):
    steps, extra = 30, ["--max-steps", "30", "--save-every", "3", "--seed", "7", "--lr", "0.003"]
    ref = train(TrainConfig(model=str(model_dir), pairs=str(pairs_file), out=str(tmp_path / "ref"), max_steps=steps,
                            save_every=3, seed=7, lr=0.003, **SMALL))
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "opct.cli", *_cli_args(model_dir, pairs_file, out, *extra)]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not (out / "checkpoints" / "step-000003" / "state.json").exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.time() < deadline
        time.sleep(0.01)
    time.sleep(0.15)  # let it get a little further, so the kill lands mid-run (possibly mid-checkpoint)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "final").exists()
    # resume in this process (a second interpreter start costs seconds; the CLI path is the same)
    assert main(_cli_args(model_dir, pairs_file, out, *extra, "--resume")) == 0

    a, b = (load_file(run / "final" / "adapter_model.safetensors") for run in (ref, out))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    got, want = metrics(out), metrics(ref)
    assert [r["step"] for r in got] == list(range(1, steps + 1))
    assert [r["loss"] for r in got] == [r["loss"] for r in want]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WORKER = """
import json, sys
import torch
import opct.train.loop as loop
from opct.train.config import TrainConfig

def spy(out, acc, model, policy, _save=loop._save_final):
    params = {k: v.detach().clone() for k, v in acc.unwrap_model(model).named_parameters() if v.requires_grad}
    torch.save(params, f"{sys.argv[2]}/rank{acc.process_index}.pt")
    _save(out, acc, model, policy)

loop._save_final = spy
loop.train(TrainConfig(**json.loads(sys.argv[1])))
"""


def test_accelerate_launch_two_cpu_processes_agree(tmp_path, model_dir, pairs_file):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    cfg = dict(SMALL, model=str(model_dir), pairs=str(pairs_file), out=str(tmp_path / "run"), max_steps=2,
               batch_size=2, lr=3e-3)
    # accelerate's --cpu launcher starts one process unless MPI is present; torchrun (--multi_gpu) with
    # ACCELERATE_USE_CPU starts the processes and accelerate picks gloo.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
           str(_free_port()), str(worker), json.dumps(cfg), str(tmp_path)]
    done = subprocess.run(cmd, env={**_env(), "ACCELERATE_USE_CPU": "1", "TMPDIR": str(tmp_path)},  # torchelastic_*
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert r0.keys() == r1.keys() and all(torch.equal(r0[k], r1[k]) for k in r0)
    assert any(float(v.abs().max()) > 0 for k, v in r0.items() if "lora_B" in k)  # a real update happened
    assert len(metrics(tmp_path / "run")) == 2  # written once, by the main process
    assert json.loads((tmp_path / "run" / "checkpoints" / "step-000002" / "state.json").read_text())[
        "world_size"] == 2
    assert {p.name for p in (tmp_path / "run" / "checkpoints" / "step-000002").glob("rng-*.pt")} == {
        "rng-0.pt", "rng-1.pt"}


# ------------------------------------------------------------------------------------------------ bad input

def test_nan_steps_are_skipped_counted_and_stop_the_run(tmp_path, model_dir, pairs_file, monkeypatch):
    calls = {"n": 0}
    real = ESTIMATORS["full"]

    def nan_from_third_step(*args, **kwargs):
        calls["n"] += 1
        surrogate, value = real(*args, **kwargs)
        if calls["n"] >= 3:
            surrogate, value = surrogate * float("nan"), value * float("nan")
        return surrogate, value

    monkeypatch.setitem(ESTIMATORS, "full", nan_from_third_step)
    out = tmp_path / "run"
    with pytest.raises(OpctError, match=r"step 4: loss or gradient not finite for 2 consecutive steps.*step-000003"):
        train(TrainConfig(model=str(model_dir), pairs=str(pairs_file), out=str(out), max_steps=10, save_every=1,
                          max_nan_steps=2, lr=1e-2, **SMALL))
    rows = metrics(out)
    assert [(r["step"], r["skipped"], r["nan_steps"]) for r in rows] == [
        (1, False, 0), (2, False, 0), (3, True, 1), (4, True, 2)]
    assert rows[2]["loss"] is None
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == ["step-000002", "step-000003"]
    good, after_skip = (load_file(out / "checkpoints" / c / "adapter" / "adapter_model.safetensors") for c in ckpts)
    assert all(torch.equal(good[k], after_skip[k]) for k in good)  # the skipped step changed nothing
    assert all(bool(torch.isfinite(v).all()) for v in good.values())


def test_weights_that_are_not_finite_are_never_written_nor_resumed(tmp_path, model_dir, pairs_file, monkeypatch):
    """At lr 1e308 the first update (on a finite loss and gradient) made the adapter NaN: the run said "done" with it
    in final/, and with --save-every 1 wrote it as a checkpoint that its error called "last good" (a resume loaded it
    and failed again). At BCT's lr 1e30 the adapter stayed finite (1e30) but every later loss was NaN: the skipped
    steps, fewer than max_nan_steps, ended the run "done"."""
    cfg = dict(model=str(model_dir), pairs=str(pairs_file), max_steps=3, save_every=1, **SMALL)
    out = tmp_path / "huge-lr"
    with pytest.raises(OpctError, match=r"^step 1: the update made the weights non-finite \(weight \S+lora_\S+ holds "
                                        r"(NaN|inf); .*\(last good checkpoint: none\)\. Lower --lr \(this step's was "
                                        r"1e\+308\)\.$"):
        train(TrainConfig(out=str(out), lr=1e308, **cfg))
    assert not (out / "checkpoints").exists() and not (out / "final").exists()

    real = ESTIMATORS["full"]
    calls = {"n": 0}

    def nan_from_third_step(*args, **kwargs):
        calls["n"] += 1
        surrogate, value = real(*args, **kwargs)
        return (surrogate * float("nan"), value * float("nan")) if calls["n"] >= 3 else (surrogate, value)

    with monkeypatch.context() as m:
        m.setitem(ESTIMATORS, "full", nan_from_third_step)
        out = tmp_path / "nan-at-the-end"
        with pytest.raises(OpctError, match=r"^step 3: loss or gradient not finite in the last 1 step\(s\) of the run "
                                            r".*last good checkpoint: \S+step-000002\)"):
            train(TrainConfig(out=str(out), lr=1e-2, max_nan_steps=3, **cfg))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001", "step-000002"]  # not step 3
    assert not (out / "final").exists()

    # a checkpoint written with NaN weights (as before they were checked) is damage: never resumed from
    import opct.train.loop as loop

    out = tmp_path / "written-before"
    with monkeypatch.context() as m:
        m.setattr(loop, "non_finite", lambda named: None)
        train(TrainConfig(out=str(out), lr=1e308, **{**cfg, "max_steps": 1}))
    with pytest.raises(OpctError, match=r"no intact checkpoint to resume from \(step-000001: adapter/ weight \S+ "
                                        r"holds (NaN|inf) \(the run had diverged\)\)"):
        train(TrainConfig(out=str(out), lr=1e308, resume=True, **{**cfg, "max_steps": 2}))


_cli_error = tiny_lm.cli_error


def _bad_pairs(tmp_path, edit):
    pairs = tiny_lm.make_pairs()
    edit(pairs)
    return tiny_lm.write_pairs(tmp_path / "bad.jsonl", pairs)


def test_bad_input_stops_with_one_clear_line(tmp_path, model_dir, pairs_file, capsys):
    args = lambda pf, out="run", *x: _cli_args(model_dir, pf, tmp_path / out, "--max-steps", "1", *x)  # noqa: E731

    pf = _bad_pairs(tmp_path, lambda ps: ps[1].pop("student"))
    assert "bad.jsonl:2: student: missing" in _cli_error(capsys, args(pf))

    pf = _bad_pairs(tmp_path, lambda ps: ps[0]["teacher"][0].update(content="   "))
    assert "bad.jsonl:1: teacher[0].content: empty prompt text" in _cli_error(capsys, args(pf))

    long = " ".join(["sky"] * 70)
    pf = _bad_pairs(tmp_path, lambda ps: ps[3]["student"][0].update(content=long))
    pid = tiny_lm.make_pairs()[3]["id"]
    # the pairs file and its line too (2026-12-07: the pair's id only)
    assert f"bad.jsonl:4: pair {pid} (student prompt): prompt is" in _cli_error(capsys, args(pf, "run", "--split",
                                                                                          "all"))

    pf = _bad_pairs(tmp_path, lambda ps: [p["meta"].update(split="heldout") for p in ps])
    assert "no pairs with meta.split == 'train'" in _cli_error(capsys, args(pf))

    assert main(args(pairs_file, "done")) == 0
    capsys.readouterr()
    assert "already holds a run; pass --resume" in _cli_error(capsys, args(pairs_file, "done"))
    assert "changed: lr" in _cli_error(capsys, args(pairs_file, "done", "--resume", "--lr", "0.5"))
    assert "--model is required" in _cli_error(capsys, ["train", "--pairs", str(pairs_file), "--out", "x"])
    assert "not a model directory" in _cli_error(capsys, _cli_args(tmp_path, pairs_file, tmp_path / "r2"))


def test_rng_states_round_trip_through_a_weights_only_load(tmp_path):
    import random

    import numpy as np

    from opct.train.checkpoint import _rng_state, _set_rng_state

    torch.save(_rng_state(), tmp_path / "rng.pt")
    first = (random.random(), np.random.randn(3).tolist(), torch.rand(3))
    _set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    again = (random.random(), np.random.randn(3).tolist(), torch.rand(3))
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])
