"""`opct report` on run directories assembled from metrics files: the report's claim is about files, so the inputs
are a real eval's metrics.json (the shipped organism, base arm: tests/data/report_eval_metrics.json) with chosen
numbers changed, and the expected cells are computed here by hand."""

import base64
import io
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from opct.cli import main
from tiny_lm import small_disk  # noqa: F401 (a fixture)
from opct.errors import OpctError
from opct.report import build_report, load_run, summary_text
from opct.report.aggregate import t975
from opct.report.build import results_markdown

BASE_METRICS = json.loads((Path(__file__).parent / "data" / "report_eval_metrics.json").read_text())
EXPERIMENT = {"name": "demo", "model": "opct/organisms/default", "arms": ["base", "opct", "bct"], "seeds": [0],
              "note": "demo uses smaller item counts than configs/paper.yaml",
              "train_families": ["suggested_answer"], "train_wrappers": ["role_play", "prefix_injection"],
              "train_domains": ["chemicals", "fire"]}


def set_metric(metrics, name, value, lo=None, hi=None):
    m = dict(metrics.get(name) or {"n": 10, "higher_is_better": True, "parse_fail": 0})
    m.update(value=value, ci_low=lo, ci_high=hi)
    metrics[name] = m


def write_cell(run, arm, seed, metrics, done=True, curve=None):
    d = run / arm / str(seed)
    (d / "eval").mkdir(parents=True)
    (d / "eval" / "metrics.json").write_text(json.dumps(metrics))
    if curve is not None:
        (d / "train").mkdir()
        (d / "train" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))
    if done:
        (d / "done.json").write_text(json.dumps({"arm": arm, "seed": seed, "finished": "2026-11-30T20:00:00Z",
                                                 "seconds": {"pairs": 1.0, "train": 2.0, "eval": 3.0}}))
    return d


def make_run(tmp_path, experiment=None, cells=None):
    """cells: {(arm, seed): metrics dict}; a training curve is written for every arm but base."""
    run = tmp_path / "runs" / "demo"
    run.mkdir(parents=True)
    (run / "experiment.json").write_text(json.dumps(experiment or EXPERIMENT))
    for (arm, seed), metrics in (cells or {}).items():
        curve = None if arm == "base" else [
            {"step": s, "loss": 1.0 / s, "grad_norm": 0.5, "lr": 1e-4,
             "mean_delta": 0.1 / s if arm == "opct" else None} for s in range(1, 31)]
        write_cell(run, arm, seed, metrics, curve=curve)
    return run


def results(run) -> str:
    """results.md's text without drawing the plots (what build_report writes as results.md)."""
    return results_markdown(load_run(run))


def md_table(md, title):
    """The Markdown table under the heading containing `title` -> {arm: {column label: cell}}."""
    block = md.split(title, 1)[1].split("\n\n", 2)[1]
    lines = [ln for ln in block.splitlines() if ln.startswith("|")]
    rows = [[c.strip() for c in ln.strip("|").split(" | ")] for ln in lines]
    return {r[0]: dict(zip(rows[0], r)) for r in rows[2:]}


def bare(cell: str) -> str:
    """A table cell without its count of unparsed answers."""
    return re.sub(r" \(\d+/\d+ unparsed\)$", "", cell)


def single_seed_run(tmp_path):
    base = json.loads(json.dumps(BASE_METRICS))
    set_metric(base, "capability.accuracy[skill=facts]", 0.990, 0.97, 1.0)
    opct = json.loads(json.dumps(BASE_METRICS))
    set_metric(opct, "sycophancy.sycophancy_rate", 0.081, 0.06, 0.1)
    set_metric(opct, "capability.accuracy[skill=facts]", 0.985, 0.95, 1.0)
    set_metric(opct, "capability.accuracy[skill=arithmetic]", 1.0, 1.0, 1.0)  # base: 1.000
    bct = json.loads(json.dumps(BASE_METRICS))
    set_metric(bct, "capability.accuracy[skill=facts]", 0.998, 0.99, 1.0)
    return make_run(tmp_path, cells={("base", 0): base, ("opct", 0): opct, ("bct", 0): bct})


# ------------------------------------------------------------------------------------------------ numbers

def test_single_seed_cells_are_the_eval_values_and_bootstrap_intervals(tmp_path):
    run = single_seed_run(tmp_path)
    html, md = build_report(run)
    assert (html, md) == (run / "report.html", run / "results.md")
    text = md.read_text()
    syc = md_table(text, "Sycophancy (wrong suggestions)")
    assert syc["base"]["sycophancy rate ↓"] == "0.525 [0.488, 0.559] (2/798 unparsed)"  # the eval's parse_fail
    assert syc["opct"]["sycophancy rate ↓"] == "0.081 [0.060, 0.100] (2/798 unparsed)"
    assert syc["base"]["accuracy clean ↑"] == "0.990 [0.970, 1.000]"
    assert syc["base"]["seeds"] == "1/1"
    split = md_table(text, "training vs held-out families")
    assert bare(split["base"]["sycophancy rate (held-out) ↓"]) == "0.541 [0.492, 0.593]"
    assert bare(split["base"]["sycophancy rate (train) ↓"]) == "0.509 [0.464, 0.552]"
    jb = md_table(text, "Jailbreaks")
    assert jb["base"]["held-out wrappers ↑"] == "0.188 [0.141, 0.240]"
    assert jb["base"]["adaptive attacker ↑"] == "0.000 [0.000, 0.000]"
    aw = md_table(text, "Safety awareness")
    assert aw["base"]["surfaced (held-out domains) ↑"] == "0.167 [0.056, 0.278]"
    assert aw["base"]["over-warning ↓"] == "0.009 [0.000, 0.028]"
    # the note, model and seeds are at the top
    head = text.split("## 1.", 1)[0]
    assert "demo uses smaller item counts than configs/paper.yaml" in head
    assert "opct/organisms/default" in head and "**seeds**: 0" in head
    assert "bootstrap" in head and "Student-t" not in head


def test_capability_shows_change_from_base(tmp_path):
    text = results(single_seed_run(tmp_path))
    cap = md_table(text, "Capability")
    assert cap["opct"]["facts ↑"] == "0.985 [0.950, 1.000] (−0.005) (1/80 unparsed)"
    assert cap["bct"]["facts ↑"] == "0.998 [0.990, 1.000] (+0.008) (1/80 unparsed)"
    assert "(±0.000)" in cap["opct"]["arithmetic ↑"]
    assert "(" not in bare(cap["base"]["facts ↑"])  # no change from itself
    assert set(cap["base"]) >= {"all ↑", "arithmetic ↑", "arithmetic multistep ↑", "facts ↑", "instructions ↑"}


def test_t_quantiles_match_closed_forms():
    # df = 1 is the Cauchy distribution: tan(pi (p - 1/2)); df = 2: (2p - 1) / sqrt(2 p (1 - p))
    p = 0.975
    # to 1e-5 (the 3-decimal table's 4.303 for df = 2, 4.302653 exactly, widened every 3-seed interval; 2026-12-07)
    assert t975(1) == pytest.approx(math.tan(math.pi * (p - 0.5)), abs=1e-5)
    assert t975(2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), abs=1e-5)
    # beyond the table: scipy's t.ppf(0.975, df) for 31, 45, 200 (1.971896), to 1e-5
    assert t975(31) == pytest.approx(2.039513, abs=1e-5) and t975(45) == pytest.approx(2.014103, abs=1e-5)
    assert t975(200) == pytest.approx(1.971896, abs=1e-5)
    with pytest.raises(ValueError):
        t975(0)


def test_mean_and_t_interval_over_seeds(tmp_path):
    exp = dict(EXPERIMENT, arms=["base", "opct"], seeds=[0, 1, 2])
    cells = {}
    for seed, (syc, brr) in enumerate([(0.2, 0.10), (0.3, 0.20), (0.4, 0.60)]):
        for arm in ("base", "opct"):
            m = json.loads(json.dumps(BASE_METRICS))
            set_metric(m, "sycophancy.sycophancy_rate", syc, syc - 0.01, syc + 0.01)
            set_metric(m, "sycophancy.brr", brr, 0.0, 1.0)
            if arm == "opct" and seed == 2:
                del m["sycophancy.invariance"]  # one seed lacks a metric: the cell says n=2
            cells[(arm, seed)] = m
    run = make_run(tmp_path, exp, cells)
    text = results(run)
    syc = md_table(text, "Sycophancy (wrong suggestions)")
    # sycophancy rate: mean 0.3, s = 0.1, half-width t(0.975, 2) * 0.1 / sqrt(3) = 4.302653 * 0.0577 = 0.2484
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert syc["opct"]["sycophancy rate ↓"] == f"0.300 [{0.3 - half:.3f}, {0.3 + half:.3f}] (6/2394 unparsed)"
    assert syc["opct"]["seeds"] == "3/3"
    # BRR: mean 0.3, s = sqrt(((−.2)^2 + (−.1)^2 + .3^2) / 2) = sqrt(0.07); lower end −0.357 is inside [-1, 1]
    s = math.sqrt(0.07)
    half = 4.302653 * s / math.sqrt(3)
    assert bare(syc["opct"]["BRR ↓"]) == f"0.300 [{0.3 - half:.3f}, {0.3 + half:.3f}]"
    # invariance: the same value in the two seeds that have it -> zero-width interval, marked n=2
    inv = BASE_METRICS["sycophancy.invariance"]["value"]
    assert bare(syc["opct"]["invariance ↑"]) == f"{inv:.3f} [{inv:.3f}, {inv:.3f}] (n=2)"
    assert "mean over seeds" in text and "Student-t" in text


def test_t_interval_of_a_rate_is_clipped_to_0_1(tmp_path):
    exp = dict(EXPERIMENT, arms=["opct"], seeds=[0, 1])
    cells = {}
    for seed, v in enumerate([0.1, 0.9]):
        m = {}
        set_metric(m, "jailbreak.dsr_adaptive", v, v, v)
        cells[("opct", seed)] = m
    text = results(make_run(tmp_path, exp, cells))
    assert bare(md_table(text, "Jailbreaks")["opct"]["adaptive attacker ↑"]) == "0.500 [0.000, 1.000]"


@pytest.mark.parametrize("measure, values, bounds", [("mcc", [0.2, 0.4], (None, 1.0)),
                                                     ("brier_score", [0.9, 1.0], (None, None)),
                                                     ("bleu", [0.5, 0.9], (0.0, None)),
                                                     ("mine", [0.1, 0.9], (None, None))])
def test_t_interval_of_an_lm_eval_measure_is_clipped_to_its_own_range(tmp_path, measure, values, bounds):
    """Over seeds, an lm-eval measure whose values happened to lie in [0, 1] had its t-interval clipped to [0, 1]: an
    MCC (in [-1, 1]) at 0, a Brier score (in [0, 2]) and a BLEU (in [0, 100]) at 1, a task's own measure both ways.
    Now each is clipped to the measure's own range (`lm_eval_bridge.RANGES`), an unknown one not at all."""
    from opct.report.aggregate import estimate

    metric = f"capability.lm_eval[task=t,measure={measure},filter=none]"
    cells = {}
    for seed, v in enumerate(values):
        m = {}
        set_metric(m, metric, v, v, v)
        cells[("opct", seed)] = m
    est = estimate(load_run(make_run(tmp_path, dict(EXPERIMENT, arms=["opct"], seeds=[0, 1]), cells)), "opct", metric)
    mean, half = sum(values) / 2, 12.706205 * abs(values[1] - values[0]) / 2
    lo, hi = bounds
    assert (est.ci_low, est.ci_high) == (pytest.approx(mean - half) if lo is None else lo,
                                         pytest.approx(mean + half) if hi is None else hi)


@pytest.mark.parametrize("metric", ["sycophancy.brr_all", "prefill.par[on=heldout_prefills]"])
def test_t_interval_of_a_difference_of_rates_is_not_clipped_at_0(tmp_path, metric):
    """BRR (all rows) and PAR are differences of two rates, in [-1, 1] like BRR; with per-seed values that happened
    to be in [0, 1] (0.469 and 0.573 in a real two-seed run) their interval's lower end was clipped to 0.000
    (BRR of the same seeds: -0.141)."""
    from opct.report.aggregate import estimate

    cells = {}
    for seed, v in enumerate([0.469, 0.573]):
        m = {}
        set_metric(m, metric, v, v - 0.1, v + 0.1)
        set_metric(m, "sycophancy.sycophancy_rate_all", v, v - 0.1, v + 0.1)
        m[metric]["higher_is_better"] = False
        cells[("opct", seed)] = m
    run = load_run(make_run(tmp_path, dict(EXPERIMENT, arms=["opct"], seeds=[0, 1]), cells))
    half = 12.706205 * math.sqrt(2 * 0.052 ** 2) / math.sqrt(2)  # t(0.975, 1) * s / sqrt(2) = 0.6607
    est = estimate(run, "opct", metric)
    assert (est.ci_low, est.ci_high) == (pytest.approx(0.521 - half), 1.0)  # -0.140: clipped to [-1, 1] only
    rate = estimate(run, "opct", "sycophancy.sycophancy_rate_all")
    assert (rate.ci_low, rate.ci_high) == (0.0, 1.0)  # a rate: clipped to [0, 1]
    if metric == "sycophancy.brr_all":
        row = md_table(results_markdown(run), "paper's denominators (every row)")["opct"]
        assert bare(row["BRR (all rows) ↓"]) == f"0.521 [{0.521 - half:.3f}, 1.000]"


def test_missing_metrics_are_dashes(tmp_path):
    only_syc = {k: v for k, v in BASE_METRICS.items() if k.startswith("sycophancy.")}
    cells = {("base", 0): BASE_METRICS, ("opct", 0): only_syc}
    run = make_run(tmp_path, dict(EXPERIMENT, arms=["base", "opct"]), cells)
    text = results(run)
    jb = md_table(text, "Jailbreaks")
    assert set(list(jb["opct"].values())[2:]) == {"–"}
    assert jb["base"]["direct ↑"] != "–"
    cap = md_table(text, "Capability")
    assert cap["opct"]["facts ↑"] == "–"  # no value and no change from base
    assert "capability accuracy" in summary_text(load_run(run))
    # a null value (an empty group) is a dash as well, not 0
    m = json.loads(json.dumps(BASE_METRICS))
    set_metric(m, "awareness.over_warning", None)
    run2 = make_run(tmp_path / "b", dict(EXPERIMENT, arms=["base"]), {("base", 0): m})
    assert md_table(results(run2), "Safety awareness")["base"]["over-warning ↓"] == "–"


def test_non_finite_values_are_dashes_and_header_shows_budgets(tmp_path):
    m = json.loads(json.dumps(BASE_METRICS))
    m["awareness.over_warning"]["value"] = float("nan")  # Python's json writes NaN; it is no number to report
    m["awareness.surfaced"]["ci_low"] = float("nan")
    exp = dict(EXPERIMENT, arms=["base"], train={"max_steps": 50, "lr": 0.0001, "lora": {"r": 8}},
               eval={"n": 40, "attack": True})
    text = results(make_run(tmp_path, exp, {("base", 0): m}))
    aw = md_table(text, "Safety awareness")
    assert aw["base"]["over-warning ↓"] == "–"
    assert aw["base"]["surfaced (all) ↑"] == "0.120"  # the value stands; the broken interval is dropped
    head = text.split("## 1.", 1)[0]
    assert "max_steps=50, lr=0.0001" in head and "lora" not in head and "n=40, attack=True" in head


def test_training_curves_per_arm(tmp_path):
    from opct.report import plots

    run = load_run(single_seed_run(tmp_path))
    assert plots.curve_keys(run.seed_runs("opct")) == ["loss", "grad_norm", "mean_delta"]
    assert plots.curve_keys(run.seed_runs("bct")) == ["loss", "grad_norm"]  # mean_delta is null for BCT
    assert plots.curves(run)[:8] == b"\x89PNG\r\n\x1a\n"
    base_only = load_run(make_run(tmp_path / "b", dict(EXPERIMENT, arms=["base"]), {("base", 0): BASE_METRICS}))
    assert plots.curves(base_only) is None


def test_no_base_arm_and_no_training_still_builds(tmp_path):
    run = make_run(tmp_path, dict(EXPERIMENT, arms=["opct"]), {("opct", 0): {}})
    html, md = build_report(run)
    cap = md_table(md.read_text(), "Capability")
    assert cap["opct"]["all ↑"] == "–"
    assert "<img" in html.read_text()


# ------------------------------------------------------------------------------------------------ incomplete runs

def test_incomplete_cells_are_listed_and_left_out(tmp_path):
    exp = dict(EXPERIMENT, seeds=[0, 1])
    cells = {("base", 0): BASE_METRICS, ("opct", 0): BASE_METRICS, ("opct", 1): BASE_METRICS}
    run = make_run(tmp_path, exp, cells)
    # bct/0 ran its eval but has no done.json: its (absurd) numbers must not count
    bad = json.loads(json.dumps(BASE_METRICS))
    set_metric(bad, "sycophancy.sycophancy_rate", 0.999, 0.99, 1.0)
    write_cell(run, "bct", 0, bad, done=False)
    html_path, md_path = build_report(run)
    text = md_path.read_text()
    assert "bct seed 0: incomplete (no done.json)" in text
    assert "bct seed 1: not started" in text
    assert "base seed 1: not started" in text
    assert "Missing (3 cells" in text
    syc = md_table(text, "Sycophancy (wrong suggestions)")
    assert syc["bct"]["sycophancy rate ↓"] == "–" and syc["bct"]["seeds"] == "0/2"
    assert syc["base"]["seeds"] == "1/2" and syc["base"]["sycophancy rate ↓"].startswith("0.525 [0.488, 0.559]")
    assert "0.999" not in text.split("## Paper vs opct")[0]  # (the paper's published numbers follow it)
    out = summary_text(run)
    assert "missing (3)" in out and "bct seed 0" in out
    html = html_path.read_text()
    assert "bct seed 0: incomplete (no done.json)" in html


def test_lm_eval_tasks_a_finished_cell_failed_are_listed(tmp_path):
    """A cell whose evaluation finished while an lm-eval task failed (run.json's `lm_eval_errors`) lacks that task's
    rows; the report says so, in results.md, report.html and the summary, rather than show a table without them."""
    run = make_run(tmp_path, dict(EXPERIMENT, arms=["base"]), {("base", 0): BASE_METRICS})
    (run / "base" / "0" / "eval" / "run.json").write_text(json.dumps(
        {"lm_eval_errors": {"ifeval": "ModuleNotFoundError: No module named 'langdetect' <x>"}}))
    html_path, md_path = build_report(run)
    line = "base seed 0: lm-eval task ifeval failed (ModuleNotFoundError: No module named 'langdetect' <x>)"
    md = md_path.read_text()  # the `<x>` of the message as text, not a tag a Markdown viewer would swallow
    assert "**Failed (1, not in the numbers below):**" in md and line.replace("<x>", "&lt;x>") in md
    assert "base seed 0: lm-eval task ifeval failed (ModuleNotFoundError: No module named &#x27;langdetect&#x27; " \
           "&lt;x&gt;)" in html_path.read_text()
    assert f"failed, not in the numbers (1): {line}" in summary_text(run)
    (run / "base" / "0" / "eval" / "run.json").write_text(json.dumps({"lm_eval_errors": {}}))
    assert "Failed (" not in results(run) and "failed, not in" not in summary_text(run)
    (run / "base" / "0" / "eval" / "run.json").write_text("{torn")
    with pytest.raises(OpctError, match=re.escape(str(run / "base" / "0" / "eval" / "run.json"))):
        build_report(run)


# ------------------------------------------------------------------------------------------------ errors

def test_missing_run_or_experiment_is_a_clear_error(tmp_path):
    with pytest.raises(OpctError, match=re.escape(str(tmp_path / "nope"))):
        build_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(OpctError, match=re.escape(str(tmp_path / "empty" / "experiment.json"))):
        build_report(tmp_path / "empty")


def test_malformed_files_name_the_file(tmp_path):
    run = make_run(tmp_path, dict(EXPERIMENT, arms=["base"]), {("base", 0): BASE_METRICS})
    path = run / "base" / "0" / "eval" / "metrics.json"
    path.write_text('{"sycophancy.brr": {"value": 0.5,')
    with pytest.raises(OpctError, match=re.escape(str(path))):
        build_report(run)
    path.write_text(json.dumps({"sycophancy.brr": {"value": "high"}}))
    with pytest.raises(OpctError, match=re.escape(str(path)) + ".*sycophancy.brr.*value"):
        build_report(run)
    path.write_text("[1, 2]")
    with pytest.raises(OpctError, match=re.escape(str(path))):
        build_report(run)
    (run / "experiment.json").write_text("{not json")
    with pytest.raises(OpctError, match=re.escape(str(run / "experiment.json"))):
        build_report(run)
    assert not (run / "report.html").exists() and not (run / "results.md").exists()


@pytest.mark.parametrize("field, value", [("seeds", [0, 0]), ("arms", ["base", "base"])])
def test_a_seed_or_arm_listed_twice_is_an_error_not_a_second_cell(tmp_path, field, value):
    """experiment.json with seeds [0, 0] counted seed 0 twice: "2/2" seeds and a zero-width t-interval, both made
    up (`opct run` refuses duplicates, so only an edited or foreign experiment.json has them)."""
    run = make_run(tmp_path, {**EXPERIMENT, "arms": ["base"], field: value}, {("base", 0): BASE_METRICS})
    with pytest.raises(OpctError, match=re.escape(str(run / "experiment.json")) + f".*{field}.*twice"):
        load_run(run)


@pytest.mark.parametrize("arm", ["../base", "..", "."])
def test_an_arm_that_is_no_folder_name_is_an_error_not_a_read_outside_the_run(tmp_path, arm):
    """experiment.json with arms ["../base"] read the cells of a folder beside the run directory (a hand-edited
    file; `opct run` refuses such names, with the same rule, opct.files.is_dir_name)."""
    run = make_run(tmp_path, {**EXPERIMENT, "arms": ["base"]}, {("base", 0): BASE_METRICS})
    outside = run.parent / "base" / "0"  # what "../base" names
    outside.mkdir(parents=True)
    (outside / "done.json").write_text((run / "base" / "0" / "done.json").read_text())
    (run / "experiment.json").write_text(json.dumps({**EXPERIMENT, "arms": [arm]}))
    with pytest.raises(OpctError, match=re.escape(f"{run / 'experiment.json'}: arms: {arm!r} is no arm's folder")):
        load_run(run)


@pytest.mark.parametrize("field, value", [("arm_specs", ["base"]), ("arm_specs", {"base": "base"}),
                                          ("trained", {"sycophancy": "suggested_answer"}),
                                          # a probe, 2026-12-07: "# Results: None", the settings line dropped, and
                                          # three cells of seed -1 listed as not started
                                          ("name", None), ("train", 5), ("eval", []), ("seeds", [-1])])
def test_experiment_fields_of_the_wrong_shape_name_the_file(tmp_path, capsys, field, value):
    """arm_specs not a mapping of arm -> mapping was an AttributeError traceback; `trained` with a family string
    instead of a list listed its letters as the trained families ("s, u, g, g, e, ...")."""
    run = make_run(tmp_path, {**EXPERIMENT, "arms": ["base"], field: value}, {("base", 0): BASE_METRICS})
    assert main(["report", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"{run / 'experiment.json'}: {field}" in err and "Traceback" not in err


@pytest.mark.parametrize("probe", [{"summary": {"change": {}}}, {"summary": {"change": {"opct": [0.1]}}},
                                   {"summary": {"change": {"opct": [0.1]}, "pairs": {}}, "arms": ["opct"],
                                    "methods": {"opct": "opct"}}])
def test_a_mechanism_json_of_another_shape_is_an_error_naming_it(tmp_path, capsys, probe):
    """mechanism.json holding a summary.change but not the rest (an older or hand-edited file) was a KeyError /
    AttributeError traceback from `opct report`."""
    run = make_run(tmp_path, dict(EXPERIMENT, arms=["base"]), {("base", 0): BASE_METRICS})
    (run / "mechanism.json").write_text(json.dumps(probe))
    assert main(["report", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"{run / 'mechanism.json'}: not a mechanism probe result" in err and "Traceback" not in err


@pytest.mark.parametrize("text, problem", [("[" * 100000, "mechanism: nested too deeply to read"),
                                           (b"{\"a\": \"\xff\"}", "not UTF-8 text"),
                                           ("{\"summary\": ", "mechanism: not valid JSON")])
def test_a_mechanism_json_that_cannot_be_read_names_the_file(tmp_path, capsys, text, problem):
    """A deeply nested mechanism.json gave "opct: error: input: nested too deeply to read", no file named (a probe,
    2026-12-07); it is read as every other JSON file of a run is (opct.files.read_json)."""
    run = make_run(tmp_path, dict(EXPERIMENT, arms=["base"]), {("base", 0): BASE_METRICS})
    path = run / "mechanism.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert main(["report", str(run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"opct: error: {path}") and problem in err, err


@pytest.mark.parametrize("done, problem", [({"arm": "bct", "seed": 0}, "arm: 'bct', but the cell's folder is opct/0"),
                                           ({"arm": "opct", "seed": 7}, "seed: 7, but the cell's folder is opct/0"),
                                           ({"arm": "opct", "seed": "0"}, 'seed: must be an integer (got "0")'),
                                           ({"arm": "opct"}, "seed: missing"), ({"seed": 0}, "arm: missing"),
                                           ({}, "arm: missing")])
def test_a_done_json_of_another_cell_is_named(tmp_path, capsys, done, problem):
    """A done.json of another arm or seed (a cell copied or moved between folders) was read as this cell's (a probe,
    2026-12-07); one without its arm or seed (written by hand), or with a seed of "0", was taken as its folder's
    (2026-12): now each is refused, naming the file and the field."""
    run = make_run(tmp_path, dict(EXPERIMENT, arms=["base", "opct"]), {("base", 0): BASE_METRICS,
                                                                        ("opct", 0): BASE_METRICS})
    path = run / "opct" / "0" / "done.json"
    path.write_text(json.dumps(done))
    assert main(["report", str(run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"opct: error: {path}: {problem}"), err
    path.write_text(json.dumps({"arm": "opct", "seed": 0}))
    assert ("opct", 0) in load_run(run).cells


def test_unwritable_out_dir_is_a_clear_error(tmp_path):
    run = make_run(tmp_path, dict(EXPERIMENT, arms=["base"]), {("base", 0): {}})
    (tmp_path / "a_file").write_text("")
    with pytest.raises(OpctError, match=re.escape(str(tmp_path / "a_file"))):
        build_report(run, tmp_path / "a_file")


def test_malformed_training_curve_names_file_and_line(tmp_path):
    run = single_seed_run(tmp_path)
    curve = run / "opct" / "0" / "train" / "metrics.jsonl"
    curve.write_text('{"step": 1, "loss": 0.5}\n{"loss": 0.4}\n')
    with pytest.raises(OpctError, match=re.escape(f"{curve}:2")):
        build_report(run)


def test_cli_prints_summary_and_writes_out_dir(tmp_path, capsys):
    run = single_seed_run(tmp_path)
    out = tmp_path / "elsewhere"
    assert main(["report", str(run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (out / "report.html").exists() and (out / "results.md").exists()
    assert not (run / "report.html").exists()
    line = next(ln for ln in printed.splitlines() if ln.startswith("sycophancy rate ↓"))
    assert "0.525 [0.488, 0.559]" in line and "0.081 [0.060, 0.100]" in line
    assert main(["report", str(tmp_path / "nope")]) == 1
    assert "run directory not found" in capsys.readouterr().err
    assert main(["report", str(run / "experiment.json")]) == 1  # a file of the run, not the run
    assert capsys.readouterr().err.strip() == f"opct: error: {run / 'experiment.json'}: not a directory; " \
                                              "a run directory written by `opct run` is expected"
    # opct mechanism reads the same directories: the message names no other command (it said `opct report`)
    assert main(["mechanism", str(run / "experiment.json")]) == 1
    assert "not a directory; a run directory written by `opct run` is expected" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["file", "file/sub"])
def test_an_out_that_is_a_file_is_named_as_one(tmp_path, capsys, where):
    """`--out FILE` said "cannot write the report: File exists", and a file for a parent "Not a directory"."""
    run = single_seed_run(tmp_path)
    (tmp_path / "file").write_text("kept\n")
    out = tmp_path / where
    assert main(["report", str(run), "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip() == f"opct: error: {out}: cannot write the report: {tmp_path / 'file'} " \
                                              f"is a file, not a directory"
    assert (tmp_path / "file").read_text() == "kept\n"


@pytest.mark.parametrize("marker", ["experiment.json", "run.json", "study.json", "splits.json",
                                    "adapter_config.json", "model.safetensors"])
def test_an_out_that_is_another_commands_run_is_refused_before_its_report_is_replaced(tmp_path, capsys, marker):
    """`opct report runs/a --out runs/b` replaced experiment b's results.md and report.html with a's; a trained
    adapter's final/ took them beside its weights (2026-12-07 evening), where `opct train` and `opct eval` refuse it."""
    run = single_seed_run(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / marker).write_text("{}")
    (other / "results.md").write_text("b's results\n")
    assert main(["report", str(run), "--out", str(other)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"opct: error: {other}: holds ") and f"({marker})" in err and "choose another --out" in err
    assert (other / "results.md").read_text() == "b's results\n" and not (other / "report.html").exists()
    assert main(["report", str(run), "--out", str(run)]) == 0  # the run itself, named as --out: its own report
    assert (run / "results.md").exists()


# ------------------------------------------------------------------------------------------------ the HTML file

def data_pngs(html):
    return [base64.b64decode(b) for b in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


@pytest.fixture(scope="module")
def report_html(tmp_path_factory):
    """One full report (three arms, training curves, a note that tries to inject a script), built once."""
    exp = dict(EXPERIMENT, note='<script>alert("x")</script> & more')
    run = make_run(tmp_path_factory.mktemp("html"), exp, {("base", 0): BASE_METRICS, ("opct", 0): BASE_METRICS,
                                                          ("bct", 0): BASE_METRICS})
    return build_report(run)[0].read_text()


def test_html_is_self_contained_and_every_image_decodes(report_html):
    import matplotlib.image as mpimg

    html = report_html
    # nothing is fetched: no http(s) URL, no script, no stylesheet link, every src= a data URI
    assert "http://" not in html and "https://" not in html
    assert "<script" not in html.lower() and "<link" not in html.lower()
    srcs = re.findall(r'src\s*=\s*"([^"]*)"', html)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "url(" not in html
    # the note is escaped, not injected
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; more" in html
    pngs = data_pngs(html)
    # one grid per paper table (13: the axes' tables, the paper's sycophancy denominators and awareness metrics among
    # them, capability's termination table and the prefill, persona, frustration and conditional axes' tables, whose
    # metrics this run lacks), a grouped plot per detail table (4), the training curves (1)
    assert len(pngs) == len(srcs) == 18
    for png in pngs:
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(io.BytesIO(png), format="png")
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
        assert img.std() > 0  # not a blank canvas
    for title in ("Sycophancy (wrong suggestions)", "Jailbreaks", "Safety awareness", "Capability",
                  "Training curves", "Sycophancy rate per family", "Defense success per wrapper"):
        assert title in html
    assert "suggested_answer (train)" in html  # the training family is marked


def test_writing_is_atomic_and_leaves_no_temporary_files(tmp_path):
    run = single_seed_run(tmp_path)
    build_report(run)
    first = (run / "results.md").read_text()
    build_report(run)  # rebuilding replaces, and leaves nothing else behind
    assert (run / "results.md").read_text() == first
    assert sorted(p.name for p in run.iterdir() if p.is_file()) == ["experiment.json", "report.html", "results.md"]


# ------------------------------------------------------------------------------------------------ in a browser

def _chromium():
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
                 if shutil.which(n)), None)


# Appended to a *copy* of the report (the report itself has no script): at the load event (every image has loaded
# or failed by then; done synchronously, so --dump-dom cannot print the page before the probe ran), draw each image
# on a canvas and count its opaque pixels, then write "id:width:opaque_fraction" into the DOM, which
# --dump-dom prints. The plots are saved on an opaque white background, so a fully loaded one is 100% opaque; a
# truncated PNG still has a width (read from its header) and even "decodes", but its missing rows stay transparent.
_PROBE = """<script>
window.addEventListener("load", function () {
  var out = Array.from(document.images).map(function (img) {
    var id = img.id || "report";
    if (!img.complete || !img.naturalWidth) return id + ":0:0";
    var c = document.createElement("canvas"); c.width = img.naturalWidth; c.height = img.naturalHeight;
    var ctx = c.getContext("2d"); ctx.drawImage(img, 0, 0);
    var d = ctx.getImageData(0, 0, c.width, c.height).data, opaque = 0;
    for (var i = 3; i < d.length; i += 4) if (d[i] > 0) opaque++;
    return id + ":" + img.naturalWidth + ":" + (opaque / (c.width * c.height)).toFixed(4);
  });
  var pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = out.join(" ");
  document.body.appendChild(pre);
});
</script>"""


@pytest.mark.skipif(_chromium() is None, reason="no headless Chromium installed")
def test_report_renders_in_headless_chromium_and_images_load(tmp_path, report_html):
    html = report_html
    n = len(data_pngs(html))
    # a deliberately truncated copy of a real plot (header intact, pixels cut off) proves the probe can tell
    trunc = base64.b64encode(data_pngs(html)[0][:300]).decode()
    broken = f'<img id="broken" alt="" src="data:image/png;base64,{trunc}">'
    page = tmp_path / "probe.html"
    page.write_text(html.replace("</body>", broken + _PROBE + "</body>"))
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=60000", "--dump-dom", page.as_uri()]
    res = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=180)
    m = re.search(r'<pre id="probe">([^<]*)</pre>', res.stdout)
    assert m, f"chromium printed no probe result (rc {res.returncode}): {res.stderr[-2000:]}"
    entries = [e.split(":") for e in m.group(1).split()]
    shown = [(int(w), float(opaque)) for name, w, opaque in entries if name == "report"]
    assert len(shown) == n and n > 0
    assert all(w > 0 and opaque == 1.0 for w, opaque in shown), shown
    (broken_opaque,) = [float(o) for name, _, o in entries if name == "broken"]
    assert broken_opaque < 0.5, "the probe did not notice a truncated image"


def test_cells_never_print_negative_zero():
    from opct.report.aggregate import Estimate, cell_text

    est = Estimate(value=0.01, ci_low=-1e-17, ci_high=0.04, n_seeds=1, higher_is_better=False)
    assert cell_text(est) == "0.010 [0.000, 0.040]"
    neg = Estimate(value=-0.02, ci_low=-0.06, ci_high=0.02, n_seeds=1, higher_is_better=False)
    assert cell_text(neg) == "-0.020 [-0.060, 0.020]"


def test_a_value_a_rounding_error_outside_its_interval_still_plots(tmp_path):
    """A bootstrap interval of a constant rate is [v, v] computed by another sum than v itself: 1/3 came back as
    value 0.3333333333333335 over [0.33333333333333326, 0.33333333333333337] on a real run, and matplotlib refuses a
    negative error bar, so `opct report` ended in a traceback. Every metric here sits just above its interval, and
    one well below it (a percentile interval need not hold the point estimate): both plots draw it."""
    m = json.loads(json.dumps(BASE_METRICS))
    for k, v in m.items():
        if isinstance(v.get("value"), float):
            v.update(ci_low=v["value"] - 0.01, ci_high=v["value"] - 2e-16)
    m["sycophancy.sycophancy_rate"].update(ci_low=0.7, ci_high=0.8)
    run = make_run(tmp_path, dict(EXPERIMENT, arms=["base"]), {("base", 0): m})
    html, md = build_report(run)
    assert data_pngs(html.read_text())


@pytest.mark.parametrize("value, shown", [(1e308, "1e+308"), (float("inf"), "inf"), (float("-inf"), "-inf")])
def test_huge_and_infinite_values_are_shown_as_such_never_a_crash_or_a_dash(tmp_path, value, shown):
    """A metric of 1e308 or ±inf (a broken eval) is written as what it is, with one seed and with two (the t-interval
    over 1e308 and a rate overflowed: OverflowError), in every table; an infinite mean has no interval."""
    one = json.loads(json.dumps(BASE_METRICS))
    set_metric(one, "awareness.over_warning", value, 0.1, 0.2)
    run = make_run(tmp_path / "one", dict(EXPERIMENT, arms=["base"]), {("base", 0): one})
    assert md_table(results(run), "Safety awareness")["base"]["over-warning ↓"] == f"{shown} [0.100, 0.200]"
    build_report(run)  # the plots too
    two = make_run(tmp_path / "two", dict(EXPERIMENT, arms=["base"], seeds=[0, 1]),
                   {("base", 0): one, ("base", 1): BASE_METRICS})
    cell = md_table(results(two), "Safety awareness")["base"]["over-warning ↓"]
    mean = {1e308: "5e+307 [-inf, inf]", float("inf"): "inf", float("-inf"): "-inf"}[value]
    assert cell == mean
    build_report(two)


def test_every_report_writer_formats_huge_and_infinite_numbers():
    from opct.audit.render import _iv
    from opct.evals.metrics import format_table
    from opct.report.aggregate import num, signed, t_interval
    from opct.report.mechanism import _fmt
    from opct.robustness.report import _cell
    from opct.threats.report import cell_text

    assert [num(x) for x in (1e308, float("inf"), -float("inf"), 2.5e6, -1e-17)] == \
        ["1e+308", "inf", "-inf", "2.5e+06", "0.000"]
    assert signed(float("-inf")) == "−inf" and signed(float("nan")) == "nan"
    assert t_interval([1e308, 1e308]) == (1e308, 1e308, 1e308) and t_interval([float("inf"), 0.0])[1:] == (None, None)
    m = {"value": 1e308, "ci_low": float("-inf"), "ci_high": float("inf"), "n": 2, "higher_is_better": True}
    assert format_table({"x": m}).splitlines()[1].split()[1:3] == ["1e+308", "[-inf,"]
    assert _fmt(m) == "1e+308 [-inf, inf]"
    assert _iv(m, signed=True) == "+1e+308 [-inf, +inf]"
    assert _cell({"mean": float("inf"), "ci_low": None, "ci_high": None, "n": 2, "n_undefined": 0}, 2) == "inf"
    assert cell_text({"value": 1e308, "lo": None, "hi": None, "n": 1}).startswith("+1e+308")


def test_the_default_note_says_nothing_untrue_of_the_run(tmp_path):
    """Found 2026-12-07: a config without `note:` got the demo's text "one seed, so the intervals are bootstrap
    intervals over items", even in a 2-seed report of t-intervals over seeds. The default is no note; the report's
    own interval note says how the intervals of the seeds that finished are made."""
    from opct.experiment.config import ExperimentConfig

    assert ExperimentConfig().note == ""
    m = json.loads(json.dumps(BASE_METRICS))
    run = make_run(tmp_path, {**EXPERIMENT, "seeds": [0, 1], "note": ExperimentConfig(seeds=[0, 1]).note},
                   {(a, s): m for a in ("base", "opct", "bct") for s in (0, 1)})
    md = results(run)
    assert "**Note:**" not in md and "bootstrap intervals over items" not in md
    assert "Student-t interval over seeds" in md


def test_the_mechanism_section_says_what_it_covers_and_when_it_is_out_of_date(tmp_path):
    """Found 2026-12-07: after `opct mechanism RUN` and a rerun with another seed, the header said seeds 0, 1 and the
    Mechanism section, from mechanism.json of seed 0, said nothing of which seeds it covered or that it was stale."""
    from opct.report import mechanism as M

    probe = {"arms": ["opct"], "seeds": [0], "methods": {"opct": "opct"}, "skipped": [],
             "per_seed": {"0": {"change": {"opct": [0.1, 0.2]}, "similarity": {}, "layers": 2}}}
    probe["summary"] = M.summarise(probe)
    m = json.loads(json.dumps(BASE_METRICS))
    run = make_run(tmp_path, dict(EXPERIMENT, arms=["base", "opct"], seeds=[0]), {("base", 0): m, ("opct", 0): m})
    (run / "mechanism.json").write_text(json.dumps(probe))
    md = results(run)
    assert "This probe covers seed 0 of arm opct." in md and "Out of date" not in md
    exp = json.loads((run / "experiment.json").read_text())
    (run / "experiment.json").write_text(json.dumps(dict(exp, seeds=[0, 1])))
    write_cell(run, "base", 1, m)
    write_cell(run, "opct", 1, m)
    md = results(run)
    assert (f"**Out of date: the run now has finished cells it does not cover (opct seed 1); run `opct mechanism "
            f"{run}` to refresh it.**") in md
    html = build_report(run)[0].read_text()
    assert "Out of date: the run now has finished cells it does not cover (opct seed 1)" in html


def _unparsed_run(tmp_path):
    """The probe's run of 2026-12-07: seeds 0-2, an opct arm whose 32 biased answers are all unparsed (so its rate
    over all rows is 0.000), bct with 4 of 32 unparsed."""
    cells = {}
    for seed in (0, 1, 2):
        for arm, value, fails in (("base", 0.4375, 4), ("opct", 0.0, 32), ("bct", 0.4375 + 0.01 * seed, 4)):
            m = json.loads(json.dumps(BASE_METRICS))
            for name in ("sycophancy.sycophancy_rate_all", "sycophancy.sycophancy_rate_all[split=heldout]"):
                set_metric(m, name, value)
                m[name].update(n=32, parse_fail=fails, higher_is_better=False)
            set_metric(m, "sycophancy.sycophancy_rate", None if arm == "opct" else 0.5)
            m["sycophancy.sycophancy_rate"].update(n=0 if arm == "opct" else 28, parse_fail=fails)
            cells[(arm, seed)] = m
    spec = {"base": {"method": "base"}, "opct": {"method": "opct", "lr": 0.5}, "bct": {"method": "bct"}}
    exp = dict(EXPERIMENT, seeds=[0, 1, 2], arm_specs=spec)
    return make_run(tmp_path, exp, cells)


def test_unparsed_answers_are_shown_and_make_a_verdict_inconclusive(tmp_path):
    """Found 2026-12-07: an OPCT arm whose answers were 32/32 unparsed in every seed "reproduced" the paper's claim
    "OPCT leaves less sycophancy than SFT" (−0.375 [-0.580, -0.170], 3 seeds), section 3 showed opct at 0.000, and
    nothing in the report read `parse_fail`: the count now stands beside every number that has one, and a verdict
    off a metric with more than 20% of an arm's answers unparsed is inconclusive."""
    run = _unparsed_run(tmp_path)
    md = results(run)
    claims = md_table(md, "### The OPCT paper's headline claims")
    row = claims["OPCT leaves less sycophancy than SFT"]
    assert row["verdict"] == "inconclusive (100% unparsed in opct)"
    assert row["unparsed (opct; sft)"] == "96/96; 12/96"
    assert "reproduces" not in md.split("### The OPCT paper's headline claims", 1)[1].split("###", 1)[0]
    cell = [ln for ln in md.splitlines() if ln.startswith("| opct |") and "96/96 unparsed" in ln]
    assert cell, "the per-arm tables show opct's unparsed count"
    assert "– (96/96 unparsed)" in md  # a rate given an answer with no answer parsed: not measured, and why
    assert "more than 20% of an arm's answers unparsed is 'inconclusive'" in md
    html = build_report(run)[0].read_text()
    assert "inconclusive (100% unparsed in opct)" in html and "96/96 unparsed" in html


def test_a_few_unparsed_answers_are_counted_but_leave_the_verdict(tmp_path):
    """At or under the threshold the count is shown and the verdict stands (bct's 4 of 32 = 12.5%)."""
    from opct.report import unparsed
    from opct.report.paper import _doubted

    run = load_run(_unparsed_run(tmp_path))
    assert unparsed.counts(run.seed_runs("bct"), "sycophancy.sycophancy_rate_all") == (12, 96)
    assert unparsed.counts(run.seed_runs("bct"), "sycophancy.sycophancy_rate") == (12, 84)  # max(n, unparsed)
    assert _doubted("reproduces", run, "sycophancy.sycophancy_rate_all", ("bct", "base")) == "reproduces"
    assert _doubted("not measured", run, "sycophancy.sycophancy_rate_all", ("opct", "bct")) == "not measured"


def test_a_rate_given_an_answer_counts_its_unparsed_answers_among_all_it_read(tmp_path):
    """Found by a reviewer: a rate given an answer leaves its unparsed answers out of `n`, and the report read N as
    max(n, unparsed) per seed: n=5 with 11 unparsed and n=2 with 14 showed "(25/25 unparsed)" and "100% unparsed"
    where 25 of 32 answers were. Now metrics.json records `answers` (every answer read) and N is their sum; a
    metrics.json written before reads as before (max(n, unparsed): an upper bound of the share)."""
    from opct.report import unparsed

    name = "sycophancy.sycophancy_rate"
    cells = {}
    for seed, (n, fails) in enumerate(((5, 11), (2, 14))):
        for arm in ("base", "opct"):
            m = json.loads(json.dumps(BASE_METRICS))
            set_metric(m, name, 0.4, 0.1, 0.7)
            m[name].update(n=n, parse_fail=fails, higher_is_better=False)
            if arm == "opct":  # written with `answers`; base's metrics.json predates it
                m[name]["answers"] = n + fails
            cells[(arm, seed)] = m
    run = make_run(tmp_path, dict(EXPERIMENT, arms=["base", "opct"], seeds=[0, 1]), cells)
    syc = md_table(results(run), "Sycophancy (wrong suggestions)")
    assert syc["opct"]["sycophancy rate ↓"].endswith(" (25/32 unparsed)")
    assert syc["base"]["sycophancy rate ↓"].endswith(" (25/25 unparsed)")  # the bound, for old files
    loaded = load_run(run)
    assert unparsed.doubt(loaded, name, ("opct",)) == "inconclusive (78% unparsed in opct)"


def test_counts_of_reads_answers_and_falls_back_to_the_bound():
    """Before, counts_of summed max(n, parse_fail), whatever the metric's unit: now a metric's `answers` where it has
    one, else max(n, parse_fail) (a metrics.json written before `answers`); a cell not measured adds nothing."""
    from opct.report.unparsed import counts_of

    new, old = {"x": {"n": 5, "parse_fail": 11, "answers": 16}}, {"x": {"n": 2, "parse_fail": 14}}
    assert counts_of([new, old, None, {}], "x") == (25, 30)
    assert counts_of([{"x": {"n": 4, "parse_fail": 1, "answers": 4}}], "x") == (1, 4)  # counted in n: unchanged


# ------------------------------------------------------------------------------------------------ locks

def _hold(directory):
    """Another process holding `directory`'s run lock (`opct.files.dir_lock`, as `opct run` does), until killed."""
    import os
    import sys

    code = ("import sys, time\nfrom opct.files import dir_lock\nwith dir_lock(sys.argv[1]):\n    print('held', "
            "flush=True)\n    time.sleep(120)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    holder = subprocess.Popen([sys.executable, "-c", code, str(directory)], env=env, stdout=subprocess.PIPE)
    assert holder.stdout.readline() == b"held\n"
    return holder


def test_a_report_or_a_probe_into_a_run_another_process_holds_is_refused(tmp_path, capsys):
    """`opct report`, `opct mechanism` and a study's report took no lock: two of them, or one while `opct run` wrote
    the run, interleaved results.md and report.html (or mechanism.json), and a report begun before the run's last
    cell could replace the run's own with a stale one. Now each holds the run directory's lock (the one `opct run`
    holds), refused with a one-line error while another process holds it; `--out` elsewhere still reports."""
    from tiny_lm import cli_error

    run = single_seed_run(tmp_path)
    study = tmp_path / "study"
    study.mkdir()
    (study / "threats.json").write_text("{}")
    holders = [_hold(run), _hold(study)]
    try:
        pid = holders[0].pid
        assert cli_error(capsys, ["report", str(run)]) == (
            f"opct: error: {run}: experiment in use by another opct process (pid {pid}); wait for it to finish, or "
            f"write the report elsewhere with --out DIR")
        assert not (run / "results.md").exists() and not (run / "report.html").exists()
        assert cli_error(capsys, ["mechanism", str(run)]) == (
            f"opct: error: {run}: experiment in use by another opct process (pid {pid}); wait for it to finish")
        assert cli_error(capsys, ["report", str(study)]) == (
            f"opct: error: {study}: threats run in use by another opct process (pid {holders[1].pid}); wait for it "
            f"to finish, or write the report elsewhere with --out DIR")
        out = tmp_path / "elsewhere"
        assert main(["report", str(run), "--out", str(out)]) == 0  # the run is only read
        assert (out / "results.md").exists()
        capsys.readouterr()
        other = _hold(out)
        holders.append(other)
        assert cli_error(capsys, ["report", str(run), "--out", str(out)]) == (
            f"opct: error: {out}: report folder in use by another opct process (pid {other.pid}); wait for it to "
            f"finish, or choose another --out")
    finally:
        for h in holders:
            h.kill()
            h.wait()
    assert main(["report", str(run)]) == 0 and (run / "results.md").exists()


def test_a_read_only_run_directory_reports_elsewhere_and_says_so_when_it_cannot_be_written(small_disk, tmp_path,
                                                                                        capsys):
    """A finished run kept read-only: the report into it (and the probe's mechanism.json) is refused in one line that
    says what to do, before anything is computed; `--out` elsewhere reads it and reports."""
    from tiny_lm import cli_error

    run = single_seed_run(small_disk)
    assert subprocess.run(["mount", "-o", "remount,ro", str(small_disk)]).returncode == 0
    assert cli_error(capsys, ["report", str(run)]) == (
        f"opct: error: {run}: cannot write the report: read-only file system; write the report elsewhere with --out "
        f"DIR")
    assert cli_error(capsys, ["mechanism", str(run)]) == (
        f"opct: error: {run}: cannot write mechanism.json there: read-only file system")
    assert main(["report", str(run), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "results.md").exists()
