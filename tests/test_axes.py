"""The shape of the axes (opct/axes): one module per threat axis and a registry that every stage loops over. A toy
axis defined in one file (tests/toy_axis.py) shows up in `opct pairs make`, `opct eval`, `opct run` and the
report's tables with no other change; arms are named variants of a method."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tiny_lm import one_thread  # noqa: F401

from opct.axes import AXES

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def toy():
    """The toy axis, registered for one test and removed after it (the registry is process-wide)."""
    sys.path.insert(0, str(Path(__file__).parent))
    module = importlib.reload(importlib.import_module("toy_axis")) if "toy_axis" in sys.modules \
        else importlib.import_module("toy_axis")
    yield module
    AXES.pop("toy", None)
    sys.path.remove(str(Path(__file__).parent))


def test_a_toy_axis_runs_through_pairs_eval_run_and_the_report(toy, tmp_path, capsys, test_organism):
    from opct.cli import main

    pairs = tmp_path / "toy.jsonl"
    assert main(["pairs", "make", "--axis", "toy", "--out", str(pairs)]) == 0
    rows = [json.loads(x) for x in pairs.read_text().splitlines()]
    assert {r["axis"] for r in rows} == {"toy"} and {r["meta"]["family"] for r in rows} == {"caps", "bang"}
    assert {r["meta"]["split"] for r in rows if r["meta"]["family"] == "bang"} == {"heldout"}
    assert main(["pairs", "check", str(pairs)]) == 0

    out = tmp_path / "eval"
    assert main(["eval", "--model", str(test_organism), "--suite", "toy", "--out", str(out), "--no-progress",
                 "--max-new-tokens", "12", "--trained", "toy=bang"]) == 0
    assert "Loading weights" not in capsys.readouterr().err  # --no-progress: not transformers' bar either
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"toy.consistency", "toy.consistency[split=train]", "toy.consistency[split=heldout]"} <= set(metrics)
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert {r["split"] for r in recs if r["family"] == "bang"} == {"train"}  # labelled from --trained

    exp = tmp_path / "toy.yaml"
    exp.write_text(yaml.safe_dump({
        "name": "toy", "model": str(test_organism), "out": str(tmp_path / "runs"), "arms": ["base", "opct"],
        # bang: the organism's tokenizer lower-cases, so a caps pair renders as its clean prompt and trains nothing
        # (an experiment trained on caps alone is refused since 2026-12-07: tests/test_guards.py)
        "trained": {"toy": ["bang"]}, "report": True,
        "train": {"max_steps": 2, "batch_size": 2, "n_samples": 2, "max_new_tokens": 8, "save_every": 2},
        "eval": {"suite": "toy", "max_new_tokens": 8, "progress": False}}))
    capsys.readouterr()
    assert main(["run", str(exp), "--no-progress"]) == 0
    printed, err = capsys.readouterr()
    assert "toy consistency" in printed  # the summary table
    assert "opct train" not in err and "Loading weights" not in err, err  # --no-progress: no cell's bars
    root = tmp_path / "runs" / "toy"
    trained_pairs = [json.loads(x) for x in (root / "pairs" / "seed0.jsonl").read_text().splitlines()]
    assert trained_pairs and {p["axis"] for p in trained_pairs} == {"toy"}
    assert {p["meta"]["family"] for p in trained_pairs} == {"bang"}
    md = (root / "results.md").read_text()
    assert "Toy: shouted questions" in md and "consistency (held-out)" in md
    assert "Toy: shouted questions" in (root / "report.html").read_text()


def test_a_toy_axis_from_the_environment_reaches_the_command_line(tmp_path):
    """OPCT_AXES names modules that register axes: the CLI in a fresh process offers the axis."""
    env = {**os.environ, "OPCT_AXES": "toy_axis", "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                                               os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "p.jsonl"
    res = subprocess.run([sys.executable, "-m", "opct.cli", "pairs", "make", "--axis", "toy", "--out", str(out)],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert out.exists() and "toy" in out.read_text()
    bad = subprocess.run([sys.executable, "-m", "opct.cli", "pairs", "make", "--axis", "toy", "--out", str(out)],
                         capture_output=True, text=True, env={**env, "OPCT_AXES": "no_such_module"}, cwd=tmp_path)
    assert bad.returncode != 0 and "OPCT_AXES" in bad.stderr and "Traceback" not in bad.stderr


def test_arms_are_named_variants_of_a_method(tmp_path, test_organism):
    """`opct` and `opct_topk` (the same method, another estimator) run side by side and are both reported."""
    from opct.experiment import load_experiment, run_experiment
    from opct.report import build_report, load_run

    exp = tmp_path / "arms.yaml"
    exp.write_text(yaml.safe_dump({
        "name": "arms", "model": str(test_organism), "out": str(tmp_path / "runs"), "report": False,
        "arms": {"base": {"method": "base"}, "opct": {"method": "opct"},
                 "opct_topk": {"method": "opct", "estimator": "topk", "topk": 5}},
        "trained": {"sycophancy": ["suggested_answer"]}, "per_family": 4,
        "train": {"max_steps": 2, "batch_size": 2, "n_samples": 2, "max_new_tokens": 8, "save_every": 2},
        "eval": {"suite": "sycophancy", "n": 4, "max_new_tokens": 8, "progress": False}}))
    cfg = load_experiment(exp)
    assert cfg.arm_config("opct_topk", model="m", pairs="p", out="o").estimator == "topk"
    assert cfg.arm_config("opct", model="m", pairs="p", out="o").estimator == "full"
    root = run_experiment(cfg, log=lambda m: None)
    saved = json.loads((root / "opct_topk" / "0" / "train" / "config.json").read_text())
    assert (saved["method"], saved["estimator"], saved["topk"]) == ("opct", "topk", 5)
    assert json.loads((root / "opct" / "0" / "train" / "config.json").read_text())["estimator"] == "full"
    run = load_run(root)
    assert run.arms == ["base", "opct", "opct_topk"] and len(run.cells) == 3
    _, md = build_report(run)
    table = md.read_text()
    assert "| opct_topk |" in table and "| opct |" in table and "opct_topk = method=opct, estimator=topk" in table
    # --arms picks arms of the file by name; a name the file does not define is the method of that name
    from opct.cli import build_parser

    args = build_parser().parse_args(["run", str(exp), "--arms", "base", "opct_topk", "bct"])
    picked = load_experiment(exp, args).arms
    assert picked == {"base": {"method": "base"}, "opct_topk": {"method": "opct", "estimator": "topk", "topk": 5},
                      "bct": {"method": "bct"}}


def test_a_subject_brings_its_own_items_per_axis(tmp_path, test_organism):
    """A subject (opct.subjects) names a model and, per axis, the items it is trained and evaluated on."""
    from opct.experiment import ExperimentConfig, run_experiment
    from opct.subjects import SUBJECTS, Subject, register

    items = tmp_path / "syc.jsonl"
    items.write_text("".join(json.dumps({"id": f"own-{i}", "question": f"Is the zorvik red? ({i})", "answer": "no",
                                         "wrong_answer": "yes"}) + "\n" for i in range(3)))
    register(Subject("own-items", "the test organism with three items of its own", lambda: Path(test_organism),
                     items={"sycophancy": str(items)}))
    try:
        cfg = ExperimentConfig(name="own", model="own-items", out=str(tmp_path / "runs"), arms=["base", "bct"],
                               trained={"sycophancy": ["suggested_answer"]}, report=False,
                               train={"max_steps": 1, "batch_size": 2, "max_new_tokens": 8},
                               eval={"suite": "sycophancy", "max_new_tokens": 8, "progress": False})
        root = run_experiment(cfg, log=lambda m: None)
    finally:
        SUBJECTS.pop("own-items")
    pairs = [json.loads(x) for x in (root / "pairs" / "seed0.jsonl").read_text().splitlines()]
    assert {p["meta"]["item_id"] for p in pairs} == {"own-0", "own-1", "own-2"}
    recs = [json.loads(x) for x in (root / "base/0/eval/records.jsonl").read_text().splitlines()]
    assert {r["item_id"] for r in recs} == {"own-0", "own-1", "own-2"}
    assert json.loads((root / "experiment.json").read_text())["model_dir"] == str(test_organism)


def test_an_experiment_run_in_process_gives_back_the_callers_thread_count(toy, tmp_path, test_organism):
    """`run_experiment` runs a small model on one thread (opct.policy.cpu_threads), and only while it runs: a script
    or notebook that calls it keeps its own intra-op thread count after (it used to be left at 1)."""
    import torch

    from opct.experiment import load_experiment, run_experiment

    cfg = load_experiment(name="toy", model=str(test_organism), out=str(tmp_path), arms=["base"], report=False,
                          trained={}, eval={"suite": "toy", "max_new_tokens": 4, "progress": False})
    torch.set_num_threads(2)  # this module's autouse fixture puts back its own count after
    run_experiment(cfg, log=lambda m: None)
    assert torch.get_num_threads() == 2
