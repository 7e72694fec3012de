"""Atomic file writes: write beside the target, then rename, so a reader (or a crash) never sees half a file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterable


def write_atomic(path, chunks: str | Iterable[str]) -> Path:
    """Write `chunks` (a string, or an iterable of strings written in order) to `path` atomically. The file gets the
    usual permissions (0666 less the umask), not mkstemp's private 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for chunk in ([chunks] if isinstance(chunks, str) else chunks):
                f.write(chunk)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json_atomic(path, obj, **dumps) -> Path:
    """`obj` as JSON (indent 1, non-ASCII kept, unless `dumps` says otherwise), newline-terminated, atomically."""
    return write_atomic(path, json.dumps(obj, **{"indent": 1, "ensure_ascii": False, **dumps}) + "\n")
