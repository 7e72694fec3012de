"""The README and the shipped configs agree with the code: every `opct ...` command the README shows parses with
today's CLI (a renamed or dropped flag fails here, not in a user's shell), every `make` target it names exists, and
every file in configs/ loads through the loader `opct run` / `opct audit` / `python -m opct.robustness.<study>` give it
(an experiment, robustness or threats file, the audit's config, a standalone study block)."""

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# the migration notes name flags of the layout before the axes, on purpose
CURRENT = README[:README.index("## Migrating from the layout")]


def readme_commands() -> list[str]:
    """The `opct ...` lines of the README's code blocks (continuations joined) and its inline `opct ...` spans."""
    lines = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", CURRENT, re.DOTALL):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("opct "):
                lines.append(line)
    return sorted(set(lines + re.findall(r"`(opct [^`]+)`", CURRENT)))


def as_argv(command: str) -> list[str]:
    """The command as one concrete argv: comments, redirections and pipes cut; an optional `[...]` taken; the first of
    `a|b` alternatives; `(...)` remarks dropped; upper-case placeholders (N, DIR, FILE) filled with a value."""
    command = re.split(r" #| >| \|| &&| 2>", command)[0]
    command = re.sub(r"\[([^\[\]]*)\]", r"\1", command)
    command = re.sub(r"\([^()]*\)", "", command)
    command = re.sub(r"(\S+?)\|\S+", r"\1", command)
    argv = [a for a in shlex.split(command)[1:] if a not in ("...", "…")]
    return ["1" if a == "N" else a for a in argv]


@pytest.mark.parametrize("command", readme_commands(), ids=lambda c: c[5:60])
def test_every_readme_command_parses(command):
    from opct.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(as_argv(command))
    except SystemExit as e:
        message = err.getvalue().strip()
        # an inline span that names a flag without its value (`opct eval --items`) is a reference, not a command
        if e.code and "expected one argument" not in message and "arguments are required" not in message:
            pytest.fail(f"README: `{command}` does not parse: {message.splitlines()[-1] if message else e.code}")


def test_the_readme_shows_commands_at_all():
    assert len(readme_commands()) > 50  # the extraction itself still finds the README's commands


def _options_without_help(parser, path=("opct",)):
    """(command, option) for every argument of `parser` and its subcommands that `--help` shows with no text."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options_without_help(sub, (*path, name))
        elif not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS and not action.help:
            yield " ".join(path), "/".join(action.option_strings) or action.dest


def test_every_command_line_option_has_help():
    """`opct ... --help` documents every option and positional argument of every command."""
    from opct.cli import build_parser

    missing = list(_options_without_help(build_parser()))
    assert not missing, f"options with no help text: {missing}"


def test_every_make_target_the_readme_names_exists():
    targets = set(re.findall(r"^([a-z0-9-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    named = set(re.findall(r"`make ([a-z0-9-]+)`", CURRENT))
    assert {"demo", "test"} <= named, named  # the README's two commands
    assert named <= targets, f"the README names make targets the Makefile lacks: {named - targets}"


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.y*ml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    from opct.config import build_config, construct, load_config_file

    data = load_config_file(path)
    kind = data.get("kind")
    if path.name == "audit.yaml":
        from opct.audit.run import AuditConfig

        build_config(AuditConfig, argparse.Namespace(), str(path), data)
    elif kind == "robustness":
        from opct.robustness.runner import load_robustness

        load_robustness(path)
    elif kind == "threats":
        from opct.threats.config import load_threats

        load_threats(path)
    elif len(data) == 1 and next(iter(data)) in ("reasons", "backdoor"):  # a standalone study's block
        import importlib

        study = next(iter(data))
        construct(importlib.import_module(f"opct.robustness.{study}").Config, data[study], prefix=study)
    else:
        from opct.experiment import load_experiment

        load_experiment(path)


def readme_inspect_commands() -> list[list[str]]:
    """The `inspect eval opct/...` lines of the README's code blocks, split as a shell would."""
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", CURRENT, re.DOTALL):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if line.strip().startswith("inspect eval opct/"):
                out.append(shlex.split(line.split("#")[0]))
    return out


def test_the_readmes_inspect_commands_name_real_tasks_and_arguments():
    """Every `inspect eval opct/TASK` line: TASK has an inspect task, each `-T NAME=` is an argument of the tasks,
    and each `-M NAME=` given to `--model opct/local` is one of the provider's model arguments."""
    pytest.importorskip("inspect_ai", reason="inspect_ai is not installed (pip install 'opct[inspect]')")
    import inspect as pyinspect

    from opct.inspect import ADAPTERS, axis_task
    from opct.inspect.provider import _ARGS

    commands = readme_inspect_commands()
    assert len(commands) >= 5
    task_args = set(pyinspect.signature(axis_task).parameters) - {"axis"}
    for argv in commands:
        assert argv[2].removeprefix("opct/") in ADAPTERS, argv
        pairs = [(argv[i], argv[i + 1].split("=", 1)[0]) for i in range(len(argv) - 1) if argv[i] in ("-T", "-M")]
        for opt, name in pairs:
            if opt == "-T":
                assert name in task_args, f"{' '.join(argv)}: -T {name} is no task argument"
            elif argv[argv.index("--model") + 1] == "opct/local":
                assert name in _ARGS, f"{' '.join(argv)}: -M {name} is no opct/local model argument"


def test_python_dash_m_opct_is_the_opct_command():
    """`python -m opct` said "No module named opct.__main__" (found 2026-12-07 evening): where the `opct` script is not
    on PATH, it is the command; its exit status is the command's."""
    import os
    import subprocess
    import sys

    from checkout import pythonpath

    env = {**os.environ, "PYTHONPATH": pythonpath()}
    ok = subprocess.run([sys.executable, "-m", "opct", "--help"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and ok.stdout.startswith("usage: opct "), ok.stderr
    bad = subprocess.run([sys.executable, "-m", "opct", "nosuch"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "invalid choice: 'nosuch'" in bad.stderr
