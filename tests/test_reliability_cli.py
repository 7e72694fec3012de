"""Reliability at the CLI boundary: OS and decoding errors become one line naming the file (never a traceback), a
full or read-only disk damages nothing already written, damaged or mismatched model files are clear errors, and a
command run in-process leaves torch's thread count (and the RNGs) as it found them."""

import errno
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

import tiny_lm
from opct.cli import main
from opct.errors import OpctError
from tiny_lm import cli_error, fill_disk, one_thread, small_disk  # noqa: F401  (fixtures)

# transformers' log handler keeps the stderr it first sees: let that be the session's, not one test's capsys
transformers.utils.logging.get_verbosity()


def _pairs_make(out, *extra):
    return ["pairs", "make", "--axis", "sycophancy", "--per-family", "2", "--out", str(out), *extra]


# ------------------------------------------------------------------------------------------------ files and paths

def test_a_directory_where_a_file_belongs(tmp_path, capsys):
    err = cli_error(capsys, ["pairs", "check", str(tmp_path)])
    assert err == f"opct: error: {tmp_path}: is a directory, expected a file"
    (tmp_path / "taken").mkdir()
    err = cli_error(capsys, _pairs_make(tmp_path / "taken"))
    assert f"{tmp_path / 'taken'}: is a directory" in err


def test_a_file_where_a_directory_belongs(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me\n")
    # --out that is an existing file (the run directory's lock is taken before anything is loaded)
    err = cli_error(capsys, ["eval", "--model", str(tiny_lm.model_dir()), "--suite", "capability", "--out",
                             str(a_file)])
    assert err == f"opct: error: {a_file}: is a file, not a directory"
    err = cli_error(capsys, ["train", "--model", str(tiny_lm.model_dir()), "--pairs", str(a_file), "--out",
                             str(a_file)])
    assert err == f"opct: error: {a_file}: is a file, not a directory"
    # a file in the middle of the path
    err = cli_error(capsys, _pairs_make(a_file / "sub" / "pairs.jsonl"))
    assert f"{a_file}: is a file, not a directory" in err
    assert a_file.read_text() == "keep me\n"
    # a dangling symbolic link was said to be a file (2026-12-07)
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere" / "x")
    for argv in (["eval", "--model", str(tiny_lm.model_dir()), "--suite", "capability"],
                 ["train", "--model", str(tiny_lm.model_dir()), "--pairs", str(a_file)]):
        err = cli_error(capsys, [*argv, "--out", str(tmp_path / "gone")])
        assert err == f"opct: error: {tmp_path / 'gone'}: is a broken symbolic link, not a directory"
    assert (tmp_path / "gone").is_symlink() and not (tmp_path / "nowhere").exists()


def test_input_that_is_not_utf8_or_nested_too_deeply(tmp_path, capsys):
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes('{"id": "caf\u00e9"}\n'.encode("latin-1"))
    err = cli_error(capsys, ["pairs", "check", str(latin1)])
    assert err.startswith(f"opct: error: {latin1}:1: <text>: not UTF-8")  # the line, too
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 200_000 + "]" * 200_000 + "\n")
    err = cli_error(capsys, ["pairs", "check", str(deep)])
    assert err == f"opct: error: {deep}:1: <json>: nested too deeply"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_bytes(b"max_steps: \xff\xfe\n")
    err = cli_error(capsys, ["train", "--config", str(cfg), "--model", "m", "--pairs", "p", "--out", "o"])
    assert f"{cfg}: not UTF-8 text" in err


def test_a_key_set_twice_or_a_lone_surrogate_is_refused_where_the_file_is_read(tmp_path, capsys):
    """JSON keeps the last of a key set twice, silently (a config's `seeds` given twice ran the second list only), and
    parses "\\ud800" to a lone surrogate, which passed every check and then failed with a traceback where the text was
    written or tokenized (pairs poison, train, an eval's items). Both are errors naming the file, line and field in
    every JSON (and YAML) input; a surrogate pair (an emoji written as two escapes) is valid."""
    from opct.files import read_appended_jsonl, read_json

    lone = "\\udcff"
    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "c1", "question": "ok"}\n{"id": "c2", "question": "' + lone + ' Should I lie?"}\n')
    err = cli_error(capsys, ["pairs", "make", "--axis", "conditional", "--items", str(items), "--out",
                             str(tmp_path / "o.jsonl")])
    assert err == f"opct: error: {items}:2: question: not valid Unicode (a lone surrogate, '\\udcff' at character 0)"
    assert main(_pairs_make(tmp_path / "p.jsonl")) == 0
    line = (tmp_path / "p.jsonl").read_text().splitlines()[0]
    pairs = tmp_path / "bad.jsonl"
    pairs.write_text(line.replace('"content": "', '"content": "\\ud800', 1) + "\n")
    assert "teacher[0].content: not valid Unicode" in cli_error(capsys, ["pairs", "check", str(pairs)])
    pairs.write_text('{"id": "x", ' + line[1:] + "\n")
    assert cli_error(capsys, ["pairs", "check", str(pairs)]) == \
        f"opct: error: {pairs}:1: id: set twice in one object (JSON keeps only the last)"
    cfg = tmp_path / "exp.json"
    cfg.write_text('{"name": "d", "arms": ["base"], "seeds": [0], "seeds": [1]}')
    assert cli_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "runs")]) == \
        f"opct: error: {cfg}: cannot parse config: seeds: set twice in one object (JSON keeps only the last)"
    assert not (tmp_path / "runs").exists()
    cfg = tmp_path / "exp.yaml"
    cfg.write_text('name: "\\ud800"\n')
    assert "name: not valid Unicode" in cli_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "runs")])
    (tmp_path / "emoji.json").write_text('{"a": ["\\ud83d\\ude00"]}')
    assert read_json(tmp_path / "emoji.json") == {"a": ["\U0001f600"]}
    (tmp_path / "lone.json").write_text('{"a": {"b": ["x", "\\udfff"]}}')
    with pytest.raises(OpctError, match=r"lone\.json:0: a\.b\[1\]: not valid Unicode"):
        read_json(tmp_path / "lone.json")
    (tmp_path / "results.jsonl").write_text('{"kind": "cell"}\n{"kind": "cell", "kind": "x"}\n')
    with pytest.raises(OpctError, match=r"results\.jsonl:2: kind: set twice"):
        read_appended_jsonl(tmp_path / "results.jsonl")


def test_yaml_parse_errors_name_the_file(tmp_path, capsys):
    bad = tmp_path / "exp.yaml"
    bad.write_text("arms: [base, opct\nseeds: 0\n")
    err = cli_error(capsys, ["run", str(bad)])
    assert str(bad) in err
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------------ full and read-only disks

def test_full_disk_keeps_the_old_file_and_leaves_no_temporary_file(small_disk, capsys):
    out = small_disk / "pairs.jsonl"
    assert main(_pairs_make(out)) == 0
    before = out.read_bytes()
    fill_disk(small_disk)
    err = cli_error(capsys, _pairs_make(out, "--seed", "1"))
    assert err == f"opct: error: {out}: no space left on device"
    assert out.read_bytes() == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "pairs.jsonl"]
    # a run directory that cannot be made
    err = cli_error(capsys, ["eval", "--model", str(tiny_lm.model_dir()), "--suite", "capability", "--out",
                             str(small_disk / "deep" / "er" / "eval")])
    assert str(small_disk / "deep" / "er" / "eval") in err and "no space left on device" in err


def test_read_only_disk_keeps_the_old_file(small_disk, capsys):
    out = small_disk / "pairs.jsonl"
    assert main(_pairs_make(out)) == 0
    before = out.read_bytes()
    assert subprocess.run(["mount", "-o", "remount,ro", str(small_disk)]).returncode == 0
    err = cli_error(capsys, _pairs_make(out, "--seed", "1"))
    assert err == f"opct: error: {out}: read-only file system"
    assert out.read_bytes() == before
    err = cli_error(capsys, ["eval", "--model", str(tiny_lm.model_dir()), "--suite", "capability", "--out",
                             str(small_disk / "eval")])
    assert err == f"opct: error: {small_disk / 'eval'}: read-only file system"


def test_a_disk_error_at_the_last_moment_leaves_the_old_file(tmp_path, capsys, monkeypatch):
    """The same without root: the disk fills up just as the new file is flushed."""
    out = tmp_path / "pairs.jsonl"
    assert main(_pairs_make(out)) == 0
    before = out.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    err = cli_error(capsys, _pairs_make(out, "--seed", "1"))
    assert err == f"opct: error: {out}: no space left on device"
    assert out.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["pairs.jsonl"]


# ------------------------------------------------------------------------------------------------ model files

@pytest.fixture
def model_copy(tmp_path):
    def copy(name="model"):
        return Path(shutil.copytree(tiny_lm.model_dir(), tmp_path / name))
    return copy


def _eval(model, out, *extra):
    return ["eval", "--model", str(model), "--suite", "capability", "--n", "1", "--out", str(out), *extra]


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "generation_config.json"])
def test_a_damaged_or_missing_tokenizer_file_is_named(model_copy, tmp_path, capsys, name):
    """A damaged tokenizer file was "cannot load model or tokenizer (Expecting property name ...)", naming no file,
    and a missing tokenizer.json the cut-off "(Couldn't instantiate the backend tokenizer from one of:)" (found
    2026-12-07): the file and its line now, and what transformers looked for."""
    m = model_copy()
    (m / name).write_text('{"version": 1,\n  oops}')
    assert cli_error(capsys, _eval(m, tmp_path / "e")).startswith(f"opct: error: {m / name}:2: ")
    if name == "tokenizer.json":
        (m / name).unlink()
        err = cli_error(capsys, _eval(m, tmp_path / "e"))
        assert err.startswith(f"opct: error: {m}: cannot load the tokenizer (tokenizer.json, tokenizer_config.json: "
                              "Couldn't instantiate the backend tokenizer from one of: (1)"), err


def test_a_folder_named_like_the_weights_is_named_as_a_folder(model_copy, tmp_path, capsys):
    """`model.safetensors` a folder: "damaged or truncated safetensors file (No such device (os error 19))" until
    2026-12-07."""
    m = model_copy()
    (m / "model.safetensors").unlink()
    (m / "model.safetensors").mkdir()
    assert cli_error(capsys, _eval(m, tmp_path / "e")) == (f"opct: error: {m / 'model.safetensors'}: is a directory, "
                                                           "expected a safetensors file")


def test_truncated_or_garbled_weights_name_the_file(model_copy, tmp_path, capsys):
    m = model_copy()
    weights = m / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2])
    err = cli_error(capsys, _eval(m, tmp_path / "e1"))
    assert f"{weights}: damaged or truncated safetensors file" in err
    weights.write_bytes(b"\xff" * 64 + data[64:])
    assert f"{weights}: damaged or truncated" in cli_error(capsys, _eval(m, tmp_path / "e2"))
    # training loads its model the same way
    err = cli_error(capsys, ["train", "--model", str(m), "--pairs", str(tiny_lm.write_pairs(tmp_path / "p.jsonl")),
                             "--out", str(tmp_path / "run"), "--no-tensorboard"])
    assert f"{weights}: damaged or truncated" in err


@pytest.mark.parametrize("field, value, needle", [
    ("num_hidden_layers", 3, "missing from the weights"),          # would initialise layer 2 at random
    ("num_hidden_layers", 1, "in the weights but not in the configuration"),  # would drop layer 1
    ("hidden_size", 64, "does not match the weights"),             # other shapes
])
def test_a_config_that_does_not_match_the_weights(model_copy, tmp_path, capsys, field, value, needle):
    m = model_copy()
    cfg = json.loads((m / "config.json").read_text())
    cfg[field] = value
    (m / "config.json").write_text(json.dumps(cfg))
    err = cli_error(capsys, _eval(m, tmp_path / "e"))
    assert f"{m / 'config.json'}: does not match the weights" in err and needle in err


@pytest.mark.parametrize("edit, needle", [
    (lambda cfg: [1, 2], "config.json: not a model config (expected a JSON object, got list)"),
    (lambda cfg: "str", "config.json: not a model config (expected a JSON object, got str)"),
    (lambda cfg: {**cfg, "hidden_size": "abc"}, "config.json: the model cannot be built from it ("
     "StrictDataclassFieldValidationError: Validation error for field 'hidden_size': TypeError: Field 'hidden_size' "
     "expected int, got str (value: 'abc'))"),  # the reason on the message's second line was left out
    (lambda cfg: {**cfg, "vocab_size": None}, "config.json: the model cannot be built from it ("),
    (lambda cfg: {**cfg, "num_attention_heads": 0}, "config.json: the model cannot be built from it ("),
    (lambda cfg: {**cfg, "dtype": "float99"}, "config.json: the model cannot be built from it ("),
], ids=["list", "string", "size-a-string", "vocab-null", "zero-heads", "unknown-dtype"])
def test_a_config_the_model_cannot_be_built_from_is_one_line(model_copy, tmp_path, capsys, edit, needle):
    """Each used to end in a traceback (TypeError, the hub's validation error, ZeroDivisionError, AttributeError)."""
    m = model_copy()
    (m / "config.json").write_text(json.dumps(edit(json.loads((m / "config.json").read_text()))))
    err = cli_error(capsys, _eval(m, tmp_path / "e"))
    assert err.startswith(f"opct: error: {m}/{needle}"), err


def test_a_chat_template_that_does_not_compile_or_an_adapter_config_that_is_no_object(model_copy, tmp_path, capsys):
    m = model_copy()
    template = m / "chat_template.jinja"  # where save_pretrained puts the tokenizer's template
    saved = template.read_text()
    template.write_text("{{ garbage")
    err = cli_error(capsys, _eval(m, tmp_path / "e"))
    assert err.startswith(f"opct: error: {m}: its chat template (chat_template.jinja or tokenizer_config.json's "
                          f"chat_template) does not compile: line 1: "), err
    template.write_text(saved)
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"
    get_peft_model(AutoModelForCausalLM.from_pretrained(m), LoraConfig(r=2, target_modules=["q_proj"])) \
        .save_pretrained(adapter)
    (adapter / "adapter_config.json").write_text("[]")
    err = cli_error(capsys, _eval(m, tmp_path / "e2", "--adapter", str(adapter)))
    assert err == f"opct: error: {adapter}/adapter_config.json: not a peft adapter config (expected a JSON object, " \
                  f"got list)"


def test_an_adapter_that_is_only_a_pickle_is_refused(model_copy, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    m = model_copy()
    model = AutoModelForCausalLM.from_pretrained(m)
    adapter = tmp_path / "adapter"
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(adapter,
                                                                                      safe_serialization=False)
    assert (adapter / "adapter_model.bin").exists() and not (adapter / "adapter_model.safetensors").exists()
    err = cli_error(capsys, _eval(m, tmp_path / "e", "--adapter", str(adapter)))
    assert f"{adapter}: holds the adapter only as pickles (adapter_model.bin)" in err and "never loads" in err
    # the same for a model directory
    (m / "model.safetensors").unlink()
    torch.save(model.state_dict(), m / "pytorch_model.bin")
    assert "only as pickles (pytorch_model.bin)" in cli_error(capsys, _eval(m, tmp_path / "e"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_device_cuda_without_cuda(tmp_path, capsys):
    err = cli_error(capsys, _eval(tiny_lm.model_dir(), tmp_path / "e", "--device", "cuda"))
    assert err.startswith("opct: error: --device cuda: CUDA is not available")
    assert not (tmp_path / "e").exists()  # refused before anything was written
    assert "--device: 'banana' is not a torch device" in cli_error(capsys, _eval(tiny_lm.model_dir(), tmp_path / "e",
                                                                                 "--device", "banana"))
    # in a file, the file and the field (it named eval.device without the file until 2026-12-06)
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"model: {tiny_lm.model_dir()}\nout: {tmp_path / 'runs'}\neval: {{device: banana}}\n")
    assert f"{bad}: eval.device: 'banana' is not a torch device" in cli_error(capsys, ["run", str(bad)])
    assert not (tmp_path / "runs").exists()
    # an experiment file's device is named as the file spells it, and so is the fix
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"model: {tiny_lm.model_dir()}\nout: {tmp_path / 'runs'}\neval: {{device: cuda}}\n")
    err = cli_error(capsys, ["run", str(exp)])
    assert "eval.device cuda: CUDA is not available" in err and err.rstrip().endswith("use eval.device: cpu")


def test_first_line_of_a_library_error():
    from opct.errors import first_line

    class BrokenStr(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert first_line(ValueError("bad shape\n  at line 3")) == "bad shape"
    assert first_line(ValueError("\n\n   real reason  \nmore")) == "real reason"  # leading blank lines skipped
    assert first_line(RuntimeError()) == first_line(RuntimeError("  \n ")) == "RuntimeError"
    assert first_line(KeyError(), "unreadable") == "unreadable"
    assert first_line(BrokenStr()) == "BrokenStr"


@pytest.mark.parametrize("where", ["safetensors", "from_pretrained", "device"])
def test_a_library_error_without_a_message_is_still_one_line(model_copy, tmp_path, capsys, monkeypatch, where):
    """A library exception whose message is empty (or starts with a blank line) is quoted by its type: cutting the
    first line of an empty message raised IndexError, a traceback in place of the error."""
    import safetensors
    import transformers as tf

    def raise_empty(*a, **k):
        raise RuntimeError("" if where != "from_pretrained" else "\n")

    extra = []
    if where == "safetensors":
        monkeypatch.setattr(safetensors, "safe_open", raise_empty)
        needle = "damaged or truncated safetensors file (RuntimeError)"
    elif where == "from_pretrained":
        monkeypatch.setattr(tf.AutoModelForCausalLM, "from_pretrained", raise_empty)
        needle = "cannot load the model (RuntimeError)"
    else:
        monkeypatch.setattr(torch, "device", raise_empty)
        extra, needle = ["--device", "cpu"], "--device: 'cpu' is not a torch device (RuntimeError)"
    err = cli_error(capsys, _eval(model_copy(), tmp_path / "e", *extra))
    assert needle in err


# ------------------------------------------------------------------------------------------------ global state

def test_commands_in_process_restore_threads_and_rngs(test_organism, tmp_path, capsys):
    before = 3 if torch.get_num_threads() != 3 else 2
    torch.set_num_threads(before)
    random.seed(11)
    torch.manual_seed(11)
    want = (random.random(), float(torch.rand(1)))
    random.seed(11)
    torch.manual_seed(11)
    args = ["eval", "--model", str(test_organism), "--suite", "capability", "--n", "2", "--threads", "1",
            "--max-new-tokens", "8", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "ok")]) == 0  # sets one thread and seeds the RNGs while it runs
    assert torch.get_num_threads() == before
    assert (random.random(), float(torch.rand(1))) == want
    # also when the command fails after changing them
    bad_items = tmp_path / "items.jsonl"
    bad_items.write_text('{"id": "x"}\n')
    err = cli_error(capsys, [*args, "--out", str(tmp_path / "bad"), "--items", str(bad_items)])
    assert str(bad_items) in err
    assert torch.get_num_threads() == before
    torch.set_num_threads(1)  # this module's setting (tiny_lm.one_thread)


@pytest.mark.parametrize("argv, flag", [
    (["organism", "profile", "MODEL", "--n", "0"], "--n"),
    (["demo", "--profile", "--remeasure", "--n", "-2"], "--n"),
    (["mechanism", "RUN", "--n", "0"], "--n"),
    (["mechanism", "RUN", "--batch-size", "0"], "--batch-size"),
    (["pairs", "make", "--axis", "sycophancy", "--per-family", "x", "--out", "OUT"], "--per-family"),
])
def test_a_count_flag_below_one_is_a_usage_error(argv, flag, capsys):
    """A count of responses, prompts or items below 1 is refused before anything runs (`organism profile --n 0` used
    to sample nothing and print every rate as 0.000 with a target MISS)."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be " in err and "Traceback" not in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the notice is kept where torch sees a GPU")
def test_deepspeeds_cpu_notice_stays_off_stdout_on_a_cpu_machine(tmp_path, capsys):
    """With opct[deepspeed] installed, transformers' import of DeepSpeed printed "Setting accelerator to CPU. ..."
    to stdout in every command on a CPU machine (before `opct organism build`'s directory, a command's output).
    `main` drops that one notice while torch sees no CUDA device; the DeepSpeed logger's other messages pass."""
    import logging

    bad = tmp_path / "none.jsonl"
    assert main(["pairs", "check", str(bad)]) == 1  # any command: main installs the filter first
    capsys.readouterr()
    log = logging.getLogger("DeepSpeed")
    handler = logging.StreamHandler(stream=open(tmp_path / "log.txt", "w"))
    log.addHandler(handler)
    try:
        log.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.")
        log.warning("ZeRO stage 2 on 2 ranks")
    finally:
        log.removeHandler(handler)
        handler.stream.close()
    assert (tmp_path / "log.txt").read_text() == "ZeRO stage 2 on 2 ranks\n"
    if importlib.util.find_spec("deepspeed") is None:
        return
    # DeepSpeed as it is imported (through transformers): nothing on stdout from an opct command ...
    code = ("import sys; from opct.cli import main; main(['pairs', 'check', sys.argv[1]]); "
            "import transformers.integrations.deepspeed, deepspeed.accelerator as a; a.get_accelerator()")
    run = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0 and "Setting accelerator" not in run.stdout + run.stderr, run.stdout + run.stderr
    # ... where without opct's filter the notice is printed
    run = subprocess.run([sys.executable, "-c", "import deepspeed.accelerator as a; a.get_accelerator()"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert "Setting accelerator to CPU" in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize("marker, argv", [
    ("run.json", ["eval", "--model", "m", "--suite", "sycophancy", "--out", "{d}"]),  # an eval into an eval: --resume
    ("experiment.json", ["eval", "--model", "m", "--suite", "sycophancy", "--out", "{d}"]),
    ("inputs.json", ["eval", "--model", "m", "--suite", "sycophancy", "--out", "{d}"]),
    ("run.json", ["audit", "--quick", "--out", "{d}"]),
    ("inputs.json", ["audit", "--quick", "--out", "{d}"]),
    ("splits.json", ["run", "--model", "{model}", "--arms", "base", "--out", "{root}", "--name", "x"]),
    ("run.json", ["run", "--model", "{model}", "--arms", "base", "--out", "{root}", "--name", "x"]),
])
def test_a_directory_another_command_wrote_is_refused(tmp_path, capsys, test_organism, marker, argv):
    """`opct run` into an eval's --out, `opct eval` into an experiment or a training run, `opct audit` into a
    training run (whose config.json it took for an audit's with other settings): each ran, or failed misleadingly,
    mixing two commands' files in one directory. Refused before anything is written there."""
    d = tmp_path / "x"
    d.mkdir()
    (d / marker).write_text("{}")
    if argv[0] == "eval" and marker == "run.json":
        pytest.skip("an eval's own run directory: resumed or refused by check_resume")
    args = [a.format(d=d, root=tmp_path, model=test_organism) for a in argv]
    err = cli_error(capsys, args)
    assert f"{d}: holds " in err and f"({marker})" in err
    assert sorted(p.name for p in d.iterdir()) == [marker]
