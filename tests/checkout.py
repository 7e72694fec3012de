"""The PYTHONPATH under which a test's subprocess imports this checkout's opct."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=None)
def pythonpath() -> str:
    """PYTHONPATH for a subprocess (`inspect eval`, `opct ...`) that must run this checkout's opct.

    When the installed opct is this checkout (`pip install -e .`, as `make test` does), nothing is added: with the
    checkout on PYTHONPATH, importlib.metadata finds the `opct.egg-info` that `pip install -e` leaves in it (no
    direct_url.json) before the installed dist-info, and inspect_ai, taking opct for a plain module rather than an
    installed package, registers its tasks as `jailbreak` instead of `opct/jailbreak`. Otherwise (a git worktree, an
    opct installed from elsewhere) the checkout goes first."""
    rest = os.environ.get("PYTHONPATH", "")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run([sys.executable, "-c", "import opct; print(opct.__file__)"], cwd=tempfile.gettempdir(),
                           env=env, capture_output=True, text=True)
    if found.returncode == 0 and Path(found.stdout.strip()).resolve().parent == ROOT / "opct":
        return rest
    return os.pathsep.join([str(ROOT), rest]) if rest else str(ROOT)
