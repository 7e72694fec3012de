"""`opct report` (experiment, threats and robustness runs) and `opct audit --report-only` on run files of the wrong
shape: each is one `opct: error:` line naming the file (and line), the field and what it must be, where they were
AttributeError / TypeError tracebacks, and a file where a run's directory belongs is named as one, where the report
read that cell as "not started" and exited 0. The runs are assembled from their JSON files, without training."""

import json
import os

import pytest
from tiny_lm import cli_error

from opct.errors import OpctError
from opct.shapes import INT, NUM, mismatch


@pytest.mark.parametrize("value, shape, expected", [
    ({"a": 1}, {"a": NUM}, None),
    ({"a": True}, {"a": NUM}, ("a", "must be a number (got true)")),
    ({}, {"a": NUM, "b?": NUM}, ("a", "missing")),
    ({"a": None}, {"a": (None, {"b": INT})}, None),
    ({"a": 5}, {"a": (None, {"b": INT})}, ("a", "must be an object or null (got 5)")),
    ({"a": {"b": 1.5}}, {"a": (None, {"b": INT})}, ("a.b", "must be an integer (got 1.5)")),
    ({"m": {"x": [1, "2"]}}, {"m": {"*": [INT]}}, ("m.x[1]", 'must be an integer (got "2")')),
    ([], {"a": NUM}, ("", "must be an object (got [])")),
])
def test_a_shape_names_the_first_field_that_differs(value, shape, expected):
    assert mismatch(value, shape) == expected


def _write(path, value):
    """`value` (a string as is, else as JSON) at `path`, in place of a directory there (a file where a run's folder
    belongs)."""
    import shutil

    if path.is_dir():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if isinstance(value, str) else json.dumps(value))


# ------------------------------------------------------------------------------------------ experiment (`opct run`)

def _experiment(tmp_path):
    run = tmp_path / "run"
    _write(run / "experiment.json", {"name": "demo", "arms": ["base", "bct"], "seeds": [0]})
    for arm in ("base", "bct"):
        _write(run / arm / "0" / "eval" / "metrics.json", {"m": {"value": 0.5, "ci_low": None, "ci_high": None}})
        _write(run / arm / "0" / "done.json", {"arm": arm, "seed": 0, "seconds": {"eval": 1.0}})
    return run


@pytest.mark.parametrize("where, value, expected", [
    ("bct", "x", "bct: is a file, expected a directory"),
    ("bct/0", "x", "bct/0: is a file, expected a directory"),
    ("bct/0/eval", "x", "bct/0/eval: is a file, expected a directory"),
    ("bct/0/train", "x", "bct/0/train: is a file, expected a directory"),
    ("bct/0/done.json", [], "bct/0/done.json: must be an object (got [])"),
    # a done.json without its arm or seed (or with a seed of "0") was taken as its folder's (2026-12)
    ("bct/0/done.json", {"seed": 0}, "bct/0/done.json: arm: missing"),
    ("bct/0/done.json", {"arm": "bct"}, "bct/0/done.json: seed: missing"),
    ("bct/0/done.json", {"arm": "bct", "seed": "0"}, "bct/0/done.json: seed: must be an integer (got \"0\")"),
    ("bct/0/done.json", {"arm": "bct", "seed": 0, "seconds": {"eval": "1 s"}},
     "bct/0/done.json: seconds.eval: must be a number (got \"1 s\")"),
    ("bct/0/eval/run.json", [1], "bct/0/eval/run.json: must be an object (got [1])"),
    ("bct/0/eval/run.json", {"lm_eval_errors": ["mmlu"]},
     "bct/0/eval/run.json: lm_eval_errors: must be an object (got [\"mmlu\"])"),
    ("bct/0/eval/run.json", {"lm_eval_errors": {"mmlu": 3}},
     "bct/0/eval/run.json: lm_eval_errors.mmlu: must be a string (got 3)"),
])
def test_experiment_run_files_of_the_wrong_shape(tmp_path, capsys, where, value, expected):
    from opct.report import load_run

    run = _experiment(tmp_path)
    assert set(load_run(run).cells) == {("base", 0), ("bct", 0)} and not load_run(run).missing
    _write(run / where, value)
    assert cli_error(capsys, ["report", str(run)]) == f"opct: error: {run}/{expected}"


def test_an_experiment_json_with_no_seeds_and_cells_emptied_since_are_said(tmp_path, capsys):
    """Found 2026-12-07 evening: `"seeds": []` in experiment.json made a report of dashes (rc 0, nothing missing);
    an eval/metrics.json emptied after the cell was done showed its arm as unmeasured; and a run.json listing an axis
    that metrics.json holds nothing of likewise."""
    from opct.report import load_run

    run = _experiment(tmp_path)
    _write(run / "bct/0/eval/metrics.json", {})
    _write(run / "base/0/eval/run.json", {"config": {}, "done": ["m", "sycophancy"]})
    assert load_run(run).missing == [("base", 0, "done.json, but eval/metrics.json holds nothing of axis sycophancy"),
                                     ("bct", 0, "done.json, but eval/metrics.json holds no metrics")]
    _write(run / "experiment.json", {"name": "demo", "arms": ["base", "bct"], "seeds": []})
    assert cli_error(capsys, ["report", str(run)]) == \
        f"opct: error: {run}/experiment.json: seeds: an empty list; `opct run` writes the seeds it runs"


# ------------------------------------------------------------------------------------------ threats runs

CONTROL = {"seed": 0, "threat": "", "method": "control"}  # what seed0/control/done.json says it marks


def _threats(tmp_path, settings=None):
    root = tmp_path / "thr"
    _write(root / "threats.json", settings or {"name": "thr", "seeds": [0], "threats": ["sycophancy"],
                                               "methods": ["bct"]})
    for cell in ("base", "control", "sycophancy/bct"):
        threat, _, method = cell.rpartition("/")
        _write(root / "seed0" / cell / "done.json", {"seed": 0, "threat": threat, "method": method,
                                                     "seconds": {"eval": 1.0}, "metrics": {
            "sycophancy.sycophancy_rate": {"value": 0.5, "higher_is_better": False}}})
    return root


@pytest.mark.parametrize("where, value, expected", [
    ("threats.json", {"seeds": [0], "threats": 5}, "threats.json: threats: must be a list (got 5)"),
    ("threats.json", [1], "threats.json: must be an object (got [1])"),
    ("threats.json", {"seeds": [0], "threats": ["../x"], "methods": ["bct"]},
     "threats.json: threats[0]: must be a name of one folder (got \"../x\")"),
    ("threats.json", {"seeds": [0], "threats": [], "methods": [], "no_signal": {"x": "bct"}},
     "threats.json: no_signal.x: must be a list (got \"bct\")"),
    ("threats.json", {"seeds": [0], "threats": [], "methods": [], "train": 3},
     "threats.json: train: must be an object or null (got 3)"),
    # found 2026-12-07: `{}` or a name of 5 gave a report reading "model: None (None)" and "training: None steps x
    # None rows", rc 0
    ("threats.json", {}, "threats.json: seeds: missing"),
    ("threats.json", {"name": 5, "seeds": [0], "threats": ["sycophancy"], "methods": ["bct"]},
     "threats.json: name: must be a string (got 5)"),
    ("threats.json", {"seeds": [0], "threats": [], "methods": [], "train": {"max_steps": "4"}},
     "threats.json: train.max_steps: must be an integer or null (got \"4\")"),
    ("seed0/base/done.json", [], "seed0/base/done.json: must be an object (got [])"),
    ("seed0/control/done.json", {**CONTROL, "metrics": {"m": 0.5}},
     "seed0/control/done.json: metrics.m: must be an object"),
    ("seed0/control/done.json", {**CONTROL, "seconds": {"eval": None}},
     "seed0/control/done.json: seconds.eval: must be a number (got null)"),
    # a done.json that did not say which cell it marks (or said it with a string for a number) was taken as its
    # folder's, and one of another cell was read as this one's (2026-12)
    ("seed0/control/done.json", {"seed": 0, "method": "control"}, "seed0/control/done.json: threat: missing"),
    ("seed0/control/done.json", {**CONTROL, "seed": "0"},
     "seed0/control/done.json: seed: must be an integer (got \"0\")"),
    ("seed0/control/done.json", {**CONTROL, "method": "base"},
     "seed0/control/done.json: method: 'base', but the cell's folder is seed0/control: a cell copied"),
    ("seed0/sycophancy/bct/done.json", {"seed": 1, "threat": "sycophancy", "method": "bct"},
     "seed0/sycophancy/bct/done.json: seed: 1, but the cell's folder is seed0/sycophancy/bct"),
    ("seed0", "x", "seed0: is a file, expected a directory"),
    ("seed0/sycophancy", "x", "seed0/sycophancy: is a file, expected a directory"),
])
def test_threats_run_files_of_the_wrong_shape(tmp_path, capsys, where, value, expected):
    from opct.cli import main

    root = _threats(tmp_path)
    assert main(["report", str(root)]) == 0
    _write(root / where, value)
    assert cli_error(capsys, ["report", str(root)]).startswith(f"opct: error: {root}/{expected}")


# ------------------------------------------------------------------------------------------ robustness runs

def _robustness(tmp_path):
    from opct.robustness.cells import row

    root = tmp_path / "rob"
    _write(root / "study.json", {"name": "rob", "seeds": [0], "studies": {"replay": {}}})
    _write(root / "replay" / "seed0" / "rows.json", {"seconds": 3.0, "rows": [
        row("replay", "opct", "sycophancy", "none", None, "sycophancy.sycophancy_rate", 0.2, False)]})
    return root


@pytest.mark.parametrize("where, value, expected", [
    ("replay/seed0/rows.json", [], "replay/seed0/rows.json: must be an object (got [])"),
    ("replay/seed0/rows.json", {"seconds": 1.0}, "replay/seed0/rows.json: rows: missing"),
    ("replay/seed0/rows.json", {"rows": [], "seconds": "3"},
     "replay/seed0/rows.json: seconds: must be a number or null (got \"3\")"),
    ("study.json", [], "study.json: must be an object (got [])"),
    ("study.json", {"seeds": "0", "studies": {}}, "study.json: seeds: must be a list (got \"0\")"),
    ("study.json", {"seeds": [0], "studies": {"replay": 1}}, "study.json: studies.replay: must be an object (got 1)"),
    ("study.json", {}, "study.json: seeds: missing"),  # found 2026-12-07: a report of "model: None (None)", rc 0
    ("study.json", {"seeds": [0]}, "study.json: studies: missing"),
    ("study.json", {"name": 5, "seeds": [0], "studies": {}}, "study.json: name: must be a string (got 5)"),
    ("study.json", {"seeds": [0], "studies": {"..": {}}}, "study.json: studies: '..' is no study's folder name"),
    ("replay", "x", "replay: is a file, expected a directory"),
    ("replay/seed0", "x", "replay/seed0: is a file, expected a directory"),
])
def test_robustness_run_files_of_the_wrong_shape(tmp_path, capsys, where, value, expected):
    from opct.cli import main

    root = _robustness(tmp_path)
    assert main(["report", str(root)]) == 0
    _write(root / where, value)
    assert cli_error(capsys, ["report", str(root)]) == f"opct: error: {root}/{expected}"


# ------------------------------------------------------------------------------------------ a running study run

def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("make, kind, what, aggregate", [
    (_threats, "threats", "threats run", "cross_threat.json"),
    (_robustness, "robustness", "robustness study", "robustness.json")])
def test_a_running_study_run_is_reported_with_out_and_only_read(tmp_path, capsys, make, kind, what, aggregate):
    """Before: `opct report RUN` on a threats or robustness run held the run directory's lock (the one `opct run
    FILE` holds), so a running one could not be reported at all, and `--out` was refused ("a {kind} run's report is
    written into its own directory"). Now `--out DIR` reads the run only (no lock, nothing written into it: no
    rows.json, no aggregate) and writes the aggregate, results.md and report.html into DIR; without --out the
    refusal names --out DIR."""
    from test_report import _hold

    from opct.cli import main

    root = make(tmp_path)
    (root / ".opct.lock").touch()  # as `opct run` leaves it
    before = _files(root)
    holder = _hold(root)
    try:
        assert cli_error(capsys, ["report", str(root)]) == (
            f"opct: error: {root}: {what} in use by another opct process (pid {holder.pid}); wait for it to finish, "
            f"or write the report elsewhere with --out DIR")
        out = tmp_path / "elsewhere"
        assert main(["report", str(root), "--out", str(out)]) == 0
    finally:
        holder.kill()
        holder.wait()
    assert {aggregate, "results.md", "report.html"} <= set(_files(out))
    assert json.loads((out / aggregate).read_text())  # the aggregate the report was built from
    assert str(root) in (out / "report.html").read_text()
    after = _files(root)
    after[".opct.lock"] = before[".opct.lock"]  # the holder wrote its pid there, as `opct run` does
    assert after == before
    assert cli_error(capsys, ["report", str(root), "--out", str(make(tmp_path / "other"))]).startswith(
        f"opct: error: {tmp_path / 'other'}/")  # --out into another run directory is refused (`_check_out`)


# ------------------------------------------------------------------------------------------ audits

def _measure(**over):
    return {"misalignment": 0.5, "unparsed": 0.0, "misalignment_parsed": 0.5, "capability": 1.0, "n": 100,
            "items": {"i": [50, 100]}, "capability_items": {"c": [10, 10]}, "by_kind": {}, **over}


def _audit(tmp_path, organism=None, cell=None):
    org = {"kind": "organism", "organism": "sycophancy", "seed": 0, "failure": "f", "base": _measure(),
           "derived": _measure(), "coherence": {k: 0.5 for k in ("agreement", "margin", "forms", "misaligned",
                                                                  "unparsed")}}
    c = {"kind": "cell", "organism": "sycophancy", "method": "bct", "seed": 0, "after": _measure(misalignment=0.3),
         "label": None, "seconds": {"total": 1.0}}
    lines = [{**org, **(organism or {})}, {**c, **(cell or {})}]
    _write(tmp_path / "results.jsonl", "".join(json.dumps(r) + "\n" for r in lines))


@pytest.mark.parametrize("organism, cell, expected", [
    (None, {"after": None}, ":2: after: must be an object (got null)"),
    (None, {"label": "x"}, ":2: label: must be an object or null (got \"x\")"),
    (None, {"label": {"n_labels": 3}}, ":2: label.n_prompts: missing"),
    (None, {"after": _measure(items={"i": [1]})}, ":2: after.items.i: must be a pair [hits, n] of integers"),
    (None, {"after": _measure(unparsed=None)}, ":2: after.unparsed: must be a rate from 0 to 1 (got null)"),
    (None, {"seconds": {}}, ":2: seconds.total: missing"),
    ({"derived": _measure(n=None)}, None, ":1: derived.n: must be an integer >= 0 (got null)"),
    ({"coherence": {"agreement": "high"}}, None, ":1: coherence.agreement: must be a rate from 0 to 1 or null"),
    ({"base": {**_measure(), "by_kind": []}}, None, ":1: base.by_kind: must be an object (got [])"),
    ({"kind": "base", "sycophancy_probes": {}, "target": 0.1}, None, ":1: sycophancy_probes.plain: missing"),
])
def test_audit_results_of_the_wrong_shape_name_the_line_and_field(tmp_path, capsys, organism, cell, expected):
    from opct.audit.report import summarise

    _audit(tmp_path)
    assert summarise(tmp_path)["cells"][0]["method"] == "bct"  # the records as `opct audit` writes them
    _audit(tmp_path, organism, cell)
    err = cli_error(capsys, ["audit", "--out", str(tmp_path), "--report-only"])
    assert err.startswith(f"opct: error: {tmp_path / 'results.jsonl'}{expected}"), err


@pytest.mark.parametrize("record, expected", [
    ({"scores": "high", "misaligned": [], "chosen": 0}, ":1: scores: must be a list"),
    ({"scores": [1.0], "misaligned": ["yes"], "chosen": 0}, ":1: misaligned[0]: must be a boolean, a number or null"),
    ({"scores": [1.0], "misaligned": [True], "chosen": "0"}, ":1: chosen: must be an integer or null"),
    ({"scores": [1.0, 0.5], "misaligned": [True, False], "chosen": -1}, ":1: chosen: -1 is no candidate's index (0 to 1)"),
    ({"scores": [1.0], "misaligned": [True], "chosen": 1}, ":1: chosen: 1 is no candidate's index (0 to 0)"),
    ({"scores": [1.0], "misaligned": [True, False], "chosen": 0}, ":1: scores: 1 scores for 2 candidates"),
])
def test_audit_candidates_of_the_wrong_shape_name_the_line_and_field(tmp_path, capsys, record, expected):
    _audit(tmp_path)
    path = tmp_path / "cells" / "sycophancy" / "bct" / "seed0" / "candidates.jsonl"
    _write(path, json.dumps(record) + "\n")
    err = cli_error(capsys, ["audit", "--out", str(tmp_path), "--report-only"])
    assert err.startswith(f"opct: error: {path}{expected}"), err


def test_a_file_where_a_directory_belongs_is_named(tmp_path):
    from opct.files import dir_there

    (tmp_path / "a").write_text("x")
    assert not dir_there(tmp_path / "b" / "c", tmp_path) and dir_there(tmp_path)
    for path in (tmp_path / "a", tmp_path / "a" / "b"):
        with pytest.raises(OpctError, match=f"^{tmp_path / 'a'}: is a file, expected a directory$"):
            dir_there(path, tmp_path)
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")  # a run directory moved away from under its link
    with pytest.raises(OpctError, match=f"^{tmp_path / 'gone'}: is a broken symbolic link, expected a directory$"):
        dir_there(tmp_path / "gone" / "seed0", tmp_path)
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(OpctError, match=f"^{tmp_path / 'pipe'}: is a special file, expected a directory$"):
        dir_there(tmp_path / "pipe")


def test_a_threats_or_robustness_header_never_reads_none(tmp_path):
    """Found 2026-12-07: a threats.json or study.json without model or train (hand-made, or written before them) gave
    a report reading "model: None (None)" and "training: None steps x None rows"; what is not recorded is left out,
    or '?'."""
    from opct.cli import main

    for root in (_threats(tmp_path), _robustness(tmp_path)):
        assert main(["report", str(root)]) == 0
        md = (root / "results.md").read_text()
        assert "None" not in md and "**model**: ?" in md


def test_a_robustness_evaluations_done_json_must_say_what_it_evaluated(tmp_path):
    """A robustness evaluation's done.json (`opct.robustness.cells.evaluate`) with metrics but no model or adapter
    (written by hand, or by another tool) was taken as done; it is refused naming the field, before any model loads,
    through the reader every done.json goes through (`opct.shapes.read_done`)."""
    from opct.errors import OpctError
    from opct.evals.run import EvalConfig
    from opct.robustness.cells import evaluate

    metrics = {"sycophancy.sycophancy_rate": {"value": 0.5}}
    done = tmp_path / "done.json"
    for value, problem in (({"metrics": metrics}, "model: missing"),
                           ({"model": "m", "metrics": metrics}, "adapter: missing"),
                           ({"model": 5, "adapter": None, "metrics": metrics}, "model: must be a string (got 5)")):
        _write(done, value)
        with pytest.raises(OpctError) as e:
            evaluate("no-such-model", None, ["sycophancy"], EvalConfig(), {}, 0, tmp_path, print)
        assert str(e.value) == f"{done}: {problem}"
    _write(done, {"model": "m", "adapter": None, "metrics": metrics})
    assert evaluate("no-such-model", None, ["sycophancy"], EvalConfig(), {}, 0, tmp_path, print) == metrics
