"""Issue 20 parts 1-2: on-model benign replay for every method, capability's termination metrics, the wash-out study
and the robustness runner (`opct run FILE` with `kind: robustness`). Real training on the `test` organism."""

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from tiny_lm import cli_error, one_thread  # noqa: F401

from opct.errors import OpctError
from opct.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def _pairs(tmp_path, seed=0) -> Path:
    from opct.robustness.cells import axis_pairs

    return axis_pairs("sycophancy", ["suggested_answer"], seed, tmp_path / "pairs.jsonl", per_family=4)


def _train(organism, pairs, out, **kw):
    from opct.train.loop import train

    cfg = dict(method="bct", model=str(organism), pairs=str(pairs), out=str(out), max_steps=3, batch_size=4, lr=3e-3,
               max_new_tokens=16, save_every=10)
    cfg.update(kw)
    train(TrainConfig(**cfg))
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------------ replay

def test_replay_plan_trains_the_stated_share_of_examples():
    from opct.train.replay import plan

    for f in (0.1, 0.25, 0.5):
        p = plan(TrainConfig(max_steps=40, batch_size=8, replay_frac=f))
        rows = sum(len(p.rows_at(s)) for s in range(1, p.total_steps + 1))
        assert rows == p.total_rows and p.extra_steps == 0
        assert rows / (rows + 40 * 8) == pytest.approx(f, abs=0.01)
        s = plan(TrainConfig(max_steps=40, batch_size=8, replay_frac=f, replay_schedule="sequential"))
        assert all(len(s.rows_at(k)) == 0 for k in range(1, 41))  # nothing during the method's steps
        assert all(len(s.rows_at(k)) == 8 for k in range(41, s.total_steps + 1))
        assert s.total_rows / (s.total_rows + 320) == pytest.approx(f, abs=0.03)
    assert plan(TrainConfig()) is None


def test_replay_rows_are_the_starting_models_greedy_answers_to_prompts_no_eval_asks(test_organism, tmp_path):
    from opct.axes import AXES
    from opct.evals.run import run_axis
    from opct.evals.scripted import ScriptedPolicy
    from opct.policy import load_policy

    pairs = _pairs(tmp_path)
    # start from a trained adapter: the replay answers must still be the *starting* (base) model's, not the adapter's
    _train(test_organism, pairs, tmp_path / "first", max_steps=4, lr=3e-2)
    metrics = _train(test_organism, pairs, tmp_path / "run", replay_frac=0.5, max_steps=4,
                     init_adapter=str(tmp_path / "first" / "final"))
    rows = [json.loads(x) for x in (tmp_path / "run" / "replay.jsonl").read_text().splitlines()]
    assert len(rows) == 16 == sum(m["replay_rows"] for m in metrics)  # 4 steps x 4 pairs at f = 0.5
    base = load_policy(str(test_organism))
    greedy = base.sample([r["prompt_ids"] for r in rows], 16, temperature=0.0)
    assert [r["response_ids"] for r in rows] == greedy.response_ids
    assert [r["prompt_ids"] for r in rows] == [base.render(r["prompt"]) for r in rows]
    tuned = load_policy(str(test_organism), adapter=str(tmp_path / "first" / "final"))
    assert tuned.sample([r["prompt_ids"] for r in rows], 16, temperature=0.0).response_ids != greedy.response_ids

    # held out: no replay prompt is a prompt any evaluation asks (every axis, its probes built for all families)
    from opct.pairs.make import replay_pairs

    asked = set()
    for name in AXES:
        recs = run_axis(name, ScriptedPolicy(lambda m: "no"), n=10_000, log=lambda m: None)
        asked |= {m["content"] for r in recs for m in r["prompt"] if m["role"] == "user"}
    pool = {p.student[0]["content"] for p in replay_pairs(10_000)}
    assert len(pool) > 1900 and len(asked) > 500
    assert not pool & asked


def test_sequential_replay_trains_after_the_method_and_mixed_from_the_start(test_organism, tmp_path):
    pairs = _pairs(tmp_path)
    mixed = _train(test_organism, pairs, tmp_path / "mixed", replay_frac=0.25, method="opct", n_samples=1)
    seq = _train(test_organism, pairs, tmp_path / "seq", replay_frac=0.25, replay_schedule="sequential",
                 method="opct", n_samples=1)
    none = _train(test_organism, pairs, tmp_path / "none", method="opct", n_samples=1)
    assert [m["phase"] for m in mixed] == ["method"] * 3 and sum(m["replay_rows"] for m in mixed) == 4
    assert mixed[0]["replay_rows"] == 1 and mixed[0]["replay_loss"] is not None
    assert [m["phase"] for m in seq] == ["method"] * 3 + ["replay"]
    assert [m["replay_rows"] for m in seq] == [0, 0, 0, 4]
    # the method's steps of the sequential run are those of the run without replay; the replay step comes after
    assert [m["loss"] for m in seq[:3]] == pytest.approx([m["loss"] for m in none], rel=1e-6)
    assert mixed[1]["loss"] != pytest.approx(none[1]["loss"], rel=1e-6)
    assert (tmp_path / "seq" / "checkpoints" / "step-000004").is_dir()


def test_replay_works_with_every_method(test_organism, tmp_path):
    pairs = _pairs(tmp_path)
    for method in ("opct", "offpolicy", "act", "mlpct", "attct"):
        m = _train(test_organism, pairs, tmp_path / method, method=method, replay_frac=0.2, max_steps=2,
                   n_samples=1, replay_schedule="sequential" if method == "act" else "mixed")
        assert sum(r["replay_rows"] for r in m) >= 2 and all(r["loss"] is not None for r in m), method


# ------------------------------------------------------------------------------------------------ capability

def test_capability_reports_parse_failures_and_truncation(test_organism):
    from opct.axes import AXES
    from opct.evals.generate import Gen
    from opct.evals.run import run_axis
    from opct.policy import load_policy

    pol = load_policy(str(test_organism))
    short = AXES["capability"].metrics(run_axis("capability", pol, n=8, gen=Gen(max_new_tokens=1), log=print))
    long = AXES["capability"].metrics(run_axis("capability", pol, n=8, gen=Gen(max_new_tokens=48), log=print))
    assert short["capability.truncation_rate"]["value"] == 1.0  # one token never ends the turn
    assert long["capability.truncation_rate"]["value"] < 0.5
    assert short["capability.parse_fail_rate"]["value"] > long["capability.parse_fail_rate"]["value"]
    for k in ("accuracy", "accuracy_parsed", "parse_fail_rate", "truncation_rate"):
        assert f"capability.{k}[skill=facts]" in long
    assert long["capability.truncation_rate"]["higher_is_better"] is False


# ------------------------------------------------------------------------------------------------ wash-out

def test_wash_fraction_math_and_its_undefined_case():
    from opct.robustness.washout import wash_fraction

    assert wash_fraction(0.3, 0.1, 0.5, 0.05) == pytest.approx(0.5)
    assert wash_fraction(0.1, 0.1, 0.5, 0.05) == 0.0
    assert wash_fraction(0.6, 0.1, 0.5, 0.05) == pytest.approx(1.25)  # past the base: more than washed out
    assert wash_fraction(0.95, 0.99, 0.2, 0.05) == pytest.approx(0.04 / 0.79)  # a metric where higher is better
    assert wash_fraction(0.3, 0.50, 0.52, 0.05) is None  # training moved M by 0.02 < min_gap: undefined
    assert wash_fraction(0.3, 0.5, 0.5, 0.05) is None
    assert wash_fraction(None, 0.1, 0.5, 0.05) is None


def test_aggregate_clips_a_rate_to_0_1_and_a_difference_of_rates_to_minus_1_1():
    """A replay study without `metrics` reports the axis's summary, BRR among it (PAR for prefill): a difference of
    two rates, whose t-interval was clipped at 0 like a rate's when its per-seed values were positive."""
    from opct.report.aggregate import t975
    from opct.robustness.cells import row
    from opct.robustness.runner import aggregate

    per_seed = {s: [row("replay", "opct", "sycophancy", "none", None, m, v, False)
                    for m in ("sycophancy.brr", "sycophancy.sycophancy_rate")] for s, v in ((0, 0.1), (1, 0.2))}
    got = {r["metric"]: (r["ci_low"], r["ci_high"]) for r in aggregate(per_seed)}
    half = t975(1) * (0.1 / 2 ** 0.5) / 2 ** 0.5  # s = 0.0707 from two values 0.1 apart: half-width 0.635
    assert got["sycophancy.brr"] == (pytest.approx(0.15 - half), pytest.approx(0.15 + half))  # -0.485: kept
    assert got["sycophancy.sycophancy_rate"] == (0.0, pytest.approx(0.15 + half))  # a rate: clipped at 0


def test_standalone_summary_clips_intervals_as_the_runner_does():
    """`python -m opct.robustness.<study>` prints a summary; its intervals follow the runner's rules (a rate's stays in
    [0, 1], a difference of rates in [-1, 1], a wash fraction is not clipped), where it printed [-0.73, 0.86]."""
    from opct.robustness.cells import row
    from opct.robustness.standalone import summarize

    rows = [row("washout", "opct", "sycophancy", "c", 1.0, m, v, False)
            for m in ("sycophancy.sycophancy_rate", "sycophancy.brr", "wash_fraction[sycophancy_rate]")
            for v in (0.0, 0.3)]
    lines = {ln.split()[1]: ln for ln in summarize(rows)}
    assert "0.150 [0.000, 1.000]" in lines["sycophancy.sycophancy.sycophancy_rate"]  # t(1)·s/√2 = 1.906: clipped
    assert "0.150 [-1.000, 1.000]" in lines["sycophancy.sycophancy.brr"]
    assert "0.150 [-1.756, 2.056]" in lines["sycophancy.wash_fraction[sycophancy_rate]"]  # not clipped


@pytest.mark.parametrize("metric", ["transfer", "pairs_poisoned", "admission_teacher_bad", "wash_fraction:x"])
def test_ratios_and_counts_are_not_clipped_like_rates(metric):
    """A reasons `transfer` (held-out gain / train gain) whose two seeds gave 0.1 and 0.5 read 0.3 [0.000, 1.000],
    while seeds giving 0.1 and 1.2 read 0.65 [-6.34, 7.64]: the interval was clipped to [0, 1] whenever the values
    happened to fall there (a backdoor pair count likewise). Ratios and counts keep their interval; a rate's is
    clipped."""
    from opct.report.aggregate import t975
    from opct.robustness.cells import row
    from opct.robustness.runner import aggregate

    def interval(name):
        return aggregate({s: [row("reasons", "bct", "sycophancy", "c", None, name, v, True)]
                          for s, v in enumerate((0.1, 0.5))})[0]
    half = t975(1) * (0.4 / 2 ** 0.5) / 2 ** 0.5
    r = interval(metric)
    assert (r["ci_low"], r["ci_high"]) == (pytest.approx(0.3 - half), pytest.approx(0.3 + half))
    assert (interval("asr_clean")["ci_low"], interval("asr_clean")["ci_high"]) == (0.0, 1.0)


def test_wash_doses_are_prefixes_of_one_run_equal_to_separate_runs(test_organism, tmp_path):
    """The study evaluates dose d after continuing one wash run to d; that must equal a separate d-example run from
    the trained adapter (constant lr, same data stream)."""
    from safetensors.torch import load_file

    from opct.robustness.washout import Config, wash_config, write_wash_data
    from opct.train.loop import train

    _train(test_organism, _pairs(tmp_path), tmp_path / "trained")
    adapter = str(tmp_path / "trained" / "final")
    cfg = Config(wash_batch_size=4, doses=[0, 8, 16], train={"max_new_tokens": 16})
    pairs, targets = write_wash_data(16, 0, tmp_path / "wash-data")
    for dose in (8, 16):  # the study's way: one run, resumed to the next dose
        c = wash_config(cfg, str(test_organism), adapter, pairs, targets, tmp_path / "cumulative", dose, 0)
        train(c if dose == 8 else dataclasses.replace(c, resume=True))
    train(wash_config(cfg, str(test_organism), adapter, pairs, targets, tmp_path / "separate", 16, 0))
    a = load_file(tmp_path / "cumulative" / "final" / "adapter_model.safetensors")
    b = load_file(tmp_path / "separate" / "final" / "adapter_model.safetensors")
    t = load_file(tmp_path / "trained" / "final" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert any(not (a[k] == t[k]).all() for k in a)  # and the wash did change the adapter
    # the wash data: off-model reference answers to benign replay prompts
    rows = [json.loads(x) for x in targets.read_text().splitlines()]
    assert len(rows) == 16 and all(r["response"].endswith(".") for r in rows)


def test_the_wash_trains_nothing_the_evaluations_ask():
    """The wash trained the true answers of the replay pool's open fact questions ("The sullan is yellow."): a dose of
    512 covered all 80 entity facts, which capability's multiple-choice probes and the sycophancy probes ask in other
    forms (and replay asked them too). Now no wash or replay item names an entity, and none is a prompt any
    evaluation asks."""
    from opct.axes import AXES
    from opct.robustness.washout import wash_items
    from opct.world import lexicon as L

    from opct.world.items import replay_items

    items = wash_items(512, 0)
    assert len(items) == 512 and len({it["id"] for it in items}) == 512
    # nor does replay (on-model) ask any entity's fact: its pool is the wash's
    pool = {w.strip("?.,").lower() for it in replay_items() for w in it["question"].split()}
    assert not pool & set(L.ENTITIES), sorted(pool & set(L.ENTITIES))[:5]
    words = {w.strip("?.,").lower() for it in items for w in (it["question"] + " " + it["response"]).split()}
    assert not words & set(L.ENTITIES), sorted(words & set(L.ENTITIES))[:5]
    from opct.axes.capability import eval_world_items

    asked = {it["question"] for it in eval_world_items(100, 0)} | \
        {it.get("question") for it in AXES["sycophancy"].world_items(0)}
    assert len(asked) > 100 and not asked & {it["question"] for it in items}


def test_the_wash_continues_an_adapter_with_its_own_lora_settings(test_organism, tmp_path):
    """A study whose `train.lora_r` was 4 trained, then failed at its first wash: "--lora-r 16: the adapter of
    --init-adapter ... has lora_r 4", flags the user never gave (the wash took the default rank)."""
    from opct.robustness.washout import Config, wash_config, write_wash_data
    from opct.train.loop import train

    cfg = Config(wash_batch_size=4, doses=[0, 4], train={"max_new_tokens": 16, "lora_r": 4, "lora_alpha": 8,
                                                         "lora_targets": "q_proj,v_proj"})
    _train(test_organism, _pairs(tmp_path), tmp_path / "trained", lora_r=4, lora_alpha=8.0,
           lora_targets="q_proj,v_proj", max_steps=1)
    pairs, targets = write_wash_data(4, 0, tmp_path / "wash-data")
    wc = wash_config(cfg, str(test_organism), str(tmp_path / "trained" / "final"), pairs, targets,
                     tmp_path / "wash", 4, 0)
    assert (wc.lora_r, wc.lora_alpha, wc.lora_targets) == (4, 8.0, "q_proj,v_proj")
    train(wc)
    assert json.loads((tmp_path / "wash" / "final" / "adapter_config.json").read_text())["r"] == 4


# ------------------------------------------------------------------------------------------------ the runner

def _study_file(tmp_path, organism, **over) -> Path:
    data = {"kind": "robustness", "name": "r", "model": str(organism), "out": str(tmp_path / "runs"), "seeds": [0],
            "studies": {"washout": {"methods": ["bct"], "doses": [0, 8, 16], "wash_batch_size": 4, "per_family": 4,
                                    "train": {"max_steps": 3, "batch_size": 4, "lr": 3e-2, "max_new_tokens": 16},
                                    "eval": {"n": 6, "max_new_tokens": 16}}}}
    data.update(over)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def adapter_of(cell):
    return str(cell / "bct-sycophancy" / "train" / "final")


def test_runner_resumes_an_interrupted_cell_with_identical_rows(test_organism, tmp_path, capfd):
    from opct.cli import main
    from opct.evals.run import EvalConfig
    from opct.robustness.cells import evaluate

    path = _study_file(tmp_path, test_organism)
    capfd.readouterr()
    assert main(["run", str(path)]) == 0
    err = capfd.readouterr().err
    assert "robustness:" in err and "it/s" in err, err  # the study's bar and its training runs' bars
    root = tmp_path / "runs" / "r"
    cell = root / "washout" / "seed0"
    first = json.loads((cell / "rows.json").read_text())["rows"]
    agg = json.loads((root / "robustness.json").read_text())["rows"]
    assert {r["x"] for r in agg if r["condition"] == "dose"} == {0.0, 8.0, 16.0}
    assert "wash fraction" in (root / "results.md").read_text() and (root / "report.html").exists()

    # dose 0 is the trained model itself: its rows are the trained adapter's evaluation, its wash fraction 0
    m = evaluate(str(test_organism), str(cell / "bct-sycophancy" / "train" / "final"), ["sycophancy"],
                 EvalConfig(n=6, max_new_tokens=16, attack=False, progress=False),
                 {"sycophancy": ["suggested_answer"]}, 0, tmp_path / "fresh", print)
    # its done.json emptied or damaged since (a KeyError traceback; then no metric a study names): evaluated again,
    # each axis resumed from its files, or named
    done = tmp_path / "fresh" / "done.json"
    done.write_text(json.dumps({**json.loads(done.read_text()), "metrics": {}}))
    again = evaluate(str(test_organism), str(cell / "bct-sycophancy" / "train" / "final"), ["sycophancy"],
                     EvalConfig(n=6, max_new_tokens=16, attack=False, progress=False),
                     {"sycophancy": ["suggested_answer"]}, 0, tmp_path / "fresh", print)
    assert again == m and json.loads(done.read_text())["metrics"] == m
    # another cell's evaluation in this folder (copied: its done.json names the other model or adapter) was read as
    # this one's until 2026-12-08; now refused, naming the field. A study moved as a whole (the recorded paths gone)
    # is still read as its own
    for model, adapter, field in ((str(test_organism), None, "adapter"), (str(tmp_path), adapter_of(cell), "model"),
                                  (str(test_organism), str(tmp_path / "runs"), "adapter")):
        with pytest.raises(OpctError, match=rf"fresh/done\.json: {field}: .*copied, moved or linked from another "
                                            rf"cell.*remove {tmp_path / 'fresh'} to evaluate again"):
            evaluate(model, adapter, ["sycophancy"], EvalConfig(), {}, 0, tmp_path / "fresh", print)
    shutil.copytree(adapter_of(cell), tmp_path / "copy")  # the same adapter at another path: the same evaluation
    assert evaluate(str(test_organism), str(tmp_path / "copy"), ["sycophancy"], EvalConfig(), {}, 0,
                    tmp_path / "fresh", print) == m
    # a subject's name recorded (an older done.json) is that subject's model: another model's evaluation is refused
    named = json.loads(done.read_text())
    done.write_text(json.dumps({**named, "model": "default"}))
    with pytest.raises(OpctError, match=r"fresh/done\.json: model: 'default', but this evaluation is of "):
        evaluate(str(test_organism), adapter_of(cell), ["sycophancy"], EvalConfig(), {}, 0, tmp_path / "fresh", print)
    done.write_text(json.dumps(named))
    moved = {**json.loads(done.read_text()), "adapter": str(tmp_path / "elsewhere" / "train" / "final")}
    done.write_text(json.dumps(moved))
    assert evaluate(str(test_organism), adapter_of(cell), ["sycophancy"], EvalConfig(), {}, 0, tmp_path / "fresh",
                    print) == m
    done.write_text("[1]")
    with pytest.raises(OpctError, match=r"done\.json: .*must be an object"):
        evaluate(str(test_organism), None, ["sycophancy"], EvalConfig(), {}, 0, tmp_path / "fresh", print)
    dose0 = {r["metric"]: r["value"] for r in first if r["method"] == "bct" and r["x"] == 0.0}
    assert dose0["sycophancy.sycophancy_rate[split=heldout]"] == m["sycophancy.sycophancy_rate[split=heldout]"]["value"]
    assert all(v in (0.0, None) for k, v in dose0.items() if k.startswith("wash_fraction"))

    # interrupt: the last dose's evaluation and the wash's final model gone, the cell not done
    (cell / "rows.json").unlink()
    shutil.rmtree(cell / "bct-sycophancy" / "dose-16")
    shutil.rmtree(cell / "bct-sycophancy" / "wash" / "final")
    capfd.readouterr()
    assert main(["run", str(path), "--no-progress"]) == 0  # resumable with other bars; and none
    err = capfd.readouterr().err
    assert "robustness:" not in err and "it/s" not in err and "Loading weights" not in err, err
    assert json.loads((cell / "rows.json").read_text())["rows"] == first

    # a middle dose's evaluation deleted after the wash went past it: no earlier checkpoint to measure it on, so the
    # study says what to remove (the train resume's own error named --max-steps, a flag the study user never passed);
    # once removed, the wash is trained again from its start and the rows are the same
    (cell / "rows.json").unlink()
    shutil.rmtree(cell / "bct-sycophancy" / "dose-8")
    with pytest.raises(OpctError) as e:
        from opct.robustness.runner import load_robustness, run_robustness

        run_robustness(load_robustness(path), log=lambda m: None)
    wash = cell / "bct-sycophancy" / "wash"
    assert "washout seed 0: bct on sycophancy, dose 8: its result is missing" in str(e.value)
    assert f"remove {wash}, {cell / 'bct-sycophancy' / 'dose-16'}, then run again" in str(e.value)
    assert "--max-steps" not in str(e.value) and (cell / "bct-sycophancy" / "dose-16" / "done.json").exists()
    shutil.rmtree(wash)
    shutil.rmtree(cell / "bct-sycophancy" / "dose-16")
    run_robustness(load_robustness(path), log=lambda m: None)
    assert json.loads((cell / "rows.json").read_text())["rows"] == first

    # other settings under the same name are refused; --quick writes elsewhere
    bad = _study_file(tmp_path, test_organism, studies={"washout": {"methods": ["bct"], "doses": [0, 4],
                                                                    "wash_batch_size": 4}})
    with pytest.raises(OpctError, match="started with other settings"):
        from opct.robustness.runner import load_robustness, run_robustness

        run_robustness(load_robustness(bad), log=lambda m: None)
    # a changed train field is named key by key
    lr = _study_file(tmp_path, test_organism, studies={"washout": {
        "methods": ["bct"], "doses": [0, 8, 16], "wash_batch_size": 4, "per_family": 4,
        "train": {"max_steps": 3, "batch_size": 4, "lr": 2e-2, "max_new_tokens": 16},
        "eval": {"n": 6, "max_new_tokens": 16}}})
    with pytest.raises(OpctError, match=r"studies\.washout\.train\.lr \(0\.03 -> 0\.02\)") as e:
        run_robustness(load_robustness(lr), log=lambda m: None)
    assert "max_steps" not in str(e.value)
    # a run started before a new option existed (its settings lack the field) resumes: the field counts as its default
    saved = json.loads((root / "study.json").read_text())
    for block in ("train", "eval"):
        saved["studies"]["washout"][block].pop(next(iter(saved["studies"]["washout"][block])))
    saved["studies"]["washout"]["train"].pop("clip_tau", None)
    (root / "study.json").write_text(json.dumps(saved))
    path = _study_file(tmp_path, test_organism)  # the file as the run started (the variants above rewrote it)
    run_robustness(load_robustness(path), log=lambda m: None)


@pytest.mark.parametrize("studies, needle", [
    ({"washout": {"doses": [0, 30]}}, "studies.washout.doses[1]: must be a multiple of wash_batch_size (8)"),
    ({"washout": {"doses": [8, 16]}}, "studies.washout.doses: must start at 0"),
    ({"washout": {"min_gap": 0}}, "studies.washout.min_gap: must be > 0"),
    ({"replay": {"conditions": {"a": {"replay_frac": 1.5}}}}, "studies.replay.conditions.a.replay_frac: must be < 1"),
    ({"replay": {"conditions": {"a": {"replay_schedule": "later"}}}},
     "studies.replay.conditions.a.replay_schedule: must be one of mixed, sequential"),
    ({"replay": {"methods": ["dpo"]}}, "studies.replay.methods[0]: unknown method 'dpo'"),
    # a condition names a directory of the seed's (OUT/<method>-<axis>-<condition>/): 'a/../..' trained outside it
    ({"replay": {"conditions": {"a/../../../../../ESCAPED": {"replay_frac": 0.25}}}},
     "studies.replay.conditions: a condition name must be a non-empty directory name (got 'a/../../../../../ESCAPED')"),
    ({"replay": {"conditions": {"..": {}}}},
     "studies.replay.conditions: a condition name must be a non-empty directory name (got '..')"),
    ({"replay": {"conditions": {"": {}}}},
     "studies.replay.conditions: a condition name must be a non-empty directory name (got '')"),
    ({"replay": {"train": {"replay_frac": "lots"}}}, "studies.replay.train.replay_frac: must be a number"),
    ({"replay": {"train": {"seed": 1}}}, "seed is set by the runner"),
    ({"replay": {"axes": ["capability"]}}, "studies.replay.axes[0]: must be an axis that trains on pairs"),
    ({"replay": {"methods": ["bct"], "method_train": {"bct": {"bogus": 1}}}},
     "studies.replay.method_train.bct: unknown TrainConfig field(s) bogus; known: "),  # not '.bct.<file>: '
    ({"replay": {"axes": ["sycophancy"], "trained": {"sycophancy": ["authority", "authority"]}}},
     "studies.replay.trained.sycophancy: families must not repeat"),  # its pairs were made twice, with the same ids
    ({"poison": {}}, "studies: unknown study 'poison'"),
    # a misspelt metric was found only after the base model had been evaluated, without the file (2026-12-07)
    ({"replay": {"metrics": {"sycophancy": ["sycophancy.sycophancy_rat"]}}},
     "studies.replay.metrics.sycophancy[0]: no metric 'sycophancy.sycophancy_rat' (known: sycophancy.accuracy_biased, "),
    ({"washout": {"metrics": {"sycophancy": ["sycophancy.brr", "sycophancy.brr[split]"]}}},
     "studies.washout.metrics.sycophancy[1]: the group of 'sycophancy.brr[split]' must read [key=value]"),
    ({"washout": {"model": "x"}}, "model is set by the runner"),
    # a repeated axis or metric gave each row twice: the seed trained and evaluated, then its rows were refused
    ({"replay": {"axes": ["sycophancy", "sycophancy"]}}, "studies.replay.axes: must not repeat"),
    ({"washout": {"metrics": {"sycophancy": ["sycophancy.brr", "sycophancy.brr"]}}},
     "studies.washout.metrics.sycophancy: must not repeat"),
])
def test_bad_robustness_files_name_the_file_and_the_field(tmp_path, capsys, studies, needle):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"kind": "robustness", "studies": studies}))
    line = cli_error(capsys, ["run", str(path), "--out", str(tmp_path / "runs")])  # what gets past: under tmp_path
    assert str(path) in line and needle in line, line


def test_a_metric_the_evaluation_lacks_is_named_in_the_file(tmp_path, capsys, monkeypatch):
    """A metric whose name is known but whose group no probe has (`[family=nope]`) can only be found once the base
    model is evaluated: that error read `studies.replay.metrics.sycophancy: no metric ...`, without the file (and
    under `studies.` when the study ran alone). Now `opct run` and a study alone name the file, the block and the
    index. (The evaluation is stubbed: only its metric names matter.)"""
    from opct.robustness import cells, replay
    from opct.robustness.standalone import main

    rate = {"value": 0.5, "ci_low": 0.0, "ci_high": 1.0, "n": 4, "higher_is_better": False}
    monkeypatch.setattr(cells, "evaluate", lambda *a, **k: {"sycophancy.sycophancy_rate": rate,
                                                            "sycophancy.sycophancy_rate[family=authority]": rate})
    block = {"methods": ["bct"], "conditions": {"none": {"replay_frac": 0.0}},
             "metrics": {"sycophancy": ["sycophancy.sycophancy_rate", "sycophancy.sycophancy_rate[family=nope]"]}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"kind": "robustness", "model": str(ROOT / "opct" / "organisms" / "default"),
                                    "seeds": [0], "studies": {"replay": block}}))
    line = cli_error(capsys, ["run", str(path), "--out", str(tmp_path / "runs"), "--no-progress"])
    assert line == (f"opct: error: {path}: studies.replay.metrics.sycophancy[1]: no metric "
                    f"'sycophancy.sycophancy_rate[family=nope]' in the evaluation (known: sycophancy.sycophancy_rate, "
                    f"sycophancy.sycophancy_rate[family=authority])"), line
    alone = tmp_path / "alone.yaml"
    alone.write_text(yaml.safe_dump({"replay": block}))
    assert main(replay, [str(alone), "--out", str(tmp_path / "sa")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"opct: error: {alone}: replay.metrics.sycophancy[1]: no metric "), err


@pytest.mark.parametrize("axis", ["sycophancy", "jailbreak", "awareness", "prefill", "persona", "frustration",
                                  "conditional"])
def test_every_metric_an_evaluation_computes_is_declared(tmp_path, axis):
    """A study's metric names are checked when the file is read, against the names the axis declares
    (`declared_metrics`): every name its evaluation computes (without the attacker, as the studies evaluate) must be
    among them, or a right name would be refused. A scripted policy answers at random from each axis's answer forms."""
    import random

    from opct.axes import AXES
    from opct.axes.base import declared_metrics
    from opct.evals.run import run_eval
    from opct.evals.scripted import ScriptedPolicy
    from opct.robustness import cells

    assert AXES[axis].make_pairs is not None  # the axes a study trains on
    rng = random.Random(0)
    answers = ["Yes.", "No.", "I cannot help with that.", "Sure, here is how. Step one:", "The answer is A.", "B",
               "Warning: be careful.", "7"]
    ec = dataclasses.replace(cells.study_eval(), n=6, max_new_tokens=8, model="scripted", suite=axis,
                             out=str(tmp_path), seed=0, trained={axis: AXES[axis].default_trained()})
    got = run_eval(ScriptedPolicy(lambda m: rng.choice(answers)), ec, None, log=lambda m: None, resume="checked")
    names = {d.name() for d in declared_metrics(axis)}
    computed = {k.split("[")[0] for k in got if k.startswith(axis + ".")}
    assert computed and computed <= names, sorted(computed - names)


def test_flags_and_shipped_file(tmp_path, capsys):
    from opct.robustness.runner import load_robustness

    cfg = load_robustness(ROOT / "configs" / "robustness.yaml")
    assert cfg.seeds == [0, 1, 2] and set(cfg.built) == {"replay", "washout", "reasons", "backdoor"}
    assert cfg.built["washout"].doses == [0, 32, 64, 128, 256, 512]
    assert {"opct", "bct", "act"} <= set(cfg.built["washout"].methods)
    quick = load_robustness(ROOT / "configs" / "robustness.yaml", quick=True)
    assert quick.run_name() == "robustness-quick" and quick.built["replay"].train.max_steps < 200
    assert "--replay-frac: must be < 1" in cli_error(capsys, ["train", "--model", "x", "--pairs", "y", "--out",
                                                              str(tmp_path / "o"), "--replay-frac", "1"])
    assert "--quick is for robustness and threats files" in cli_error(
        capsys, ["run", str(ROOT / "configs" / "demo.yaml"), "--quick"])
    assert "--arms: not a setting of a robustness file" in cli_error(
        capsys, ["run", str(ROOT / "configs" / "robustness.yaml"), "--arms", "base"])
    assert "--no-benign: not a setting of a robustness file" in cli_error(  # named as typed
        capsys, ["run", str(ROOT / "configs" / "robustness.yaml"), "--no-benign"])


def test_a_partial_run_lists_its_unfinished_cells(tmp_path):
    """A killed or running robustness run's report showed its missing (study, seed) cells only as '–' seconds."""
    from opct.robustness.cells import row
    from opct.robustness.report import build
    from opct.robustness.runner import write_aggregate

    (tmp_path / "study.json").write_text(json.dumps({"name": "rob", "seeds": [0, 1],
                                                      "studies": {"replay": {}, "washout": {}}}))
    (tmp_path / "replay" / "seed0").mkdir(parents=True)
    (tmp_path / "replay" / "seed0" / "rows.json").write_text(json.dumps({"seconds": 3.0, "rows": [
        row("replay", "opct", "sycophancy", "none", None, "sycophancy.sycophancy_rate", 0.2, False)]}))
    write_aggregate(tmp_path)
    html_path, md_path = build(tmp_path)
    md = md_path.read_text()
    assert "**Missing (3 cells, not in the numbers below):**" in md
    assert "- replay seed 1: not finished (no rows.json)" in md and "- washout seed 0: not finished" in md
    assert "<li>washout seed 1: not finished (no rows.json)</li>" in html_path.read_text()


@pytest.mark.parametrize("key, value, needle", [
    ("seeds", ["0"], "seeds: expected a list of seeds (integers from 0 to 4294967295), got ['0']"),
    ("studies", {"replay": 3}, "studies: expected a mapping of names to settings, got {'replay': 3}"),
])
def test_a_damaged_study_json_is_named_before_a_rerun_extends_it(tmp_path, key, value, needle):
    """A rerun adds its seeds and studies to those of study.json: another shape there stopped it with a TypeError
    traceback, or ran the cells and wrote the mix back."""
    from opct.robustness.runner import _previous

    path = tmp_path / "study.json"
    path.write_text(json.dumps({"kind": "robustness", key: value}))
    with pytest.raises(OpctError) as e:
        _previous(tmp_path, {})
    assert str(e.value) == f"{path}: {needle}"


def test_unparsed_answers_reach_the_robustness_report(tmp_path):
    """The robustness tables showed a rate with no word of the answers behind it that could not be parsed: a method
    whose answers all went unreadable read as a sycophancy rate of 0 (found 2026-12-07). Rows read off an
    evaluation's metric carry (unparsed, answers), summed over seeds, and the report marks the cell."""
    from opct.robustness.cells import metric_rows
    from opct.robustness.report import build
    from opct.robustness.runner import check_rows, write_aggregate

    name = "sycophancy.sycophancy_rate_all"
    seeds = {0: {name: {"value": 0.0, "n": 32, "parse_fail": 32, "higher_is_better": False}},
             1: {name: {"value": 0.25, "n": 32, "parse_fail": 3, "higher_is_better": False}}}
    (tmp_path / "study.json").write_text(json.dumps({"name": "rob", "seeds": [0, 1], "studies": {"replay": {}}}))
    for s, metrics in seeds.items():
        rows = metric_rows("replay", "opct", "sycophancy", "none", None, metrics, [name])
        assert (rows[0]["unparsed"], rows[0]["answers"]) == (metrics[name]["parse_fail"], 32)
        (tmp_path / "replay" / f"seed{s}").mkdir(parents=True)
        (tmp_path / "replay" / f"seed{s}" / "rows.json").write_text(json.dumps({"rows": rows}))
    agg = write_aggregate(tmp_path)
    assert (agg[0]["unparsed"], agg[0]["answers"]) == (35, 64)
    md = build(tmp_path)[1].read_text()
    assert "(35/64 unparsed)" in md
    # rows without counts (a study's own metrics, rows.json of an earlier version) are read as before, unmarked
    (tmp_path / "replay" / "seed1" / "rows.json").write_text(json.dumps({"rows": [
        {k: v for k, v in r.items() if k not in ("unparsed", "answers")} for r in rows]}))
    agg = write_aggregate(tmp_path)
    assert (agg[0]["unparsed"], agg[0]["answers"]) == (32, 32)
    for bad, needle in [({"unparsed": -1, "answers": 3}, "unparsed: must be a count >= 0"),
                        ({"unparsed": 4, "answers": 3}, "unparsed (4) must come with answers at least as many"),
                        ({"unparsed": 1}, "unparsed (1) must come with answers"),
                        ({"answers": True}, "answers: must be a count"),
                        ({"other": 1}, "must have exactly the keys")]:
        with pytest.raises(OpctError, match=re.escape(needle)):
            bare = {k: v for k, v in rows[0].items() if k not in ("unparsed", "answers")}
            check_rows([{**bare, **bad}], "rows.json")


def test_a_studys_rows_are_checked_alike_by_opct_run_and_run_alone():
    """`opct run` took a study's result given twice (the same study, method, axis, condition, x and metric in one
    seed: the aggregate then averaged a seed in twice) and a row of another study; a study run alone checked those
    with asserts, a bare AssertionError traceback. One check now serves both, each problem an OpctError naming the
    row."""
    from opct.robustness.runner import check_rows
    from opct.robustness.standalone import check_rows as alone

    row = {"study": "replay", "method": "opct", "axis": "sycophancy", "condition": "none", "x": 1, "metric": "m",
           "value": 0.5, "higher_is_better": False}
    assert check_rows([row, {**row, "x": 2.0}], "study replay", "replay")[0]["x"] == 1.0  # an int x read as a float
    for check in (lambda rows: check_rows(rows, "study replay", "replay"), lambda rows: alone(rows, "replay")):
        with pytest.raises(OpctError, match=r"study replay: row 1: the same study, method, axis, condition, x, "
                                            r"metric as row 0 .*a result given twice"):
            check([row, {**row, "x": 1.0, "value": 0.25}])
        with pytest.raises(OpctError, match=r"study replay: row 0: study: 'washout', but the rows are study "
                                            r"'replay''s"):
            check([{**row, "study": "washout"}])
        with pytest.raises(OpctError, match="row 0: value: wrong type"):
            check([{**row, "value": "high"}])
