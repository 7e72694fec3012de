"""A rerun of `opct run FILE` (experiment, threats matrix, robustness study) adds cells only on the inputs, settings
and cells its finished ones were built on; settings no cell reads and values that cannot happen are refused before
anything runs (all found 2026-12-07)."""

import json
import shutil

import pytest
import yaml
from tiny_lm import cli_error, one_thread  # noqa: F401

from opct.config import ConfigError
from opct.errors import OpctError
from opct.experiment import ExperimentConfig, load_experiment, run_experiment
from opct.pairs.schema import load_pairs, save_pairs

SMALL = dict(model="test", per_family=2, trained={"sycophancy": ["suggested_answer"]}, benign=False, report=False,
             progress=False, eval={"suite": "sycophancy", "n": 2, "attack": False, "max_new_tokens": 8},
             train={"max_steps": 1, "batch_size": 2, "n_samples": 2, "max_new_tokens": 8, "lora_r": 4,
                    "save_every": 1})


@pytest.mark.parametrize("text, needle", [
    # the matching `opct eval` flags were refused; the file's were accepted and ignored
    ("eval: {suite: sycophancy, attack: false}\nattack: {gcg_steps: 3}\n", "attack.gcg_steps: does nothing"),
    ("eval: {suite: sycophancy, judge: refusal}\n", "eval.judge: does nothing"),
    ("eval: {suite: sycophancy, axis_n: {jailbreak: 5}}\n", "eval.axis_n.jailbreak: does nothing"),
    ("eval: {suite: sycophancy}\ntrained: {sycophancy: [suggested_answer]}\npair_options: {awareness: {teacher: "
     "guideline}}\n", "pair_options.awareness: does nothing"),
    # evaluated the base cell, then failed naming no file
    ("arms: [base, bct]\ntrained: {sycophancy: []}\n", "trained: trains on nothing"),
    # capped to the pool (1987 pairs) while experiment.json recorded 10^11
    ("arms: {base: {}, bct: {benign_replay: 100000000000}}\n", "arms.bct.benign_replay: must be at most"),
    # suggested writing [None]
    ("arms: null\n", "arms: must be a list of method names or a mapping of arm names to settings (got null; write "
                     "[base, opct, bct], or leave it out for those)"),
    ("seeds: null\n", "seeds: must be a list (got null; leave it out for the default)"),
])
def test_settings_no_cell_reads_or_that_cannot_happen_are_refused_naming_the_file(tmp_path, capsys, text, needle):
    """Before: each ran (or failed after the base cell) without naming the file and field."""
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    with pytest.raises(OpctError) as e:
        load_experiment(path)
    assert str(e.value).startswith(f"{path}: ") and needle in str(e.value), str(e.value)
    assert needle in cli_error(capsys, ["run", str(path)])


def test_threats_control_prompts_and_washout_gap_past_what_can_happen_are_refused():
    """Before: control_prompts 10^12 was cut to the benign pool unsaid; washout min_gap 2 no rate gap reaches."""
    from opct.robustness.washout import Config as WashoutConfig
    from opct.threats.config import ThreatsConfig

    with pytest.raises(ConfigError, match="control_prompts: must be at most 1987"):
        ThreatsConfig(model="test", control_prompts=10 ** 12)
    with pytest.raises(ConfigError, match="min_gap"):
        WashoutConfig(min_gap=2)


@pytest.mark.parametrize("argv, needle", [
    (["--seed", "3"], "--seed: is for --profile --remeasure"),
    (["--n", "5"], "--n: is for --profile --remeasure"),
    (["--remeasure"], "--remeasure: is for --profile"),
    (["--subject", "smollm2", "--profile", "--remeasure"], "--remeasure: the smollm2 subject's profile is shipped"),
])
def test_demo_profile_flags_without_the_profile_are_refused(capsys, argv, needle):
    """Before: `opct demo --seed 3` (--n, --remeasure) started the full demo at seed 0; the subject's --remeasure
    printed the shipped profile."""
    assert needle in cli_error(capsys, ["demo", *argv])


def _pairs(src, dst, keep, reverse=False):
    pairs = [p for p in load_pairs(src) if p.split == "train"][::-1 if reverse else 1][:keep]
    save_pairs(pairs, dst)
    return dst


def test_a_rerun_on_changed_inputs_or_a_hand_edited_cell_is_refused(test_organism, tmp_path):
    """Before: a rerun on a replaced pairs file (or items, or weights) trained the new cells on it, exit 0; a cell
    whose train/ was swapped or whose arm_specs entry was removed and its lr changed was evaluated unchecked; and
    `--out ROOT/bct` put a new experiment inside the bct arm's folder."""
    from opct.experiment.runner import make_training_pairs

    world = tmp_path / "world.jsonl"
    save_pairs(make_training_pairs(ExperimentConfig(**SMALL, out=str(tmp_path), arms=["base"]), 0), world)
    pu = _pairs(world, tmp_path / "pu.jsonl", 6)
    first = dict(SMALL, model=str(test_organism), out=str(tmp_path / "runs"), name="c1", pairs=str(pu))
    root = run_experiment(ExperimentConfig(**first, arms=["base", "bct"]), log=lambda m: None)
    assert json.loads((root / "run_inputs.json").read_text())["pairs"]
    original = pu.read_bytes()
    _pairs(world, pu, 6, reverse=True)  # other pairs at the same path
    with pytest.raises(OpctError, match=rf"run_inputs.json: pairs {pu} holds other contents than when the run "
                                        r"started .*put the original back, or run under another --name or --out"):
        run_experiment(ExperimentConfig(**first, arms=["base", "bct", "sft"], seeds=[0, 1]), log=lambda m: None)
    assert not (root / "sft").exists() and not (root / "base" / "1").exists()
    pu.write_bytes(original)

    # arm_specs.bct removed by hand, bct's lr changed, the cell's done.json and eval/ deleted
    exp = json.loads((root / "experiment.json").read_text())
    del exp["arm_specs"]["bct"]
    (root / "experiment.json").write_text(json.dumps(exp))
    (root / "bct" / "0" / "done.json").unlink()
    shutil.rmtree(root / "bct" / "0" / "eval")
    with pytest.raises(OpctError, match=r"bct/0/train: the bct cell of seed 0 was trained with other settings or "
                                        r"inputs than it would be now \(changed: lr \(0.0001 -> 0.05\)\)"):
        run_experiment(ExperimentConfig(**first, arms={"base": {}, "bct": {"lr": 0.05}}), log=lambda m: None)
    # the cell's train/ swapped for a run on other pairs
    config = json.loads((root / "bct" / "0" / "train" / "config.json").read_text())
    other = _pairs(world, tmp_path / "other.jsonl", 6, reverse=True)
    inputs = json.loads((root / "bct" / "0" / "train" / "inputs.json").read_text())
    from opct import files
    from opct.train.rundir import CONFIG_DIGEST, config_digest

    config["pairs"] = str(other)
    inputs.update(pairs=files.sha256(other), **{CONFIG_DIGEST: config_digest(config)})
    (root / "bct" / "0" / "train" / "config.json").write_text(json.dumps(config))
    (root / "bct" / "0" / "train" / "inputs.json").write_text(json.dumps(inputs))
    with pytest.raises(OpctError, match=r"the bct cell of seed 0 was trained with other settings or inputs than it "
                                        r"would be now \(changed: pairs \('.*other.jsonl' -> '.*pu.jsonl'"):
        run_experiment(ExperimentConfig(**first, arms=["base", "bct"]), log=lambda m: None)

    with pytest.raises(OpctError, match=r"inside .*c1, which holds an experiment \(`opct run`\) \(experiment.json\); "
                                        r"a run there would mix"):
        run_experiment(ExperimentConfig(**{**first, "out": str(root), "name": "bct", "pairs": ""}, arms=["base"]),
                       log=lambda m: None)
    assert not (root / "bct" / "bct").exists()


def test_a_threats_pairs_file_edited_since_its_cells_trained_is_refused(tmp_path):
    """Before: threats' pairs.jsonl (and the control's) were used as found once written: an edited file trained the
    cells added later (a method added to `methods`)."""
    from opct.threats.config import ThreatsConfig
    from opct.threats.runner import control_pairs, threat_pairs

    cfg = ThreatsConfig(model="test", out=str(tmp_path), threats=["sycophancy"], per_family=2, control_prompts=4)
    for make, path in ((lambda p: threat_pairs(cfg, "sycophancy", 0, p), tmp_path / "t.jsonl"),
                       (lambda p: control_pairs(cfg, 0, p), tmp_path / "c.jsonl")):
        make(path)
        make(path)  # the same pairs: used
        save_pairs(load_pairs(path)[1:], path)
        with pytest.raises(OpctError, match="holds other pairs than the experiment makes for seed 0"):
            make(path)


def test_the_run_records_its_inputs_and_refuses_other_model_weights(tmp_path):
    """Before: only paths were kept (experiment.json, threats.json, study.json): new weights at the model's path
    trained and evaluated the new cells on them."""
    from opct.evals.run import EvalConfig
    from opct.run_inputs import check_run_inputs, experiment_inputs

    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"one")
    items = tmp_path / "items.jsonl"
    items.write_text("{}\n")
    now = experiment_inputs(str(model), EvalConfig(items=str(items), suite="sycophancy"))
    assert set(now[0]) == {"model", "items"}
    check_run_inputs(tmp_path, *now, continuing=False)
    check_run_inputs(tmp_path, *now, continuing=True)
    (model / "model.safetensors").write_bytes(b"two")
    items.write_text("{}\n{}\n")
    with pytest.raises(OpctError, match=rf"model {model} \(its weights\), eval.items {items} hold other contents"):
        check_run_inputs(tmp_path, *experiment_inputs(str(model), EvalConfig(items=str(items),
                                                                            suite="sycophancy")), continuing=True)
    check_run_inputs(tmp_path, *experiment_inputs(str(model), EvalConfig()), continuing=False)  # a restart records
    assert yaml.safe_load((tmp_path / "run_inputs.json").read_text())["model"] != now[0]["model"]


def test_base_picked_from_a_file_whose_other_arms_train_is_not_refused(tmp_path):
    """`opct run FILE --arms base` picks the base arm of a file whose trained arms read `pairs` and a trained axis's
    pair_options: those settings are not 'unread' there (a rule refusing pairs with no trained arm would refuse it)."""
    from opct.cli import build_parser

    path = tmp_path / "exp.yaml"
    path.write_text("arms: [base, bct]\npairs: /nonexistent.jsonl\neval: {suite: sycophancy}\n"
                    "trained: {awareness: [guideline]}\npair_options: {awareness: {teacher: guideline}}\n")
    cfg = load_experiment(path, build_parser().parse_args(["run", str(path), "--arms", "base"]))
    assert list(cfg.arms) == ["base"] and cfg.pairs == "/nonexistent.jsonl"


def test_a_rerun_of_an_arm_with_replay_on_a_users_pairs_is_not_refused(test_organism, tmp_path):
    """The finished-cell check looked for an arm's pairs at the user's `pairs` file, where an arm with benign_replay
    trains on its own seed<S>-<arm>.jsonl (its pairs plus the replay): an unchanged rerun (another seed added) was
    refused as 'trained with other settings or inputs' (found in review, 2026-12-07). The check and the runner now
    take the path from one place (runner.pairs_path)."""
    from opct.experiment.runner import make_training_pairs

    world = tmp_path / "world.jsonl"
    save_pairs(make_training_pairs(ExperimentConfig(**SMALL, out=str(tmp_path), arms=["base"]), 0), world)
    pu = _pairs(world, tmp_path / "pu.jsonl", 6)
    cfg = dict(SMALL, model=str(test_organism), out=str(tmp_path / "runs"), name="r", pairs=str(pu),
               arms={"base": {}, "bct": {"method": "bct", "benign_replay": 4}})
    root = run_experiment(ExperimentConfig(**cfg), log=lambda m: None)
    assert json.loads((root / "bct" / "0" / "train" / "config.json").read_text())["pairs"].endswith("seed0-bct.jsonl")
    run_experiment(ExperimentConfig(**{**cfg, "seeds": [0, 1]}), log=lambda m: None)
    assert (root / "bct" / "1" / "done.json").exists()


def test_the_lm_eval_task_files_are_recorded_and_a_rerun_after_one_changed_is_refused(tmp_path):
    """Before, run_inputs.json left out the lm-eval task files (`lm_eval_include`'s YAMLs, a task given as a YAML):
    a rerun after one was edited measured the new cells on the edited task beside cells measured on the old one, exit
    0. Now each file is recorded by path and SHA-256, and a rerun after one changed or was removed is refused naming
    it; a file added to the folder is recorded."""
    from opct import files
    from opct.evals.run import EvalConfig
    from opct.run_inputs import check_run_inputs, experiment_inputs

    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"one")
    inc = tmp_path / "tasks"
    (inc / "sub").mkdir(parents=True)
    (inc / "t.yaml").write_text("task: t\n")
    (inc / "sub" / "utils.py").write_text("def f(): pass\n")
    own = tmp_path / "own.yaml"
    own.write_text("task: own\n")
    ec = EvalConfig(suite="capability", lm_eval=True, lm_eval_include=str(inc), lm_eval_tasks=["t", str(own)])

    def check():
        check_run_inputs(tmp_path, *experiment_inputs(str(model), ec), continuing=True)

    check_run_inputs(tmp_path, *experiment_inputs(str(model), ec), continuing=False)
    saved = json.loads((tmp_path / "run_inputs.json").read_text())
    assert saved["lm_eval_include/t.yaml"] == files.sha256(inc / "t.yaml")
    assert saved["lm_eval_include/sub/utils.py"] == files.sha256(inc / "sub" / "utils.py")
    assert saved[f"lm_eval_tasks.{own}"] == files.sha256(own)
    check()
    (inc / "t.yaml").write_text("task: t\nnum_fewshot: 5\n")
    with pytest.raises(OpctError, match=rf"run_inputs.json: the lm-eval task file {inc / 't.yaml'} holds other "
                                        r"contents than when the run started"):
        check()
    (inc / "t.yaml").write_text("task: t\n")
    own.write_text("task: own\nlimit: 3\n")
    with pytest.raises(OpctError, match=rf"the lm-eval task file {own} holds other contents"):
        check()
    own.write_text("task: own\n")
    (inc / "sub" / "utils.py").unlink()
    with pytest.raises(OpctError, match=r"the lm-eval task file sub/utils.py \(removed from the include folder\) "
                                        r"holds other contents"):
        check()
    (inc / "sub" / "utils.py").write_text("def f(): pass\n")
    (inc / "new.yaml").write_text("task: new\n")
    check()
    assert "lm_eval_include/new.yaml" in json.loads((tmp_path / "run_inputs.json").read_text())
