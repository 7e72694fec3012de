"""The bench scripts are commands users run (bench/opct_step.py --model DIR answers "is opct faster than TRL on my
model?"): a bad argument stops them in one argparse line, before any model loads or subprocess starts, never a
traceback from half way through (a --model that is no directory was an OSError from the hub client; --steps -1 a
StatisticsError after a full round; --rounds 0 printed an empty table)."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script, argv, says", [
    ("opct_step", ["--model", "/nonexistent/model"], "--model: model '/nonexistent/model': not a directory"),
    ("opct_step", ["--rounds", "0"], "argument --rounds: must be at least 1 (got 0)"),
    ("opct_step", ["--steps", "-1"], "argument --steps: must be at least 1 (got -1)"),
    ("opct_step", ["--warmup", "-1"], "argument --warmup: must be 0 or more (got -1)"),
    ("opct_step", ["--threads", "two"], "argument --threads: must be an integer (got 'two')"),
    ("opct_step", ["--trl-grad-accum", "3"], "--trl-grad-accum must divide pairs x samples (8)"),
    ("kl_memory", ["--forms", "fast"], "argument --forms: invalid choice: 'fast'"),
    ("kl_memory", ["--chunk", "0"], "argument --chunk: must be at least 1 (got 0)"),
    ("decode_step", ["--widths", "50"], "--widths: each must be a multiple of 3"),
    ("decode_step", ["--rows", "0"], "argument --rows: must be at least 1 (got 0)"),
    ("bf16_sampling", ["--seed", "-1"], "argument --seed: must be from 0 to"),
    ("decode_compile", ["--threads", "0"], "argument --threads: must be at least 1 (got 0)"),
    ("inspect_local", ["--n", "0"], "argument --n: must be at least 1 (got 0)"),
    ("vllm_check", ["--pairs", "p.jsonl", "--rows", "0"], "argument --rows: must be at least 1 (got 0)"),
])
def test_a_bad_bench_argument_is_one_argparse_line(script, argv, says, capsys, monkeypatch):
    module = _load(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])  # kl_memory and vllm_check read sys.argv
    with pytest.raises(SystemExit) as e:
        module.main(argv) if "argv" in module.main.__code__.co_varnames else module.main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{script}.py: error: " in err and says in err and "Traceback" not in err, err


def test_inspect_local_names_a_bad_model_or_task_before_any_eval(capsys):
    pytest.importorskip("inspect_ai")
    module = _load("inspect_local")
    for argv, says in ((["--model", "/nonexistent/model"], "error: model '/nonexistent/model': not a directory"),
                       (["--task", "nosuch"], "error: no inspect task for axis 'nosuch'; tasks: sycophancy")):
        with pytest.raises(SystemExit) as e:
            module.main(argv)
        assert e.value.code == 2 and says in capsys.readouterr().err
