"""The `opct` command line. Each verb lives in `opct/commands/<verb>.py` and exposes `register(subparsers)`;
heavy imports (torch, transformers) happen inside the handlers so `opct --help` is instant."""

from __future__ import annotations

import argparse
import importlib
import sys

from opct.errors import OpctError

# verb -> module under opct.commands; read the list of commands off this dict.
COMMANDS = {
    "organism": "opct.commands.organism",
    "pairs": "opct.commands.pairs",
    "demo": "opct.commands.demo",
    "train": "opct.commands.train",
    "eval": "opct.commands.eval",
    "run": "opct.commands.run",
    "report": "opct.commands.report",
    "audit": "opct.commands.audit",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opct", description="On-Policy Consistency Training for language models.")
    from opct import __version__

    parser.add_argument("--version", action="version", version=f"opct {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        importlib.import_module(module).register(sub)
    return parser


def main(argv=None) -> int:
    try:
        parser = build_parser()  # imports the axes, and the modules OPCT_AXES names
    except OpctError as e:
        print(f"opct: error: {e}", file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except OpctError as e:
        print(f"opct: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("opct: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
