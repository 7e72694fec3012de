"""The `opct` command line. Each verb lives in `opct/commands/<verb>.py` and exposes `register(subparsers)`;
heavy imports (torch, transformers) happen inside the handlers so `opct --help` is instant.

`main` is the boundary between opct and its user. Whatever a command raises that the user can fix — an OpctError,
an OS error (full or read-only disk, a file where a directory belongs), a file that is not UTF-8, JSON nested too
deeply, a YAML parse error — becomes one line `opct: error: PATH: problem` and exit status 1 (`opct.errors.
user_message`); only a bug keeps its traceback. And a command called in-process (`main([...])`) leaves the global
state it changes as it found it: torch's thread count, the random number generators, grad mode, default dtype.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from contextlib import contextmanager

from opct.errors import OpctError, blocking_file, not_a_dir, user_message

# verb -> module under opct.commands; read the list of commands off this dict.
COMMANDS = {
    "organism": "opct.commands.organism",
    "model": "opct.commands.model",
    "pairs": "opct.commands.pairs",
    "demo": "opct.commands.demo",
    "train": "opct.commands.train",
    "eval": "opct.commands.eval",
    "run": "opct.commands.run",
    "report": "opct.commands.report",
    "audit": "opct.commands.audit",
    "mechanism": "opct.commands.mechanism",
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
    _drop_deepspeed_cpu_notice()
    try:
        parser = build_parser()  # imports the axes, and the modules OPCT_AXES names
    except OpctError as e:
        print(f"opct: error: {_one_line(str(e))}", file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from opct.pairs.schema import special_said_once

    try:
        _check_home()
        with _global_state_restored(args.command in TORCH_COMMANDS), special_said_once():
            rc = args.func(args)
    except KeyboardInterrupt:
        print("opct: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - sorted by user_message: the user's problem, or a bug
        message = user_message(e)
        if message is None:
            raise
        _end_progress_bars()  # so the message starts a line of its own
        print(f"opct: error: {_one_line(message)}", file=sys.stderr)
        return 1
    return int(rc or 0)


def _check_home() -> None:
    """$OPCT_HOME (opct's cache: organisms, attackers, backdoored teachers) naming a file, or a path under one: an
    error before any command runs (an organism was built for half a minute, then could not be saved: 2026-12-07)."""
    import os

    home = os.environ.get("OPCT_HOME")
    if home and (blocker := blocking_file(home)):
        raise OpctError(f"OPCT_HOME {home}: {blocker} is {not_a_dir(blocker)}, not a directory; point OPCT_HOME at "
                        f"a directory")


class _DeepSpeedCpuNotice(logging.Filter):
    """DeepSpeed's "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.",
    which transformers' import of DeepSpeed prints to stdout (where a command's output goes) on every machine
    without a GPU once opct[deepspeed] is installed: dropped while torch sees no CUDA device, where it says only
    that this is a CPU machine. Where torch does see one, the notice (DeepSpeed missed it) is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Setting accelerator to CPU."):
            return True
        torch = sys.modules.get("torch")
        return torch is not None and torch.cuda.is_available()


def _drop_deepspeed_cpu_notice() -> None:
    log = logging.getLogger("DeepSpeed")  # the logger DeepSpeed creates on import keeps this filter
    if not any(isinstance(f, _DeepSpeedCpuNotice) for f in log.filters):
        log.addFilter(_DeepSpeedCpuNotice())


def _end_progress_bars() -> None:
    """Close the progress bars a failing command left open (each ends its line)."""
    std = sys.modules.get("tqdm.std")
    for bar in list(getattr(getattr(std, "tqdm", None), "_instances", ())):
        bar.close()


def _one_line(message: str) -> str:
    """A message as one line: a parser's multi-line report (YAML's, with a caret under the column) joined up."""
    lines = [ln.strip() for ln in message.splitlines()]
    return " ".join(ln for ln in lines if ln and set(ln) != {"^"})


# Commands that load torch anyway (so saving its state first costs nothing).
TORCH_COMMANDS = ("organism", "demo", "train", "eval", "run", "audit", "mechanism")


@contextmanager
def _global_state_restored(load_torch: bool):
    """Put back, after the block (also on error), the process-wide state a command changes: torch's intra-op thread
    count (`opct.policy.cpu_threads`, the organism build), the python / numpy / torch RNGs (training seeds them),
    torch's grad mode and default dtype."""
    import random

    if load_torch:
        import torch  # noqa: F401
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")
    saved_random = random.getstate()
    saved_numpy = numpy.random.get_state() if numpy is not None else None
    if torch is not None:
        threads, rng, grad, dtype = (torch.get_num_threads(), torch.get_rng_state(), torch.is_grad_enabled(),
                                     torch.get_default_dtype())
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() \
            else None
    try:
        yield
    finally:
        random.setstate(saved_random)
        if saved_numpy is not None:
            numpy.random.set_state(saved_numpy)
        if torch is not None:
            torch.set_num_threads(threads)
            torch.set_rng_state(rng)
            torch.set_grad_enabled(grad)
            torch.set_default_dtype(dtype)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)


if __name__ == "__main__":
    sys.exit(main())
