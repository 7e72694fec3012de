"""Config values are checked by type and range when they are loaded, before any work starts, in every config file
(train, eval + attack, experiment with its nested blocks, audit) and every flag; the error names the file (or the
flag) and the field, as one line without a traceback."""

import pytest
import torch
import yaml
from tiny_lm import cli_error

from opct.config import ConfigError, build_config
from opct.errors import OpctError
from opct.train.config import TrainConfig


def _yaml(tmp_path, name, data) -> str:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(p)


@pytest.mark.parametrize("text, field, problem", [
    ("max_steps: 2.5\n", "max_steps", "must be an integer (got 2.5)"),
    ("max_steps: ten\n", "max_steps", "must be an integer (got the string 'ten')"),
    ("max_steps: 0\n", "max_steps", "must be >= 1"),
    ("lr: -0.1\n", "lr", "must be > 0"),
    ("lr: 0\n", "lr", "must be > 0"),
    ("lr: .nan\n", "lr", "must be a finite number"),
    ("batch_size: 0\n", "batch_size", "must be >= 1"),
    ("n_samples: 0\n", "n_samples", "must be >= 1"),
    ("max_new_tokens: 0\n", "max_new_tokens", "must be >= 1"),
    ("temperature: .nan\n", "temperature", "must be a finite number"),
    ("lora: 'false'\n", "lora", "must be true or false (got the string 'false')"),
    ("estimator: exact\n", "estimator", "must be one of full, topk, sampled"),
    ("trust_remote_code: true\n", "trust_remote_code", "only be switched on by the command-line flag"),
    ("layers: '0,abc'\n", "layers", "'abc' is not a layer index (give comma-separated integers, e.g. 0,2,-1)"),
    ("layers: '--1'\n", "layers", "'--1' is not a layer index"),
    # past any real run: a step of 10^9 pairs built a list of them and grew memory for minutes (2026-12-07)
    ("batch_size: 1000000000\n", "batch_size", "must be <= 65536"),
    ("n_samples: 100000000\n", "n_samples", "must be <= 4096"),
    ("grad_accum: 1000000000\n", "grad_accum", "must be <= 65536"),
    ("max_steps: 1.0e+23\n", "max_steps", "must be <= 1000000000"),
])
def test_train_config_file_values_are_checked(tmp_path, text, field, problem):
    path = _yaml(tmp_path, "train.yaml", text)
    with pytest.raises(OpctError) as e:
        build_config(TrainConfig, None, path)
    assert str(e.value).startswith(f"{path}: {field}: ") and problem in str(e.value)


def test_a_key_that_yaml_reads_as_a_number_is_an_unknown_field_not_a_traceback(tmp_path, capsys):
    """`1: 2` in a config was a TypeError traceback from inside difflib (2026-12-07)."""
    path = _yaml(tmp_path, "train.yaml", "max_steps: 1\n1: 2\nnull: 3\n")
    err = cli_error(capsys, ["train", "--config", path, "--model", "m", "--pairs", "p", "--out", str(tmp_path / "r")])
    assert err.startswith(f"opct: error: {path}: unknown config field(s) 1, None; known: ")


def test_yaml_reads_scientific_notation_as_the_float_users_mean(tmp_path):
    cfg = build_config(TrainConfig, None, _yaml(tmp_path, "t.yaml", "lr: 1e-4\nmax_steps: 1e3\n"))
    assert cfg.lr == 1e-4 and isinstance(cfg.lr, float) and cfg.max_steps == 1000 and isinstance(cfg.max_steps, int)


@pytest.mark.parametrize("flag, value, needle", [
    ("--max-steps", "0", "--max-steps: must be >= 1 (got 0)"),
    ("--lr", "nan", "--lr: must be a finite number"),
    ("--batch-size", "0", "--batch-size: must be >= 1"),
    ("--max-new-tokens", "0", "--max-new-tokens: must be >= 1"),
    ("--temperature", "-1", "--temperature: must be > 0"),
])
def test_train_flags_are_checked(capsys, tmp_path, flag, value, needle):
    err = cli_error(capsys, ["train", "--model", "m", "--pairs", "p", "--out", str(tmp_path / "r"), flag, value])
    assert needle in err


@pytest.mark.parametrize("data, needle", [
    ({"arms": "opct"}, "arms: must be a list of method names or a mapping"),
    ({"seeds": 0}, "seeds: must be a list (got 0"),
    ({"seeds": [0, 1.5]}, "seeds[1]: must be an integer"),
    ({"train": {"max_steps": 2.5}}, "train.max_steps: must be an integer (got 2.5)"),
    ({"train": {"lora": "false"}}, "train.lora: must be true or false"),
    ({"train": {"trust_remote_code": True}}, "train.trust_remote_code: can only be switched on by the command-line"),
    ({"eval": {"n": 0}}, "eval.n: must be >= 1"),
    ({"eval": {"temperature": float("nan")}}, "eval.temperature: must be a finite number"),
    ({"attack": {"search_rounds": -24}}, "attack.search_rounds: must be >= 0 (got -24)"),
    ({"attack": {"attack_temperature": float("nan")}}, "attack.attack_temperature: must be a finite number"),
    ({"arms": {"topk": {"method": "opct", "estimator": "nope"}}}, "arms.topk.estimator: must be one of"),
    ({"arms": {"quick": {"method": "opct", "max_steps": 0}}}, "arms.quick.max_steps: must be >= 1"),
    ({"arms": {"x": {"method": "magic"}}}, "arms.x.method: unknown arm(s) magic"),
    # the arm's mapping as a whole, not 'arms.x.<file>' (a placeholder from the nested block's check)
    ({"arms": {"x": {"method": "bct", "bogus": 1}}}, "arms.x: unknown TrainConfig field(s) bogus; known: "),
    # `..` wrote its cells into OUT/<seed>/, outside the experiment (and its lock); `.` into the experiment's root
    ({"arms": {"..": {"method": "base"}}}, "arms: an arm name must be a non-empty directory name (got '..')"),
    ({"arms": [".", "opct"]}, "arms: an arm name must be a non-empty directory name (got '.')"),
    # a control character (a newline) made a folder no listing shows on one line (2026-12-07)
    ({"arms": ["a\nb"]}, "arms: an arm name must be a non-empty directory name (got 'a\\nb')"),
    ({"name": "x\ty"}, "name: must be a non-empty directory name"),
    ({"trained": {"sycophancy": ["flattery"]}}, "trained.sycophancy: unknown flattery"),
    ({"trained": {"capability": []}}, "trained.capability: not an axis that trains on pairs"),
    ({"trained": "sycophancy"}, "trained: must be a mapping"),
    ({"per_family": 0}, "per_family: must be >= 1"),
    ({"trust_remote_code": True}, "trust_remote_code: can only be switched on by the command-line flag"),
])
def test_experiment_files_are_checked_with_their_nested_blocks(tmp_path, capsys, data, needle):
    path = _yaml(tmp_path, "exp.yaml", data)
    err = cli_error(capsys, ["run", path])
    assert f"{path}: {needle}" in err


def test_flags_of_other_commands_are_checked(capsys, tmp_path):
    assert "--n: must be >= 1" in cli_error(capsys, ["eval", "--model", "m", "--out", str(tmp_path), "--n", "0"])
    assert "--search-rounds: must be >= 0" in cli_error(
        capsys, ["eval", "--model", "m", "--out", str(tmp_path), "--search-rounds", "-3"])
    assert "--seeds: must not be empty" in cli_error(capsys, ["run", "--seeds"])
    assert "--trained: expected AXIS=FAMILY" in cli_error(capsys, ["run", "--trained", "sycophancy"])
    # an axis named twice: the last list replaced the first without a word
    assert "--trained: expected AXIS=FAMILY,FAMILY,... once per axis (got 'sycophancy=consensus')" in cli_error(
        capsys, ["eval", "--model", "m", "--out", str(tmp_path), "--trained", "sycophancy=authority",
                 "sycophancy=consensus"])
    # an empty family name was dropped, and `--adapter ''` loaded the adapter in '.' (2026-12-07)
    assert "--trained: an empty family name in 'sycophancy=authority,,consensus' (write AXIS= for nothing trained)" \
        in cli_error(capsys, ["run", "--trained", "sycophancy=authority,,consensus"])
    trained = _yaml(tmp_path, "t.yaml", "trained: {sycophancy: [authority, '']}\n")
    assert f"{trained}: trained.sycophancy: an empty family name" in cli_error(capsys, ["run", trained])
    assert "--adapter: is empty; give a value or leave it out" in cli_error(
        capsys, ["eval", "--model", "m", "--out", str(tmp_path / "e"), "--adapter", ""])
    assert "--ft-lr: must be > 0" in cli_error(capsys, ["audit", "--out", str(tmp_path), "--ft-lr", "0"])
    # a repeated organism or method ran its cells again and recorded them twice; a blank --out named a directory
    # (a list of choices names the repeat itself since the same evening)
    assert "--methods[1]: 'k1' is given twice" in cli_error(capsys, ["audit", "--out", str(tmp_path), "--methods", "k1",
                                                                     "k1"])
    assert "--organisms[1]: 'sycophancy' is given twice" in cli_error(
        capsys, ["audit", "--out", str(tmp_path), "--organisms", "sycophancy", "sycophancy"])
    assert "--out: is blank (only whitespace)" in cli_error(capsys, ["audit", "--out", "  "])
    bad = _yaml(tmp_path, "eval.yaml", "n: 2.5\ngcg_steps: -1\n")
    assert f"{bad}: n: must be an integer" in cli_error(capsys, ["eval", "--model", "m", "--out", "x",
                                                                 "--config", bad])
    audit = _yaml(tmp_path, "audit.yaml", "k: 2.5\n")
    assert f"{audit}: k: must be an integer" in cli_error(capsys, ["audit", audit, "--out", str(tmp_path)])


@pytest.mark.parametrize("name,text", [("exp.yaml", ""), ("exp.yaml", "# name: mine\n\n"), ("exp.json", " \n")])
def test_a_config_file_without_settings_is_refused_not_read_as_every_default(tmp_path, capsys, name, text):
    """An empty (or all-commented) experiment file ran the whole default experiment; it is refused, by name."""
    path = _yaml(tmp_path, name, text)
    for argv in (["run", path, "--out", str(tmp_path / "runs")],
                 ["eval", "--model", "m", "--out", str(tmp_path / "e"), "--config", path]):
        assert cli_error(capsys, argv) == f"opct: error: {path}: holds no settings (empty" + \
            (", or comments only" if name.endswith(".yaml") else "") + "); leave the file out to use the defaults"
    assert not (tmp_path / "runs").exists()
    # an explicit empty mapping is a file that asks for the defaults: read, and on to the settings' own checks
    assert cli_error(capsys, ["run", _yaml(tmp_path, "m.yaml", "{}\n"), "--name", ""]).endswith(
        "--name: must be a non-empty directory name (got '')")


def test_trust_remote_code_only_by_flag_and_with_a_warning(capsys, test_organism):
    from opct.policy import load_policy

    load_policy(test_organism, trust_remote_code=True)
    err = capsys.readouterr().err
    assert "warning" in err and str(test_organism) in err and "will run" in err
    load_policy(test_organism)
    assert "warning" not in capsys.readouterr().err


def test_settings_changes_name_nested_fields_by_path():
    """The resume check (`opct.config.changes`) names a changed field inside a nested block by its dotted path,
    skips the paths it is told may change, and cuts long values short."""
    from opct.config import changes

    old = {"lr": 0.1, "train": {"lr": 0.01, "log_with": [], "max_steps": 5}, "eval": {"n": 6, "progress": True}}
    new = {"lr": 0.1, "train": {"lr": 0.02, "log_with": ["tensorboard"], "max_steps": 5},
           "eval": {"n": 6, "progress": False}}
    assert changes(old, new) == ["eval.progress (True -> False)", "train.log_with ([] -> ['tensorboard'])",
                                 "train.lr (0.01 -> 0.02)"]
    assert changes(old, new, ("train.log_with", "eval.progress")) == ["train.lr (0.01 -> 0.02)"]
    assert changes(old, new, ("train", "eval")) == []
    assert changes({"a": {"b": {"c": 1}}}, {"a": {"b": {"c": 2}}}) == ["a.b.c (1 -> 2)"]
    assert changes({"x": 1}, {"x": {"y": 1}}) == ["x (1 -> {'y': 1})"]  # a mapping on one side only: whole values
    # a block's field missing from the saved settings counts as the block's default
    assert changes({"train": {"lr": 0.1}}, {"train": {"lr": 0.1, "new": 3}}, defaults={"train": {"new": 3}}) == []
    assert changes({"train": {"lr": 0.1}}, {"train": {"lr": 0.1, "new": 4}}, defaults={"train": {"new": 3}}) == \
        ["train.new (3 -> 4)"]
    long = changes({"t": ["task"] * 100}, {"t": []})[0]
    assert long.startswith("t (['task', ") and long.endswith(" ... -> [])") and len(long) < 140


@pytest.mark.parametrize("where", ["missing", "file"])
def test_an_lm_eval_include_that_is_not_a_folder_is_refused_before_the_model_loads(where, capsys, tmp_path):
    path = tmp_path / "tasks"
    if where == "file":
        path.write_text("task: x\n")
    line = cli_error(capsys, ["eval", "--model", str(tmp_path / "no-model"), "--suite", "capability", "--lm-eval",
                              "--lm-eval-include", str(path), "--out", str(tmp_path / "ev")])
    problem = "no such folder" if where == "missing" else "not a folder"
    assert line == f"opct: error: --lm-eval-include: {path}: {problem} (a folder of lm-eval task YAMLs)"
    assert not (tmp_path / "ev").exists()


@pytest.mark.parametrize("extra, says", [
    (["--suite", "capability", "--lm-eval-limit", "2"],
     "--lm-eval-limit is an option of --lm-eval, which is not on: add --lm-eval (lm_eval: true), or drop it"),
    (["--lm-eval-tasks", "mine"], "--lm-eval-tasks is an option of --lm-eval, which is not on"),
    (["--no-lm-eval-chat-template"], "--no-lm-eval-chat-template is an option of --lm-eval, which is not on"),
    (["--suite", "sycophancy,jailbreak", "--lm-eval"],
     "--lm-eval runs with the capability suite, which --suite sycophancy,jailbreak leaves out: add capability to "
     "--suite, or drop --lm-eval"),
    (["--suite", "capability", "--lm-eval", "--lm-eval-tasks", "t1", "t2", "t1"],
     "lm_eval_tasks: names 't1' twice (got t1 t2 t1)"),
    # every probe is held in memory: a million samples per prompt ran the machine out of it (killed, no message)
    (["--suite", "sycophancy", "--samples", "1001"], "--samples: must be <= 1000 (got 1001)"),
], ids=["limit", "tasks", "chat-template", "no-capability", "task-twice", "samples"])
def test_lm_eval_options_that_would_do_nothing_are_refused(capsys, tmp_path, extra, says):
    """They used to be ignored without a word (exit 0, no lm-eval metrics)."""
    line = cli_error(capsys, ["eval", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "ev"), *extra])
    assert line.startswith(f"opct: error: {says}")
    assert not (tmp_path / "ev").exists()


@pytest.mark.parametrize("argv, says", [
    (["train", "--model", "m", "--pairs", "p", "--out", "{tmp}/r", "--seed", "-1"], "--seed: must be >= 0 (got -1)"),
    (["train", "--model", "m", "--pairs", "p", "--out", "{tmp}/r", "--seed", str(2 ** 32)],
     f"--seed: must be <= {2 ** 32 - 1}"),
    (["eval", "--model", "m", "--out", "{tmp}/e", "--seed", "-3"], "--seed: must be >= 0 (got -3)"),
    (["run", "--seeds", "0", "-1"], "--seeds[1]: must be >= 0 (got -1)"),
    (["audit", "--out", "{tmp}/a", "--seeds", "1", str(10 ** 11)], "--seeds[1]: must be <= 4294967295"),
    (["run", "{tmp}/rob.yaml"], "seeds[1]: must be >= 0 (got -2)"),
], ids=["train-negative", "train-too-large", "eval", "run", "audit", "file"])
def test_a_seed_numpy_cannot_take_is_refused_by_name(capsys, tmp_path, monkeypatch, argv, says):
    """numpy's generators take seeds 0 .. 2**32 - 1; `--seed -1` used to end in numpy's ValueError traceback."""
    monkeypatch.chdir(tmp_path)  # `opct run`'s default out is ./runs
    (tmp_path / "rob.yaml").write_text("kind: robustness\nseeds: [0, -2]\n")
    assert says in cli_error(capsys, [a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert not any(p.name in ("r", "e", "a", "runs") for p in tmp_path.iterdir())  # nothing made


@pytest.mark.parametrize("argv", [["pairs", "make", "--axis", "sycophancy", "--out", "x.jsonl", "--seed", "-1"],
                                  ["organism", "build", "--seed", "-5"], ["demo", "--profile", "--seed", "4294967296"]])
def test_a_seed_flag_outside_the_configs_is_checked_by_argparse(capsys, tmp_path, monkeypatch, argv):
    from opct.cli import main

    monkeypatch.chdir(tmp_path)

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "argument --seed: must be from 0 to 4294967295" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_lora_dropout_is_refused_for_the_methods_that_sample_and_kept_for_the_others():
    """OPCT's loss assumes the policy it trains drew the samples; the samples are drawn without dropout, so LoRA
    dropout in the training forward would train another policy. The methods that do not sample keep it."""
    from opct.methods import METHODS, ROLLOUTS
    from opct.train.loop import student_and_teacher

    from opct.train.config import check_method

    assert ROLLOUTS
    for method in METHODS:
        if method in ROLLOUTS:
            with pytest.raises(ConfigError, match=rf"lora_dropout: must be 0 for --method {method}, which trains on "
                                                  rf"the student's own samples"):
                check_method(TrainConfig(model="m", pairs="p", method=method, lora_dropout=0.1))
            check_method(TrainConfig(model="m", pairs="p", method=method, lora_dropout=0.1, lora=False))  # moot
        else:
            check_method(TrainConfig(model="m", pairs="p", method=method, lora_dropout=0.1))
    import tiny_lm

    student, _ = student_and_teacher(tiny_lm.make_model(tiny_lm.make_tokenizer()),
                                     TrainConfig(model="m", pairs="p", method="bct", lora_r=2, lora_dropout=0.25))
    rates = {m.p for m in student.modules() if isinstance(m, torch.nn.Dropout)}
    assert rates == {0.25}  # LoRA's, as asked


def test_a_key_set_twice_in_a_yaml_config_is_refused_and_a_byte_order_mark_is_read_past(tmp_path, capsys):
    """YAML keeps the last of two equal keys without a word (a second `lr:` further down silently won); a file a
    Windows editor saved with a byte-order mark reads as without one, as a config, a pairs file or a JSON file."""
    import tiny_lm

    from opct.config import load_config_file
    from opct.files import read_json
    from opct.pairs.schema import load_pairs

    twice = _yaml(tmp_path, "twice.yaml", "lr: 0.1\nmax_steps: 2\ntrain:\n  a: 1\nlr: 0.5\n")
    line = cli_error(capsys, ["train", "--config", twice, "--model", "m", "--pairs", "p", "--out", str(tmp_path / "r")])
    assert line == f"opct: error: {twice}:5: lr is set twice (first on line 1); keep one"
    nested = _yaml(tmp_path, "nested.yaml", "kind: robustness\ntrain:\n  lr: 0.1\n  lr: 0.2\n")
    with pytest.raises(OpctError, match=r"nested.yaml:4: lr is set twice \(first on line 3\)"):
        load_config_file(nested)
    bom = tmp_path / "bom.yaml"
    bom.write_bytes(b"\xef\xbb\xbf" + b"lr: 0.25\nmodel: m\npairs: p\n")
    assert load_config_file(bom) == {"lr": 0.25, "model": "m", "pairs": "p"}
    pairs = tiny_lm.write_pairs(tmp_path / "p.jsonl")
    pairs.write_bytes(b"\xef\xbb\xbf" + pairs.read_bytes())
    assert len(load_pairs(pairs)) == len(tiny_lm.make_pairs())
    (tmp_path / "c.json").write_bytes(b"\xef\xbb\xbf" + b'{"a": 1}')
    assert read_json(tmp_path / "c.json") == {"a": 1}


def test_yaml_merge_keys_work_and_a_yaml_error_names_its_line(tmp_path, capsys):
    """`<<: *anchor` (YAML's merge key) was refused as 'could not determine a constructor for the tag ...merge';
    a key the merge brings in may be overridden, a key set twice by the mapping itself is still an error. A list as
    a key was 'unhashable type: list' and a Python tag named no line."""
    from opct.config import load_config_file

    merged = _yaml(tmp_path, "merge.yaml", "arms:\n  bct: &b {method: bct, lr: 0.001}\n  bct_hi:\n    <<: *b\n"
                                           "    lr: 0.01\nseeds: [0]\n")
    assert load_config_file(merged)["arms"] == {"bct": {"method": "bct", "lr": 0.001},
                                                "bct_hi": {"method": "bct", "lr": 0.01}}
    many = _yaml(tmp_path, "many.yaml", "a: &a {x: 1}\nb: &b {y: 2}\nc:\n  <<: [*a, *b]\n  z: 3\n")
    assert load_config_file(many)["c"] == {"x": 1, "y": 2, "z": 3}
    twice = _yaml(tmp_path, "twice.yaml", "d: &d {lr: 1}\nx:\n  <<: *d\n  lr: 2\n  lr: 3\n")
    with pytest.raises(OpctError, match=r"twice.yaml:5: lr is set twice \(first on line 4\)"):
        load_config_file(twice)
    cases = {"list_key.yaml": ("? [a, b]\n: 1\n", ":1: a key must be a name, not a list"),
             "map_key.yaml": ("x: 1\n? {a: 1}\n: 1\n", ":2: a key must be a name, not a mapping"),
             "tag.yaml": ("max_steps: 2\nseeds: !!python/tuple [0]\n", ":2: cannot parse config: unsupported tag "
                                                                     "!!python/tuple"),
             "scalar_merge.yaml": ("x:\n  <<: 5\n", ":2: cannot parse config: expected a mapping or list of "
                                                   "mappings for merging"),
             "unclosed.yaml": ("a: 1\nb: [1\n", ":3: cannot parse config: expected ',' or ']'")}
    for name, (text, said) in cases.items():
        path = _yaml(tmp_path, name, text)
        line = cli_error(capsys, ["run", path])
        assert line.startswith(f"opct: error: {path}{said}"), line


@pytest.mark.parametrize("argv", [
    ["run", "--seeds", "0", "--seeds", "1"],
    ["train", "--log-with", "tensorboard", "--log-with", "wandb"],
    ["eval", "--trained", "sycophancy=authority", "--trained", "jailbreak=role_play"],
    ["audit", "--methods", "k1", "--methods", "k2"],
    ["mechanism", "runs/x", "--arms", "opct", "--arms", "bct"],
])
def test_a_list_flag_given_twice_is_refused_not_cut_to_its_last_list(capsys, argv):
    """argparse keeps the last of two lists without a word: `--seeds 0 --seeds 1` ran seed 1 alone (until
    2026-12-06). Once in each of two parses in one process is fine (the check is per parse)."""
    from opct.cli import build_parser

    flag = argv[-2]
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    assert f"error: {flag}: given twice; give all its values after one {flag}" in capsys.readouterr().err
    parser = build_parser()
    once = argv[:-2]
    for _ in range(2):
        assert len(getattr(parser.parse_args(once), flag[2:].replace("-", "_"))) == 1


@pytest.mark.parametrize("argv, says", [
    (["eval", "--model", "default", "--suite", "capability", "--out", " "], "--out: is blank (only whitespace)"),
    (["eval", "--model", " ", "--out", "{tmp}/e"], "--model: is blank (only whitespace)"),
    (["train", "--model", "default", "--pairs", "p.jsonl", "--out", "{tmp}/r", "--teacher-model", " "],
     "--teacher-model: is blank (only whitespace)"),
    (["run", "--name", "  "], "--name: is blank (only whitespace)"),
    (["eval", "--model", "default", "--out", "\u200b"], "--out: is blank (only whitespace)"),  # str.strip keeps it
])
def test_a_blank_config_string_is_refused_by_its_flag(capsys, tmp_path, monkeypatch, argv, says):
    """`opct eval --out ' '` evaluated into a directory named by a space, `--model ' '` said ': not a model
    directory' (until 2026-12-06): a string field given as whitespace is an error naming it, in a file too."""
    monkeypatch.chdir(tmp_path)
    assert says in cli_error(capsys, [a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert not list(tmp_path.iterdir())
    (tmp_path / "e.yaml").write_text("model: default\nout: ' '\n")
    config = ["eval", "--config", str(tmp_path / "e.yaml")]
    assert "e.yaml: out: is blank (only whitespace)" in cli_error(capsys, config)


@pytest.mark.parametrize("argv", [["report", " "], ["report", "\u200b\u2060"], ["mechanism", ""],
                                  ["pairs", "check", " "], ["run", " "],
                                  ["pairs", "make", "--axis", "sycophancy", "--out", " "], ["organism", "profile", " "],
                                  ["audit", " "], ["train", "--config", " "], ["demo", "--out", " "]])
def test_a_blank_path_argument_is_an_argparse_error(capsys, tmp_path, monkeypatch, argv):
    """`opct pairs make --out ' '` wrote a file named by a space; `opct report ' '` said ': run directory not
    found' (until 2026-12-06)."""
    from opct.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and ": is blank (" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("subject", ["default", "smollm2"])
@pytest.mark.parametrize("name", ["", "..", "a/b"])
def test_demo_name_must_be_one_folder(tmp_path, capsys, subject, name):
    """`opct demo --name ''` ran the demo under its default name (`--name ..` wrote beside OUT): refused before
    anything runs, like `opct run --name`."""
    from opct.cli import main

    with pytest.raises(SystemExit) as e:
        main(["demo", "--subject", subject, "--name", name, "--out", str(tmp_path / "runs")])
    assert e.value.code == 2
    assert f"--name: must be a non-empty directory name (got {name!r})" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_yaml_config_whose_aliases_expand_past_any_config_is_refused_at_once(tmp_path, capsys):
    """Ten lines of nested aliases ("billion laughs", 9^9 values expanded) hung `opct run` and `opct eval --config`
    for minutes (2026-12-07: every walk over the settings visits the expansion); refused now, naming the file, while
    an anchor used as YAML means it (one block shared by two fields) still loads."""
    from opct.config import MAX_CONFIG_VALUES, load_config_file

    lines = ["a0: &a0 [" + ", ".join(["x"] * 9) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    bomb = _yaml(tmp_path, "bomb.yaml", "\n".join(lines) + "\n")
    for argv in (["run", bomb], ["eval", "--model", "m", "--config", bomb, "--out", str(tmp_path / "e")]):
        assert cli_error(capsys, argv) == (f"opct: error: {bomb}: expands to more than {MAX_CONFIG_VALUES:,} values "
                                           "(YAML aliases referring to aliases); a config holds a few hundred: write "
                                           "the values out")
    shared = _yaml(tmp_path, "shared.yaml", "a: &b {lr: 0.1, steps: [1, 2]}\nc: *b\n")
    assert load_config_file(shared) == {"a": {"lr": 0.1, "steps": [1, 2]}, "c": {"lr": 0.1, "steps": [1, 2]}}
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_named_pipe_or_a_device_given_as_a_file_is_refused_before_it_is_opened(tmp_path, capsys, monkeypatch,
                                                                                 special):
    """A FIFO blocked `opct run FIFO` and `--items FIFO` forever (opening one waits for a writer) and /dev/zero read
    until memory ran out (2026-12-07). A file that is read more than once (JSONL, fingerprints) refuses both; a
    config, read once, takes a pipe (`--config <(...)`) but waits at most PIPE_WAIT_S for a writer."""
    import os

    from opct import config_file
    from opct.files import read_text, sha256
    from opct.pairs.schema import read_jsonl

    monkeypatch.setattr(config_file, "PIPE_WAIT_S", 0.2)
    path = special
    if special == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    what = "a named pipe" if special == "fifo" else "a character device"
    says = f"{path}: is {what}, not a regular file; give a file (copy what it holds into one)"
    for read in (read_text, sha256, lambda p: list(read_jsonl(p))):
        with pytest.raises(OpctError) as e:
            read(path)
        assert str(e.value) == says
    if special == "fifo":
        says = f"{path}: a named pipe that nothing was written to within 0.2 s; give a file"
    assert cli_error(capsys, ["run", path]) == f"opct: error: {says}"
    assert cli_error(capsys, ["eval", "--model", "m", "--config", path, "--out", str(tmp_path / "e")]) == \
        f"opct: error: {says}"


def test_a_config_through_a_pipe_is_read(tmp_path):
    """`--config <(...)`: the shell passes a pipe, which a config takes (up to PIPE_MAX_BYTES), read once and
    remembered, as a command may load its config more than once."""
    import os
    import threading

    from opct import config_file as files
    from opct.config import load_config_file

    path = tmp_path / "pipe"
    os.mkfifo(path)

    def write(data: bytes):
        with open(path, "wb") as f:
            try:
                f.write(data)
            except BrokenPipeError:  # the reader stopped at its limit
                pass

    writer = threading.Thread(target=write, args=(b'{"lr": 0.5, "max_steps": 3}',))
    writer.start()
    assert load_config_file(path) == {"lr": 0.5, "max_steps": 3}
    writer.join()
    # read again (`opct run` reads its file once per loader): what came through the pipe, not an empty config
    assert load_config_file(path) == {"lr": 0.5, "max_steps": 3}
    path = tmp_path / "pipe2"
    os.mkfifo(path)
    writer = threading.Thread(target=write, args=(b" " * (files.PIPE_MAX_BYTES + 1),))
    writer.start()
    with pytest.raises(OpctError, match=f"^{path}: more than 16 MiB came through the pipe; give a file$"):
        load_config_file(path)
    writer.join()
    # YAML through a pipe (the README's `--config <(printf 'max_steps: 1\n')`) was parsed as JSON: "Expecting value:
    # line 1 column 1" (found 2026-12-07); so was a YAML file of any other name than .yaml / .yml
    for i, (text, want) in enumerate([(b"max_steps: 1\nbatch_size: 2\n", {"max_steps": 1, "batch_size": 2}),
                                      (b"lr: 0.5\nlr: 0.1\n", "lr is set twice"),
                                      (b'{"lr": 0.5, "lr": 0.1}', "lr: set twice in one object")]):
        path = tmp_path / f"yaml{i}"
        os.mkfifo(path)
        writer = threading.Thread(target=write, args=(text,))
        writer.start()
        if isinstance(want, dict):
            assert load_config_file(path) == want
        else:
            with pytest.raises(OpctError, match=want):
                load_config_file(path)
        writer.join()
    (tmp_path / "exp.cfg").write_text("seeds: [0, 1]\n")
    assert load_config_file(tmp_path / "exp.cfg") == {"seeds": [0, 1]}
    (tmp_path / "bad.cfg").write_text('{"seeds": [0, 1}')
    with pytest.raises(OpctError, match=r"bad.cfg: cannot parse config: Expecting ',' delimiter"):
        load_config_file(tmp_path / "bad.cfg")


def test_threads_past_the_machines_cpus_and_devices_opct_has_no_path_for_are_refused_by_name(tmp_path, capsys):
    """`--threads 100000` crashed torch's thread pool (a segmentation fault under `opct run`, libgomp out of memory
    under `opct eval`) and 10^10 overflowed in torch.set_num_threads; `--device xla` / `meta` failed deep in loading
    (2026-12-07). Each is one line now, before any directory is made."""
    import os

    cpus = os.cpu_count()
    out = tmp_path / "e"
    for argv in (["eval", "--model", "m", "--threads", str(cpus + 1), "--out", str(out)],
                 ["eval", "--model", "m", "--threads", "10000000000", "--out", str(out)]):
        assert cli_error(capsys, argv).startswith(f"opct: error: --threads: must be <= {cpus}, the CPUs of this "
                                                  "machine (got ")
    cfg = _yaml(tmp_path, "exp.yaml", f"name: x\nmodel: test\nthreads: {cpus + 1}\n")
    assert cli_error(capsys, ["run", cfg]) == (f"opct: error: {cfg}: threads: must be <= {cpus}, the CPUs of this "
                                               f"machine (got {cpus + 1}); more threads than CPUs only slow torch "
                                               "down")
    for device in ("xla", "meta"):
        assert cli_error(capsys, ["eval", "--model", "test", "--device", device, "--out", str(out)]) == \
            f"opct: error: --device {device}: opct runs on cpu, cuda or mps, not {device}"
    assert not out.exists()


def test_a_bad_file_value_is_refused_even_when_a_flag_replaces_it(tmp_path, capsys):
    """`max_new_tokens: eight` in a config with `--max-new-tokens 4` on the command line ran with exit status 0 and
    no word of the file's error (2026-12-07): the file is checked whole, whatever the flags replace."""
    bad = _yaml(tmp_path, "e.yaml", "max_new_tokens: eight\n")
    assert cli_error(capsys, ["eval", "--model", "m", "--config", bad, "--max-new-tokens", "4", "--out",
                              str(tmp_path / "e")]) == (f"opct: error: {bad}: max_new_tokens: must be an integer (got "
                                                        "the string 'eight')")
    exp = _yaml(tmp_path, "x.yaml", "name: x\nmodel: test\nseeds: abc\n")
    assert cli_error(capsys, ["run", exp, "--seeds", "0"]).startswith(f"opct: error: {exp}: seeds: must be a list")
    good = _yaml(tmp_path, "g.yaml", "max_steps: 5\n")  # a good value a flag replaces: the flag's
    assert build_config(TrainConfig, None, good, max_steps=7).max_steps == 7


def test_a_choice_given_twice_in_a_list_option_is_refused(tmp_path, capsys):
    """`--log-with tensorboard tensorboard` was accepted and wrote two hparams runs (a probe, 2026-12-07), while a
    repeated seed was refused: a list of choices refuses a repeat, on the command line and in a file."""
    err = cli_error(capsys, ["train", "--model", "m", "--pairs", "p", "--out", "o", "--log-with", "tensorboard",
                             "tensorboard"])
    assert err == "opct: error: --log-with[1]: 'tensorboard' is given twice"
    path = _yaml(tmp_path, "e.yaml", "log_with: [wandb, tensorboard, wandb]\n")
    assert cli_error(capsys, ["run", path]) == f"opct: error: {path}: log_with[2]: 'wandb' is given twice"
