"""argparse helpers every command shares: a list flag given once (`OnceList`), a path that is not blank (`path_arg`),
the name given twice in a list (`first_repeat`), a name that becomes one folder (`dir_name_arg`).
(The numeric flag types, `seed_arg` and `positive_arg`, live with the config rules they mirror, in opct.config.)"""

from __future__ import annotations

import argparse
import weakref


class OnceList(argparse.Action):
    """A list flag (nargs * or +) that may be given once: argparse keeps the last of two without a word, so
    `--seeds 0 --seeds 1` ran seed 1 alone (until 2026-12-06)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(self, "_last", lambda: None)() is namespace:  # already set in this parse
            parser.error(f"{option_string}: given twice; give all its values after one {option_string}")
        self._last = weakref.ref(namespace)
        setattr(namespace, self.dest, values)


def first_repeat(values):
    """The first of `values` that an earlier one equals (a name given twice, for an error to name), or None."""
    seen = []
    for v in values:
        if v in seen:
            return v
        seen.append(v)
    return None


def path_arg(text: str) -> str:
    """argparse `type=` for a file or directory argument: a blank one is an error (`--out ' '` wrote a file named by a
    space, `opct report ' '` said ': run directory not found')."""
    from opct.files import blank

    if blank(text):
        raise argparse.ArgumentTypeError(f"is blank ({text!r}); give a path")
    return text


def dir_name_arg(text: str) -> str:
    """argparse `type=` for a name that becomes one folder of a run (`opct demo --name`): `opct.files.is_dir_name`'s
    rule (`--name ''` ran the demo under its default name)."""
    from opct.files import is_dir_name

    if not is_dir_name(text):
        raise argparse.ArgumentTypeError(f"must be a non-empty directory name (got {text!r})")
    return text
