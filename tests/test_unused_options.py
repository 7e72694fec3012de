"""A training setting the run never reads is refused, not recorded and ignored: `opct train --method bct --estimator
topk` trained plain BCT and wrote `estimator: topk` into config.json (found by a bad-input probe, 2026-12-07). The
rule (`opct.train.config.USED_BY`) holds for `opct train` and for the per-arm / per-method overrides of experiments,
robustness studies and the threats matrix; a shared train block is not checked (some arm reads it). The tests also
check the table itself: a setting it calls unused leaves the trained weights exactly as they were."""

import pytest
import torch
import yaml
from safetensors.torch import load_file
from tiny_lm import cli_error, read_metrics
from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)

from opct.errors import OpctError
from opct.train.loop import train
from opct.train.config import USED_BY, TrainConfig, unused

from tiny_lm import model_dir_fixture, pairs_file  # noqa: E402,F401  (module-scoped fixtures shared with other suites)

SMALL = dict(lora_r=4, batch_size=4, max_new_tokens=8, max_steps=1, lr=1e-2)


@pytest.mark.parametrize("flags, message", [
    (["--method", "bct", "--estimator", "topk"],
     "--estimator: does nothing in this run (--method bct): it is for --method opct or offpolicy; remove it"),
    (["--method", "opct", "--topk", "50"],
     "--topk: does nothing in this run (--method opct, --estimator full): it is for --estimator topk"),
    (["--method", "offpolicy", "--estimator", "paper", "--importance-weight"],
     "--importance-weight: does nothing in this run (--method offpolicy, --estimator paper): it is for --estimator "
     "sampled"),
    (["--method", "opct", "--estimator", "sampled", "--importance-clip", "3"],
     "--importance-clip: does nothing in this run (--method opct, --estimator sampled, no --importance-weight)"),
    (["--method", "act", "--n-samples", "2"], "--n-samples: does nothing in this run (--method act)"),
    (["--method", "sft", "--temperature", "0.7"], "--temperature: does nothing in this run (--method sft)"),
    (["--method", "opct", "--layers", "0"],
     "--layers: does nothing in this run (--method opct): it is for --method act, act_fixed, act_fixed_live, mlpct "
     "or attct"),
    (["--method", "mlpct", "--act-weight", "0.5"], "--act-weight: does nothing in this run (--method mlpct)"),
    (["--method", "act", "--attct-weight", "2"], "--attct-weight: does nothing in this run (--method act)"),
    (["--method", "opct", "--target-n", "2", "--target-temperature", "1"],
     "--target-n: does nothing in this run (--method opct): it is for --method sft or bct"),
    (["--method", "bct", "--no-lora", "--lora-r", "4"], "--lora-r: does nothing in this run (--no-lora)"),
    (["--method", "sft", "--replay-schedule", "sequential"],
     "--replay-schedule: does nothing in this run (--replay-frac 0): it is for --replay-frac above 0"),
    (["--method", "opct", "--vllm-gpu-memory", "0.5"],
     "--vllm-gpu-memory: does nothing in this run (--method opct, --sampler hf): it is for --sampler vllm"),
    (["--method", "bct", "--sampler", "vllm"], "--sampler: does nothing in this run (--method bct)"),
    (["--method", "bct_soft_live", "--teacher-model", "t"], "--teacher-model: does nothing in this run"),
])
def test_a_flag_the_run_ignores_is_refused_by_name(tmp_path, capsys, flags, message):
    line = cli_error(capsys, ["train", "--model", "m", "--pairs", "p", "--out", str(tmp_path / "r"), *flags])
    assert line == f"opct: error: {message}" or line.startswith(f"opct: error: {message}"), line
    assert not (tmp_path / "r").exists()


def test_a_config_file_names_the_file_and_a_default_value_or_a_resume_passes(tmp_path, capsys):
    path = tmp_path / "t.yaml"
    path.write_text("method: bct\nestimator: topk\n")
    line = cli_error(capsys, ["train", "--config", str(path), "--model", "m", "--pairs", "p", "--out", "o"])
    assert line.startswith(f"opct: error: {path}: estimator: does nothing in this run (--method bct)"), line
    # a value equal to its default changes nothing, and a resume keeps the config the run was started with
    base = dict(method="bct", model="m", pairs="p", out="o")
    assert unused(TrainConfig(**base, estimator="full", n_samples=4)) == []
    assert unused(TrainConfig(**base, estimator="topk", n_samples=3)) == ["estimator", "n_samples"]
    line = cli_error(capsys, ["train", "--method", "bct", "--estimator", "topk", "--model", "m", "--pairs", "p",
                              "--out", str(tmp_path / "none"), "--resume"])
    assert "does nothing" not in line, line


def test_every_field_of_the_table_is_a_field_and_checked_below():
    assert set(USED_BY) <= set(TrainConfig.__dataclass_fields__)
    # teacher_model: ignored by the *_live methods only, whose clean-side target is the live model
    # (opct.methods.fixed_response._live_teacher); the rest are trained with below
    checked = {k for kw in IGNORED.values() for k in kw} | set(LORA_IGNORED) | {"teacher_model"}
    assert set(USED_BY) == checked, set(USED_BY) ^ checked


def _weights(run):
    name = "adapter_model.safetensors" if (run / "final" / "adapter_model.safetensors").exists() else \
        "model.safetensors"
    return load_file(run / "final" / name)


def _train(tmp_path, model_dir, pairs_file, name, **kw):
    run = train(TrainConfig(model=str(model_dir), pairs=str(pairs_file), out=str(tmp_path / name), **{**SMALL, **kw}))
    return _weights(run), [m["loss"] for m in read_metrics(run)]


# what each run does not read, all set at once; with the library's train() (the rule is the commands')
IGNORED = {
    "bct": dict(estimator="topk", topk=3, n_samples=3, temperature=0.5, min_new_tokens=2, clip_tau=1.0,
                layers="0", act_weight=0.5, mlpct_weight=3.0, attct_weight=3.0, replay_schedule="sequential"),
    "opct": dict(topk=3, importance_weight=True, importance_clip=5.0, target_n=2, target_temperature=0.5,
                 target="filler", mask_reason=True, layers="0", act_weight=0.5, vllm_gpu_memory=0.5,
                 vllm_enforce_eager=True),
    "act": dict(kl_chunk=4, sampler="vllm", n_samples=3, temperature=0.5, mlpct_weight=3.0, attct_weight=3.0,
                target="reason", target_n=2, target_temperature=0.5),
}


LORA_IGNORED = dict(lora_r=2, lora_alpha=4.0, lora_targets="q_proj", lora_dropout=0.1)


@pytest.mark.parametrize("method", list(IGNORED))
def test_what_the_table_calls_unused_leaves_the_trained_weights_exactly_as_they_were(tmp_path, model_dir,
                                                                                     pairs_file, method):
    ignored = IGNORED[method]
    assert sorted(unused(TrainConfig(method=method, model="m", pairs="p", out="o", **ignored))) == sorted(ignored)
    base_w, base_loss = _train(tmp_path, model_dir, pairs_file, "base", method=method)
    w, loss = _train(tmp_path, model_dir, pairs_file, "ignored", method=method, **ignored)
    assert loss == base_loss and all(torch.equal(base_w[k], w[k]) for k in base_w)
    # the comparison can tell: a setting the method reads moves the weights
    reads = {"bct": dict(target_n=2, target_temperature=1.0), "opct": dict(n_samples=3), "act": dict(layers="0")}[method]
    assert unused(TrainConfig(method=method, model="m", pairs="p", out="o", **reads)) == []
    w, _ = _train(tmp_path, model_dir, pairs_file, "read", method=method, **reads)
    assert not all(torch.equal(base_w[k], w[k]) for k in base_w)


def test_the_lora_settings_do_nothing_without_lora(tmp_path, model_dir, pairs_file):
    ignored = LORA_IGNORED
    assert sorted(unused(TrainConfig(method="bct", model="m", pairs="p", out="o", lora=False, **ignored))) == \
        sorted(ignored)
    base_w, base_loss = _train(tmp_path, model_dir, pairs_file, "base", method="bct", lora=False)
    w, loss = _train(tmp_path, model_dir, pairs_file, "ignored", method="bct", lora=False, **ignored)
    assert loss == base_loss and all(torch.equal(base_w[k], w[k]) for k in base_w)


def test_an_arms_own_setting_its_method_ignores_is_refused_but_a_shared_one_is_not(tmp_path):
    from opct.experiment.config import load_experiment

    def load(data):
        path = tmp_path / "e.yaml"
        path.write_text(yaml.safe_dump(data))
        return load_experiment(str(path))

    shared = load({"arms": ["base", "bct"], "train": {"estimator": "topk", "n_samples": 3}})
    assert shared.arm_config("bct").estimator == "topk"  # shared: kept as given, as before
    with pytest.raises(OpctError, match=r"e.yaml: arms.b.topk: does nothing in this run \(--method bct\): it is "
                                        r"for --estimator topk"):
        load({"arms": {"b": {"method": "bct", "topk": 5}}})
    with pytest.raises(OpctError, match=r"arms.opct.layers: does nothing in this run \(--method opct\)"):
        load({"arms": ["base", "opct"], "arm_train": {"opct": {"layers": "0"}}})
    # an override that needs a shared setting to be read: topk for an arm whose estimator the shared block sets
    assert load({"arms": {"o": {"method": "opct", "topk": 5}}, "train": {"estimator": "topk"}}).arm_config("o").topk == 5


def test_a_study_or_matrix_method_override_its_method_ignores_is_refused(tmp_path, capsys):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"kind": "threats", "methods": ["opct", "bct"],
                                    "method_train": {"bct": {"estimator": "sampled"}}}))
    line = cli_error(capsys, ["run", str(path), "--out", str(tmp_path / "runs")])
    assert line.startswith(f"opct: error: {path}: method_train.bct.estimator: does nothing in this run "
                           "(--method bct)"), line
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"kind": "robustness", "studies": {
        "replay": {"methods": ["act"], "method_train": {"act": {"mlpct_weight": 2.0}}}}}))
    line = cli_error(capsys, ["run", str(path), "--out", str(tmp_path / "runs")])
    assert "studies.replay.method_train.act.mlpct_weight: does nothing in this run (--method act)" in line, line


def test_a_shared_block_is_checked_against_the_methods_that_train_not_the_default_one(tmp_path, capsys):
    """A threats file of BCT alone with `train: {lora_dropout: 0.1}` was refused "must be 0 for --method opct" (the
    shared block was made with TrainConfig's default method), while the same value in a method's overrides passed
    (a probe, 2026-12-07). The method rules now run per method that trains; OPCT still refuses it, by name."""
    def threats(**over):
        path = tmp_path / "t.yaml"
        path.write_text(yaml.safe_dump({"kind": "threats", "threats": ["sycophancy"], **over}))
        return path

    from opct.threats import load_threats

    assert load_threats(threats(methods=["bct"], train={"lora_dropout": 0.1})).train.lora_dropout == 0.1
    with pytest.raises(OpctError, match=r"t.yaml: train.lora_dropout: must be 0 for --method opct"):
        load_threats(threats(methods=["bct", "opct"], train={"lora_dropout": 0.1}))
    with pytest.raises(OpctError, match=r"method_train.opct.lora_dropout: must be 0 for --method opct"):
        load_threats(threats(methods=["opct"], method_train={"opct": {"lora_dropout": 0.1}}))
    from opct.experiment.config import load_experiment

    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump({"arms": ["base", "bct"], "train": {"lora_dropout": 0.1}}))
    assert load_experiment(str(path)).arm_config("bct").lora_dropout == 0.1
    path.write_text(yaml.safe_dump({"arms": ["base", "bct", "opct"], "train": {"lora_dropout": 0.1}}))
    with pytest.raises(OpctError, match=r"arms.opct.lora_dropout: must be 0 for --method opct"):
        load_experiment(str(path))
    # `opct train` and the library's train() keep the rule
    line = cli_error(capsys, ["train", "--model", "m", "--pairs", "p", "--out", "o", "--lora-dropout", "0.1"])
    assert line.startswith("opct: error: --lora-dropout: must be 0 for --method opct"), line
    with pytest.raises(OpctError, match="lora_dropout: must be 0 for --method opct"):
        train(TrainConfig(model="m", pairs="p", out=str(tmp_path / "r"), lora_dropout=0.1))


@pytest.mark.parametrize("field, value", [("lr", 0.5), ("lora_r", 2), ("lr_schedule", "cosine"), ("lora", False)])
def test_a_threats_method_may_not_train_at_another_lr_or_lora_than_its_control(tmp_path, field, value):
    """`method_train: {bct: {lr: 0.5}}` trained BCT at 0.5 against a control at 0.001, and the report said every cell
    trained at 0.001 (a probe, 2026-12-07); the README promised the same LoRA, lr and schedule."""
    from opct.threats import load_threats

    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"kind": "threats", "methods": ["bct"], "method_train": {"bct": {field: value}}}))
    with pytest.raises(OpctError, match=rf"method_train.bct.{field}: is the shared train block's: every method and "
                                        rf"the control take the same steps x rows, LoRA, lr and schedule"):
        load_threats(path)


# `opct eval` (2026-12-07): an option none of the chosen axes reads was accepted and recorded in run.json — `--suite
# sycophancy --judge http ...` or `--gcg-steps 5`, `--judge world --judge-timeout 9`, `--trained jailbreak=` with
# `--suite sycophancy`, `--prompt-side teacher --suite capability` ran without a word. Each test below failed then.
@pytest.mark.parametrize("flags, message", [
    (["--suite", "sycophancy", "--judge", "refusal"],
     "--judge: does nothing in this run (--suite sycophancy): it is for --suite jailbreak or prefill (the axes a "
     "judge grades); remove it"),
    (["--suite", "sycophancy,capability", "--judge", "http", "--judge-url", "http://h/v1", "--judge-model", "g"],
     "--judge: does nothing in this run (--suite sycophancy,capability)"),
    # without --judge-url it said "--judge-url: judge http needs it" (found 2026-12-07)
    (["--suite", "sycophancy", "--judge", "http"], "--judge: does nothing in this run (--suite sycophancy)"),
    (["--suite", "jailbreak", "--judge", "world", "--judge-timeout", "9"],
     "--judge-timeout: does nothing in this run (--suite jailbreak, --judge world): it is for --judge http on "
     "--suite jailbreak or prefill; remove it"),
    (["--suite", "prefill", "--judge-key-env", "K"], "--judge-key-env: does nothing in this run (--suite prefill, "
                                                      "--judge auto)"),
    (["--suite", "sycophancy", "--gcg-steps", "5"],
     "--gcg-steps: does nothing in this run (--suite sycophancy): it is for the adaptive attacker (--suite "
     "jailbreak, without --no-attack); remove it"),
    (["--suite", "jailbreak", "--no-attack", "--rl-episodes", "2"],
     "--rl-episodes: does nothing in this run (--no-attack): it is for the adaptive attacker"),
    (["--suite", "awareness", "--attack-targets", "all"], "--attack-targets: does nothing in this run (--suite "
                                                          "awareness)"),
    # a switch turned off is named as typed: it said "--rl-attack: does nothing" (found 2026-12-07)
    (["--suite", "jailbreak", "--no-attack", "--no-rl-attack"],
     "--no-rl-attack: does nothing in this run (--no-attack): it is for the adaptive attacker"),
    (["--suite", "jailbreak", "--no-rl-attack", "--rl-epochs", "1"],
     "--rl-epochs: does nothing in this run (--no-rl-attack): it is for the RL attacker (--rl-attack); remove it"),
    (["--suite", "jailbreak", "--gcg-steps", "0", "--gcg-topk", "3"],
     "--gcg-topk: does nothing in this run (--gcg-steps 0): it is for white-box GCG (--gcg-steps above 0)"),
    (["--suite", "jailbreak", "--search-rounds", "0", "--search-depth", "2"],
     "--search-depth: does nothing in this run (--search-rounds 0): it is for the black-box search"),
    (["--suite", "sycophancy", "--trained", "jailbreak=role_play"],
     "--trained.jailbreak: does nothing in this run (--suite sycophancy): it is for the jailbreak axis; add "
     "jailbreak to --suite, or remove it"),
    (["--suite", "capability", "--prompt-side", "teacher"],
     "--prompt-side: does nothing in this run (--suite capability): it is for an axis with pairs, and so a teacher "
     "side (any but capability); remove it"),
])
def test_an_eval_option_no_axis_of_the_suite_reads_is_refused_by_name(tmp_path, capsys, flags, message):
    line = cli_error(capsys, ["eval", "--model", "never-loaded", "--out", str(tmp_path / "e"), *flags])
    assert line.startswith(f"opct: error: {message}"), line
    assert not (tmp_path / "e").exists()


def test_an_eval_option_read_by_some_axis_a_default_value_a_config_file_and_a_resume(tmp_path, capsys):
    """Read by one axis of the suite (or the default suite, all), or equal to its default: no refusal (the run goes
    on to the model, which is not there). In a --config file the file and field are named; --resume skips the rule
    (a run started before it continues with its settings)."""
    from opct.evals.used import ATTACK_USED_BY, PER_AXIS, USED_BY
    from opct.evals.attack import AttackConfig
    from opct.evals.run import EvalConfig

    assert set(USED_BY) | set(PER_AXIS) <= set(EvalConfig.__dataclass_fields__)
    assert set(ATTACK_USED_BY) == set(AttackConfig.__dataclass_fields__)  # every attacker option needs the attacker
    for flags in (["--judge", "refusal"], ["--suite", "sycophancy,prefill", "--judge", "refusal"],
                  ["--suite", "sycophancy,jailbreak", "--gcg-steps", "5", "--trained", "jailbreak=role_play"],
                  ["--suite", "sycophancy", "--judge", "auto", "--gcg-steps", "60", "--no-attack"],
                  ["--suite", "capability,persona", "--prompt-side", "teacher"],
                  ["--suite", "sycophancy", "--gcg-steps", "5", "--judge", "world", "--resume"]):
        line = cli_error(capsys, ["eval", "--model", "never-loaded", "--out", str(tmp_path / "e"), *flags])
        assert "does nothing" not in line and "never-loaded" in line, (flags, line)
    path = tmp_path / "e.yaml"
    path.write_text("suite: sycophancy\nsearch_rounds: 3\n")
    line = cli_error(capsys, ["eval", "--config", str(path), "--model", "m", "--out", str(tmp_path / "e")])
    assert line.startswith(f"opct: error: {path}: search_rounds: does nothing in this run (--suite sycophancy)"), line
