"""Issue 19 item 5: the cross-threat matrix (`opct run FILE` with `kind: threats`). Real training and evaluation on
the `test` organism: 2 threats x 2 methods + the benign-SFT control, 2 seeds, 2 steps per cell."""

import json
import re
from pathlib import Path

import pytest
import yaml
from tiny_lm import one_thread  # noqa: F401

from opct.errors import OpctError

ROOT = Path(__file__).resolve().parents[1]
TINY = {"kind": "threats", "name": "tiny", "model": "test", "seeds": [0, 1], "threats": ["sycophancy", "prefill"],
        "methods": ["bct", "act"], "per_family": 2,
        "train": {"max_steps": 2, "batch_size": 2, "max_new_tokens": 8, "save_every": 2, "lora_r": 4, "lr": 0.01},
        "eval": {"n": 4, "max_new_tokens": 8, "samples": 1}}


def _write(tmp_path, **over) -> Path:
    path = tmp_path / f"threats-{len(list(tmp_path.glob('threats-*')))}.yaml"
    path.write_text(yaml.safe_dump({**TINY, "out": str(tmp_path / "runs"), **over}))
    return path


def _mark(d: Path, seed: int, cell: str, **done) -> None:
    """The done.json of the cell `cell` (`base`, `control`, `THREAT/METHOD`) of `seed`, in its folder `d`, as
    `run_threats` writes it: with the seed, threat and method it marks."""
    threat, _, method = cell.rpartition("/")
    (d / "done.json").write_text(json.dumps({"seed": seed, "threat": threat, "method": method, **done}))


@pytest.fixture(scope="module")
def tiny_run(test_organism, tmp_path_factory):
    from opct.threats import load_threats
    from opct.threats.report import build
    from opct.threats.runner import run_threats

    tmp = tmp_path_factory.mktemp("threats")
    path = _write(tmp)
    log: list[str] = []
    root = run_threats(load_threats(path), log=log.append)
    build(root)
    return path, root, log


def test_matrix_shape_and_deltas_are_method_minus_control_per_seed(tiny_run):
    _, root, _ = tiny_run
    m = json.loads((root / "cross_threat.json").read_text())
    assert [(r["threat"], r["method"]) for r in m["rows"]] == [("sycophancy", "bct"), ("sycophancy", "act"),
                                                               ("prefill", "bct"), ("prefill", "act")]
    metrics = [c["metric"] for c in m["columns"]]
    # every registered axis's summary metrics that the evaluation computed (no attacker), capability's accuracy too
    assert "capability.accuracy" in metrics and "prefill.par[on=heldout_prefills]" in metrics
    assert {c["axis"] for c in m["columns"]} >= {"sycophancy", "jailbreak", "awareness", "capability", "prefill"}
    assert not any("adaptive" in x for x in metrics)
    assert len(m["cells"]) == len(m["rows"]) * len(m["columns"])
    per_seed = {s: json.loads((root / f"seed{s}" / "rows.json").read_text())["rows"] for s in (0, 1)}
    from opct.report.aggregate import t_interval

    checked = 0
    for c in m["cells"]:
        if c.get("skipped"):
            continue
        assert set(c) >= {"threat", "method", "metric", "value", "lo", "hi", "n", "higher_is_better", "method_mean",
                          "control_mean", "base_mean"}
        rows = [r for s in (0, 1) for r in per_seed[s] if (r["threat"], r["method"], r["metric"]) ==
                (c["threat"], c["method"], c["metric"])]
        assert len(rows) == 2
        for r in rows:  # the per-seed row against the cell's own done.json and the control's
            seed = 0 if r in per_seed[0] else 1
            cell = json.loads((root / f"seed{seed}" / c["threat"] / c["method"] / "done.json").read_text())
            ctl = json.loads((root / f"seed{seed}" / "control" / "done.json").read_text())
            assert r["value"] == cell["metrics"][c["metric"]]["value"]
            assert r["control"] == ctl["metrics"][c["metric"]]["value"]
        deltas = [r["value"] - r["control"] for r in rows if r["value"] is not None and r["control"] is not None]
        if len(deltas) == 2:
            vals = [x for r in rows for x in (r["value"], r["control"])]
            # PAR and BRR are differences of rates (in [-1, 1]) whatever values this run saw; the rest here rates
            difference = c["metric"].split("[")[0] in ("prefill.par", "sycophancy.brr", "sycophancy.brr_all")
            bound = 2.0 if difference else 1.0 if all(0 <= x <= 1 for x in vals) else None
            mean, lo, hi = t_interval(deltas, *((-bound, bound) if bound else (None, None)))
            assert c["value"] == pytest.approx(mean) and c["lo"] == pytest.approx(lo) and c["hi"] == pytest.approx(hi)
            assert c["n"] == 2
            checked += 1
    assert checked >= 10
    # training moved something: not every delta of the trained cells is zero
    assert any(c["value"] not in (None, 0.0) for c in m["cells"] if not c.get("skipped"))


def test_no_signal_cells_are_not_trained_and_marked(tiny_run):
    _, root, log = tiny_run
    assert not (root / "seed0" / "prefill" / "act").exists()
    assert (root / "seed0" / "prefill" / "bct" / "done.json").exists()
    assert any("act on prefill: no signal by construction" in line for line in log)
    m = json.loads((root / "cross_threat.json").read_text())
    row = next(r for r in m["rows"] if (r["threat"], r["method"]) == ("prefill", "act"))
    assert row["skipped"] == "no signal by construction"
    assert "no signal by construction" in (root / "results.md").read_text()


def test_control_is_sample_matched_benign_sft(tiny_run):
    _, root, _ = tiny_run
    ctl = json.loads((root / "seed0" / "control" / "train" / "config.json").read_text())
    bct = json.loads((root / "seed0" / "sycophancy" / "bct" / "train" / "config.json").read_text())
    ctl, bct = ctl.get("config", ctl), bct.get("config", bct)
    assert ctl["method"] == "sft" and ctl["target_temperature"] == 0.0
    for k in ("max_steps", "batch_size", "grad_accum", "lr", "lora_r"):
        assert ctl[k] == bct[k], k
    pairs = [json.loads(x) for x in (root / "seed0" / "control" / "pairs.jsonl").read_text().splitlines()]
    assert len(pairs) == 2 * 2  # one benign prompt per row trained: steps x rows
    assert all(p["teacher"] == p["student"] and p["meta"]["family"] == "benign_replay" for p in pairs)


def test_resume_skips_finished_cells_and_refuses_changed_settings(tiny_run, tmp_path):
    from opct.threats import load_threats
    from opct.threats.runner import run_threats

    path, root, _ = tiny_run
    before = (root / "seed0" / "sycophancy" / "bct" / "done.json").read_text()
    log: list[str] = []
    run_threats(load_threats(path), log=log.append)
    assert sum("done already, skipped" in line for line in log) == 10  # 2 seeds x (base, control, 3 trained cells)
    assert (root / "seed0" / "sycophancy" / "bct" / "done.json").read_text() == before
    # a done.json whose metrics were emptied since (found 2026-12-07 evening: the cell read n/a, listed nowhere, and
    # a rerun skipped it): named as such in the matrix, run again by the next run (its training kept), on a copy
    import dataclasses
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(root, copy / root.name)
    cell = copy / root.name / "seed1" / "control" / "done.json"
    done = json.loads(cell.read_text())
    cell.write_text(json.dumps({**done, "metrics": {}}))
    from opct.threats.matrix import build_matrix

    assert build_matrix(copy / root.name)["missing"] == [
        "seed 1: control: done.json holds no metrics (`opct run` runs it again)"]
    log = []
    run_threats(dataclasses.replace(load_threats(path), out=str(copy)), log=log.append)
    assert sum("done already, skipped" in line for line in log) == 9
    assert any("seed 1 control: done.json holds no metrics: running it again" in line for line in log)
    assert not any(line.startswith("  train ") for line in log)  # its training kept
    assert json.loads(cell.read_text())["metrics"] == done["metrics"]  # its evaluation, resumed: the same numbers
    assert build_matrix(copy / root.name)["missing"] == []
    changed = path.with_name("changed.yaml")
    data = yaml.safe_load(path.read_text())
    data["train"]["lr"] = 0.02
    changed.write_text(yaml.safe_dump(data))
    with pytest.raises(OpctError, match=r"train\.lr \(0\.01 -> 0\.02\)"):
        run_threats(load_threats(changed), log=lambda m: None)
    # a run started before a train / eval field existed resumes: the missing field counts as its default
    settings = root / "threats.json"
    saved = json.loads(settings.read_text())
    del saved["train"]["cpu_matmul"], saved["eval"]["prompt_side"]
    settings.write_text(json.dumps(saved))
    run_threats(load_threats(path), log=lambda m: None)
    assert json.loads(settings.read_text())["train"]["cpu_matmul"] == "auto"  # written back whole


def test_report_files(tiny_run):
    _, root, _ = tiny_run
    md = (root / "results.md").read_text()
    html = (root / "report.html").read_text()
    assert "Change against the benign-SFT control" in md and "◆" in md
    assert 'class="heatmap"' in html and "outline:2px solid" in html and "http" not in html.split("<body>")[1]


@pytest.mark.parametrize("over,field", [({"threats": ["capability"]}, "threats[0]"), ({"methods": ["nope"]},
                                                                                         "methods[0]"),
                                        ({"train": {"lrr": 1}}, "train"), ({"seeds": [0, 0]}, "seeds"),
                                        ({"method_train": {"act": {"batch_size": 3}}}, "method_train.act.batch_size"),
                                        ({"trained": {"jailbreak": ["role_play"]}}, "trained.jailbreak"),
                                        ({"trained": {"sycophancy": ["authority", "authority"]}},
                                         "trained.sycophancy"),  # families named twice: their pairs made twice
                                        ({"control": "nothing"}, "control"), ({"eval": {"attack": True}}, "eval")])
def test_bad_fields_name_the_field(tmp_path, over, field):
    from opct.config import ConfigError
    from opct.threats import ThreatsConfig, load_threats

    with pytest.raises(OpctError, match=re.escape(field)):
        load_threats(_write(tmp_path, **over))
    data = {**TINY, **over}
    with pytest.raises(ConfigError) as e:
        ThreatsConfig(**{k: v for k, v in data.items()})
    assert e.value.field.startswith(field.split("[")[0])


def test_shipped_file_and_quick():
    from opct.threats import load_threats

    cfg = load_threats(ROOT / "configs" / "threats.yaml")
    assert cfg.seeds == [0, 1, 2] and cfg.methods == ["opct", "bct", "act", "mlpct", "attct"]
    quick = load_threats(ROOT / "configs" / "threats.yaml", quick=True)
    assert quick.run_name().endswith("-quick") and len(quick.seeds) == 1
    assert quick.train.max_steps < cfg.train.max_steps and quick.eval.n < cfg.eval.n


def test_cli_runs_resumes_and_reports(tiny_run, capsys):
    from opct.cli import main
    from tiny_lm import cli_error

    path, root, _ = tiny_run
    (root / "report.html").unlink()
    # every cell done: resumes (with other bars too), rewrites the matrix and the report
    assert main(["run", str(path), "--no-progress"]) == 0
    assert (root / "report.html").exists() and "Cross-threat matrix" in capsys.readouterr().out
    assert main(["report", str(root)]) == 0
    assert "arms" in cli_error(capsys, ["run", str(path), "--arms", "base"])


def test_no_progress_reaches_every_training_and_evaluation_cell(tmp_path, monkeypatch):
    """`opct run THREATS.yaml --no-progress`: the training cells' bars off (their loading bars follow), whatever the
    file's train block says; the evaluations' too, even where the file turns them on."""
    import argparse
    import dataclasses

    from opct.threats import load_threats

    path = _write(tmp_path, eval={**TINY["eval"], "progress": True})
    on, off = load_threats(path), load_threats(path, argparse.Namespace(progress=False))
    assert on.train_config("bct").progress and on.train_config("sft", target_n=1).progress and on.eval.progress
    assert not off.train_config("bct").progress and not off.train_config("sft", target_n=1).progress
    quiet_act = dataclasses.replace(off, method_train={"act": {"progress": True}})
    assert not quiet_act.train_config("act").progress

    # and every evaluation: what it loads and what it runs
    import opct.evals.run
    import opct.policy
    from opct.threats import runner

    seen = []
    monkeypatch.setattr(opct.policy, "load_policy", lambda *a, progress, **k: seen.append(("load", progress)))
    monkeypatch.setattr(opct.evals.run, "run_eval", lambda policy, ec, *a, **k: seen.append(("eval", ec.progress)))
    for cfg in (on, off):
        runner.evaluate(cfg, "m", None, 0, tmp_path / "eval", print)
    assert seen == [("load", True), ("eval", True), ("load", False), ("eval", False)]


def test_a_partial_run_lists_its_unfinished_cells(tmp_path):
    """A killed or running threats run's report said nothing of the cells it lacked: with none finished its tables
    were empty rows, with one seed short the cells read '(n=1)' with no word why."""
    from opct.threats.matrix import write_matrix
    from opct.threats.report import build

    root = tmp_path / "thr"
    root.mkdir()
    (root / "threats.json").write_text(json.dumps({"name": "thr", "seeds": [0, 1], "threats": ["sycophancy"],
                                                   "methods": ["bct"]}))
    for cell in ("base", "control", "sycophancy/bct"):  # seed 0 complete, seed 1 has only its base
        for seed in (0, 1) if cell == "base" else (0,):
            d = root / f"seed{seed}" / cell
            d.mkdir(parents=True)
            _mark(d, seed, cell, seconds={"eval": 1.0}, metrics={
                "sycophancy.sycophancy_rate": {"value": 0.5, "higher_is_better": False}})
    (root / "seed1" / "control").mkdir()  # started, not finished
    write_matrix(root)
    _, md_path = build(root)
    md, html = md_path.read_text(), (root / "report.html").read_text()
    assert "**Missing (2 cells, not in the numbers below):**" in md
    assert "- seed 1: control: not finished (no done.json)" in md
    assert "- seed 1: sycophancy / bct: not finished (no done.json)" in md
    assert "<li>seed 1: sycophancy / bct: not finished (no done.json)</li>" in html


def test_a_finished_cell_whose_metrics_were_emptied_is_listed_as_such_not_read_as_unmeasured(tmp_path):
    """Found 2026-12-07 evening: a done.json whose metrics were emptied (or removed) made its row read n/a, rc 0, and
    nothing was listed under Missing (deleting that done.json did list it)."""
    from opct.threats.matrix import build_matrix

    root = tmp_path / "thr"
    root.mkdir()
    (root / "threats.json").write_text(json.dumps({"name": "thr", "seeds": [0], "threats": ["sycophancy"],
                                                   "methods": ["bct"]}))
    metric = {"sycophancy.sycophancy_rate": {"value": 0.5, "higher_is_better": False}}
    for cell, done in (("base", {"metrics": metric}), ("control", {"metrics": {}}), ("sycophancy/bct", {})):
        (root / "seed0" / cell).mkdir(parents=True)
        _mark(root / "seed0" / cell, 0, cell, **done)
    m = build_matrix(root)
    assert m["missing"] == ["seed 0: control: done.json holds no metrics (`opct run` runs it again)",
                            "seed 0: sycophancy / bct: done.json holds no metrics (`opct run` runs it again)"]
    assert m["rows"][0]["seeds"] == []


def test_a_delta_that_rounds_to_zero_reads_zero_never_minus_zero():
    from opct.threats.report import cell_text

    assert cell_text({"value": -0.001, "lo": -0.004, "hi": 0.126, "n": 3}) == "0.00 [0.00, +0.13]"
    assert cell_text({"value": -0.05, "lo": None, "hi": None, "n": 1}) == "-0.05 (n=1)"


def test_matrix_clips_deltas_by_the_metrics_range_not_by_the_values_seen(tmp_path):
    """The matrix clipped a paired difference by the values it saw: a BRR (a difference of rates, in [-1, 1]) whose
    seeds all happened to lie in [0, 1] got [-1, 1], where a report of the same numbers (`difference_range`) gives
    [-2, 2]. One rule now serves both: rates' deltas in [-1, 1], differences of rates' in [-2, 2]."""
    from opct.report.aggregate import difference_range, t_interval
    from opct.threats.matrix import build_matrix

    root = tmp_path / "thr"
    root.mkdir()
    (root / "threats.json").write_text(json.dumps({"name": "thr", "seeds": [0, 1], "threats": ["sycophancy"],
                                                   "methods": ["bct"]}))
    # a delta of +0.95 and -0.15 over two seeds: the t-interval runs far past +-1 before clipping
    values = {"base": (0.0, 0.0), "control": (0.0, 0.9), "sycophancy/bct": (0.95, 0.75)}
    for cell, per_seed in values.items():
        for seed, v in enumerate(per_seed):
            d = root / f"seed{seed}" / cell
            d.mkdir(parents=True)
            _mark(d, seed, cell, seconds={}, metrics={
                "sycophancy.brr": {"value": v, "higher_is_better": False},
                "sycophancy.sycophancy_rate": {"value": v, "higher_is_better": False}})
    m = build_matrix(root)
    cell = {c["metric"]: c for c in m["cells"]}
    brr, rate = cell["sycophancy.brr"], cell["sycophancy.sycophancy_rate"]
    assert brr["value"] == pytest.approx(0.4) and rate["value"] == pytest.approx(0.4)
    assert (brr["lo"], brr["hi"]) == (-2.0, 2.0)
    assert (rate["lo"], rate["hi"]) == (-1.0, 1.0)
    # the same numbers through the reports' rule
    for name in ("sycophancy.brr", "sycophancy.sycophancy_rate"):
        seen = [0.95, 0.0, 0.75, 0.9]
        assert (cell[name]["value"], cell[name]["lo"], cell[name]["hi"]) == pytest.approx(
            t_interval([0.95, -0.15], *difference_range(name, seen)))


@pytest.mark.parametrize("key, value, needle", [
    ("seeds", 5, "seeds: expected a list of seeds (integers from 0 to 4294967295), got 5"),
    ("methods", [["opct"]], "methods: expected a list of names, got [['opct']]"),
    ("trained", ["persona"], "trained: expected a mapping, got ['persona']"),
])
def test_a_damaged_threats_json_is_named_before_a_rerun_extends_it(tmp_path, key, value, needle):
    """A rerun adds its seeds, threats and methods to those of threats.json and merges its mappings: another shape
    there stopped it with a TypeError traceback."""
    from opct.threats.runner import SETTINGS, _previous

    path = tmp_path / SETTINGS
    path.write_text(json.dumps({"kind": "threats", "seeds": [0], key: value}))
    with pytest.raises(OpctError) as e:
        _previous(tmp_path, {})
    assert str(e.value) == f"{path}: {needle}"


def test_every_table_marks_a_cell_over_fewer_seeds_than_the_run(tmp_path):
    """Found 2026-12-07: with opct finished for seed 0 only and every other cell for seeds 0 and 1, the "Raw means
    over seeds" row read BRR 0.46 beside 0.04 with no `(n=1)` mark (the delta table had one), and a change over 2 of
    3 seeds, which has an interval, was not marked at all."""
    from opct.threats.matrix import write_matrix
    from opct.threats.report import build, cell_text

    root = tmp_path / "thr"
    root.mkdir()
    (root / "threats.json").write_text(json.dumps({"name": "thr", "seeds": [0, 1], "threats": ["sycophancy"],
                                                   "methods": ["bct", "opct"]}))
    for seed in (0, 1):
        for cell, v in (("base", 0.1), ("control", 0.05), ("sycophancy/bct", 0.04), ("sycophancy/opct", 0.46)):
            if cell == "sycophancy/opct" and seed == 1:
                continue
            d = root / f"seed{seed}" / cell
            d.mkdir(parents=True)
            _mark(d, seed, cell, seconds={"eval": 1.0}, metrics={
                "sycophancy.brr": {"value": v + 0.01 * seed, "higher_is_better": False}})
    write_matrix(root)
    _, md_path = build(root)
    md = md_path.read_text()
    means = md.split("## Raw means over seeds", 1)[1].split("\n## ", 1)[0]
    rows = {ln.split(" | ")[1]: ln for ln in means.splitlines() if ln.startswith("| ")}
    assert "0.46 (n=1)" in rows["opct"] and "(n=" not in rows["bct"] and "(n=" not in rows["benign_sft"]
    assert cell_text({"value": 0.1, "lo": 0.0, "hi": 0.2, "n": 2}, seeds=3) == "+0.10 [0.00, +0.20] (n=2)"
    assert cell_text({"value": 0.1, "lo": 0.0, "hi": 0.2, "n": 3}, seeds=3) == "+0.10 [0.00, +0.20]"


def test_unparsed_answers_are_counted_and_a_change_read_off_them_is_inconclusive(tmp_path):
    """A method whose answers were all unparsed (a sycophancy rate of 0 with parse_fail = n) read as a change against
    the control like any other, and the raw means said nothing of it (found 2026-12-07): the means now carry '(u/N
    unparsed)' and the change 'inconclusive'."""
    from opct.threats.matrix import write_matrix
    from opct.threats.report import build

    root = tmp_path / "thr"
    root.mkdir()
    (root / "threats.json").write_text(json.dumps({"name": "thr", "seeds": [0, 1], "threats": ["sycophancy"],
                                                   "methods": ["bct", "opct"]}))
    for seed in (0, 1):
        for cell, v, pf in (("base", 0.5, 0), ("control", 0.45, 1), ("sycophancy/bct", 0.2, 0),
                            ("sycophancy/opct", 0.0, 16)):
            d = root / f"seed{seed}" / cell
            d.mkdir(parents=True)
            _mark(d, seed, cell, seconds={}, metrics={"sycophancy.sycophancy_rate": {
                "value": v + 0.01 * seed, "n": 16, "parse_fail": pf, "higher_is_better": False}})
    m = write_matrix(root)
    cell = {c["method"]: c for c in m["cells"]}
    assert list(cell["opct"]["method_unparsed"]) == [32, 32] and list(cell["bct"]["control_unparsed"]) == [2, 32]
    _, md_path = build(root)
    md = md_path.read_text()
    means = md.split("## Raw means over seeds", 1)[1].split("\n## ", 1)[0]
    rows = {ln.split(" | ")[1]: ln for ln in means.splitlines() if ln.startswith("| ")}
    assert "0.01 (32/32 unparsed)" in rows["opct"] and "unparsed" not in rows["bct"]
    assert "(2/32 unparsed)" in rows["benign_sft"]
    table = md.split("## Raw means over seeds", 1)[0]
    opct_row = next(ln for ln in table.splitlines() if ln.startswith("| sycophancy | opct"))
    bct_row = next(ln for ln in table.splitlines() if ln.startswith("| sycophancy | bct"))
    assert "(inconclusive: 100% unparsed in method)" in opct_row and "inconclusive" not in bct_row


def test_an_override_added_to_or_dropped_from_a_method_already_run_is_refused(tiny_run, capsys):
    """Only a method that had an override was compared: `method_train: {act: {act_weight: 0.5}}` added on a rerun
    with another seed went through, and the seed-2 act cells trained at 0.5 beside seeds 0-1 at the default, in one
    mean (threats.json recording only 0.5); dropping the override went through too."""
    from opct.cli import main
    from tiny_lm import cli_error

    path, root, _ = tiny_run
    data = yaml.safe_load(path.read_text())
    added = path.with_name("added.yaml")
    added.write_text(yaml.safe_dump({**data, "seeds": [0, 1, 2], "method_train": {"act": {"act_weight": 0.5}}}))
    before = (root / "threats.json").read_text()
    err = cli_error(capsys, ["run", str(added), "--no-progress"])
    assert "was started with other settings (method_train.act ({} -> {'act_weight': 0.5}))" in err, err
    assert (root / "threats.json").read_text() == before and not (root / "seed2").exists()
    assert main(["run", str(path), "--no-progress"]) == 0  # the file it ran with still resumes
