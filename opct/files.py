"""Files opct writes and reads, made safe against crashes, full disks and concurrent runs.

  write_atomic / write_json_atomic   write beside the target, fsync, then rename: a reader (or a crash, or a full
                                     disk) never sees half a file, and the previous file stays as it was
  append_jsonl                       append one JSON record as one line, first repairing a torn last line (one a
                                     kill cut short): a complete record missing its newline gets one, a fragment
                                     is cut off, so the next record is never glued onto it
  read_appended_jsonl                read a file written by append_jsonl, leaving out a torn last line
  read_text / read_json              read a file, turning "not UTF-8", "is a directory", "nested too deeply" and
                                     the like into an OpctError that names the file (a named pipe or a device,
                                     which would block or never end, is refused before it is opened)
  dir_there                          whether a directory a report reads is there; a file in its place is an error
  dir_lock                           an exclusive lock on a run directory (fcntl.flock on DIR/.opct.lock), so a
                                     second process writing the same run is refused; the kernel releases it when
                                     the holder dies, so a killed run leaves no stale lock
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
import unicodedata
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

from opct.errors import DataError, OpctError, not_a_dir, os_problem

try:
    import fcntl
except ImportError:  # not POSIX: no locking
    fcntl = None

LOCK_NAME = ".opct.lock"


def write_atomic(path, chunks: str | Iterable[str]) -> Path:
    """Write `chunks` (a string, or an iterable of strings written in order) to `path` atomically. The file gets the
    usual permissions (0666 less the umask), not mkstemp's private 0600. An OSError (full or read-only disk) leaves
    no temporary file behind and is raised naming `path`, not the temporary file."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():  # a device, a FIFO: never replace one
        raise OpctError(f"{path}: not a regular file; give a file path to write")
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for chunk in ([chunks] if isinstance(chunks, str) else chunks):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())  # a full disk shows here at the latest, before the rename
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        ours = e.filename is None or e.filename == tmp or (
            os.path.dirname(str(e.filename)) == str(path.parent) and
            os.path.basename(str(e.filename)).startswith(f".{path.name}.") and str(e.filename).endswith(".tmp"))
        if ours:  # the temporary file is ours, not the user's: name the target
            raise type(e)(e.errno, e.strerror, str(path)) from e
        raise
    except BaseException:
        _remove(tmp)
        raise
    return path


def is_dir_name(name) -> bool:
    """Whether `name` is one directory inside its parent (an experiment's, a study's or an arm's folder): a non-empty
    string without '/' or a control character (NUL; a newline made a folder no listing shows as one line) that is
    not '.' or '..' (an arm '..' wrote its cells outside the experiment)."""
    return isinstance(name, str) and bool(name) and "/" not in name and name not in (".", "..") and \
        not any(ord(c) < 32 or ord(c) == 127 for c in name)


def dir_there(path, root=None) -> bool:
    """Whether the directory `path` (a run's cell, its eval) is there; False when nothing is. Something else there
    (a file where a report reads a directory, a broken symbolic link), or at a folder between `root` and `path`, is an
    OpctError `PATH: is a file, expected a directory` (or `is a broken symbolic link`, `is a special file`): a report
    read such a cell as "not started" and said nothing of the file."""
    path = Path(path)
    below = [] if root is None else [p for p in reversed(path.parents) if Path(root) in p.parents]
    for p in (*below, path):
        if not os.path.lexists(p):
            return False
        if not p.is_dir():
            raise OpctError(f"{p}: is {not_a_dir(p)}, expected a directory")
    return True


def check_writable(path) -> None:
    """Raise the error that `write_atomic(path, ...)` would meet (a directory at `path`, a file where a directory
    belongs, no permission, a read-only disk), naming `path`: a command checks its outputs with this before the work
    whose results it writes there. Missing parent directories are made, as `write_atomic` makes them."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if path.exists() and not path.is_file():
        raise OpctError(f"{path}: not a regular file; give a file path to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise type(e)(e.errno, e.strerror, str(path)) from e
    os.close(fd)
    os.unlink(tmp)


def _remove(tmp) -> None:
    if tmp is not None and os.path.exists(tmp):
        os.unlink(tmp)


def write_json_atomic(path, obj, **dumps) -> Path:
    """`obj` as JSON (indent 1, non-ASCII kept, unless `dumps` says otherwise), newline-terminated, atomically."""
    return write_atomic(path, json.dumps(obj, **{"indent": 1, "ensure_ascii": False, **dumps}) + "\n")


# ------------------------------------------------------------------------------------------------ appended JSONL

def _repair_torn_tail(f) -> None:
    """`f`: the file opened "a+b". If its last line lacks a newline, end it (when it is a whole JSON value) or cut it
    off (a fragment)."""
    size = f.seek(0, os.SEEK_END)
    if size == 0:
        return
    f.seek(size - 1)
    if f.read(1) == b"\n":
        return
    start = size
    while start > 0:  # find the start of the last line, reading backwards
        step = min(start, 65536)
        f.seek(start - step)
        block = f.read(step)
        cut = block.rfind(b"\n")
        if cut >= 0:
            start = start - step + cut + 1
            break
        start -= step
    f.seek(start)
    try:
        json.loads(f.read().decode("utf-8"))
    except (ValueError, RecursionError):  # a fragment (UnicodeDecodeError is a ValueError)
        f.truncate(start)
    else:
        f.write(b"\n")


def append_jsonl(path, record) -> None:
    """Append `record` to the JSONL file `path` as one line, in one write (after repairing a torn last line)."""
    line = (json.dumps(record) + "\n").encode("utf-8")
    with open(path, "a+b") as f:
        _repair_torn_tail(f)
        f.write(line)
        f.flush()


def read_appended_jsonl(path) -> list[tuple[int, object]]:
    """(line number, value) for every non-blank line of a file written by `append_jsonl`. A last line without its
    newline that is not valid JSON (torn by a kill) is left out; any other malformed line is a DataError naming the
    file and line."""
    text = read_text(path)
    lines = text.split("\n")
    out = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append((n, strict_loads(line)))
        except JSONProblem as e:
            raise DataError(path, n, e.field, e.problem) from None
        except (json.JSONDecodeError, RecursionError) as e:
            if n == len(lines):  # the last line, with no newline after it: torn
                break
            problem = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
            raise DataError(path, n, "<json>", f"malformed JSON ({problem})") from None
    return out


# ------------------------------------------------------------------------------------------------ reading

class JSONProblem(ValueError):
    """A value that parses but cannot be taken: `field` (a key's path, e.g. `messages[0].content`) and `problem`."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field or "<json>", problem
        super().__init__(f"{self.field}: {problem}")


def _unique_keys(pairs: list) -> dict:
    """json's `object_pairs_hook`: a key set twice in one object is a JSONProblem (json keeps the last silently)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise JSONProblem(k, "set twice in one object (JSON keeps only the last)")
        out[k] = v
    return out


def check_unicode(value, where: str = ""):
    """`value` (parsed JSON or YAML), after checking that every string in it, keys included, is valid Unicode: an
    escape such as "\\ud800" parses to a lone surrogate, which passes every check and then fails where the text is
    written or tokenized. A JSONProblem names the field."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise JSONProblem(where, f"not valid Unicode (a lone surrogate, {value[e.start]!a} at character "
                                     f"{e.start})") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            check_unicode(k, where or "<key>")
            check_unicode(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_unicode(v, f"{where}[{i}]")
    return value


def blank(text: str) -> bool:
    """Whether `text` shows nothing: only whitespace, control characters and invisible format characters (a
    zero-width space, a word joiner, a byte-order mark), which `str.strip` keeps (a jailbreak request made of
    zero-width spaces was accepted as a request)."""
    return all(c.isspace() or unicodedata.category(c) in ("Cc", "Cf") for c in text)


def id_problem(text: str) -> str | None:
    """What makes `text`, as a pair's or item's id, read like another id (ids that differed by a zero-width space,
    a trailing space or an accent's composition counted as two pairs), or None."""
    for i, c in enumerate(text):
        if unicodedata.category(c) in ("Cc", "Cf"):
            return f"holds a control or invisible character (U+{ord(c):04X} at character {i})"
        if c.isspace() and (c != " " or i in (0, len(text) - 1) or text[i + 1] == " "):
            return f"holds a space at either end, two in a row or one other than U+0020 (at character {i})"
    if unicodedata.normalize("NFC", text) != text:
        return "is not in Unicode's composed form (NFC), so it reads like another id that is"
    return None


def strict_loads(text: str, **kw):
    """json.loads for files people write: a key set twice in one object and a string that is not valid Unicode
    are JSONProblems (ValueErrors) naming the key or field; `kw` go to json.loads."""
    return check_unicode(json.loads(text, object_pairs_hook=_unique_keys, **kw))


_SPECIAL = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
            (stat.S_ISSOCK, "a socket"))


def check_regular(path) -> None:
    """An OpctError naming `path` when it is a named pipe, a device or a socket: opening one blocks until another
    process writes to it (a FIFO) or reads without end (/dev/zero), and a run's inputs are read more than once
    (fingerprinted, then read). A config, read once, takes a pipe (`opct.config_file`). A missing path and a directory
    are left to the reader, which names them."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    for test, what in _SPECIAL:
        if test(mode):
            raise OpctError(f"{path}: is {what}, not a regular file; give a file (copy what it holds into one)")


def read_text(path) -> str:
    """The UTF-8 text of `path` (a leading byte-order mark dropped); any problem reading it is an OpctError naming
    the file."""
    check_regular(path)
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise OpctError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise OpctError(f"{path}: {os_problem(e)}") from None


def read_json(path, what: str = "<json>", strict: bool = True):
    """The JSON value in `path`; malformed JSON is a DataError (`file:line: what: problem`), and so are (`strict`,
    see `strict_loads`) a key set twice and a lone surrogate. Not `strict`: files other programs write and read as
    json does (a model's config.json)."""
    text = read_text(path)
    try:
        return strict_loads(text) if strict else json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(path, e.lineno, what, f"not valid JSON: {e.msg} (column {e.colno})") from None
    except JSONProblem as e:
        raise DataError(path, 0, e.field, e.problem) from None
    except RecursionError:
        raise DataError(path, 0, what, "nested too deeply to read") from None


def sha256(path) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB blocks."""
    check_regular(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


# Files up to this size are fingerprinted whole (`fingerprint`); larger ones by blocks spread over the file.
FINGERPRINT_WHOLE = 64 << 20
_BLOCKS, _BLOCK = 64, 64 << 10


def fingerprint(path) -> str:
    """A SHA-256 that tells two versions of a (weights) file apart without reading gigabytes: the file's whole bytes
    up to FINGERPRINT_WHOLE; past it its size, first and last MiB and 64 blocks of 64 KiB spread evenly between
    (about 6 MiB read whatever the size). Retraining or replacing a checkpoint changes nearly every block, so that is
    caught; an edit to a few bytes in between may not be (`sha256` for that)."""
    size = Path(path).stat().st_size
    if size <= FINGERPRINT_WHOLE:
        return sha256(path)
    h = hashlib.sha256(f"{size}:".encode())
    with open(path, "rb") as f:
        offsets = [0, *((size - (1 << 20)) * i // (_BLOCKS + 1) for i in range(1, _BLOCKS + 1)), size - (1 << 20)]
        for i, offset in enumerate(offsets):
            f.seek(offset)
            h.update(f.read(1 << 20 if i in (0, len(offsets) - 1) else _BLOCK))
    return "blocks:" + h.hexdigest()


# ------------------------------------------------------------------------------------------------ locks

_held: dict[str, int] = {}  # lock files this process holds -> their descriptor (a nested lock is a no-op)


# The file each command keeps at the top of its directory -> (its kind, what it is): a directory holding another
# kind's is refused (`dir_lock`'s `kind`), so two commands' files never mix in one directory.
RUN_MARKERS = {
    "experiment.json": ("experiment", "an experiment (`opct run`)"),
    "run.json": ("eval", "an eval run (`opct eval`)"),
    "inputs.json": ("train", "a training run (`opct train`)"),
    "splits.json": ("audit", "an audit (`opct audit`)"),
    "study.json": ("robustness", "a robustness study (`opct run FILE`, kind: robustness)"),
    "threats.json": ("threats", "a cross-threat run (`opct run FILE`, kind: threats)"),
}


def check_run_kind(directory, kind: str) -> None:
    """An OpctError when `directory` holds another command's run (`RUN_MARKERS`): `opct run` went on into an eval's
    --out, `opct eval` into an experiment or a training run, and `opct audit` took a training run's config.json for
    an audit's with other settings."""
    d = Path(directory)
    for name, (k, what) in RUN_MARKERS.items():
        if k != kind and (d / name).exists():
            raise OpctError(f"{d}: holds {what} ({name}), not {_A_KIND.get(kind, kind)}; choose another directory")


_A_KIND = {k: what.split(" (")[0] for k, what in RUN_MARKERS.values()}


@contextmanager
def dir_lock(directory, what: str = "run directory", kind: str | None = None, instead: str = "write elsewhere"):
    """Hold an exclusive lock on `directory` (created if missing) for the duration of the block. With `kind` (a
    kind of `RUN_MARKERS`), a directory that holds another command's run is refused first, before the lock file is
    written into it.

    Another process holding it makes this an OpctError naming the directory, that process's pid and what to do
    `instead`. The lock is an flock on DIR/.opct.lock, which the kernel drops when its holder exits, however it exits
    (SIGKILL too), so there is never a stale lock to clean up. The file stays (deleting it would let two processes
    lock two different files); it holds the last holder's pid. One this process already locked is locked for free."""
    d = Path(directory)
    if kind is not None:
        check_run_kind(d, kind)
    d.mkdir(parents=True, exist_ok=True)
    lock_path = str((d / LOCK_NAME).resolve())
    if fcntl is None or lock_path in _held:
        yield d
        return
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise OpctError(f"{d}: {what} in use by another opct process (pid {pid}); wait for it to finish"
                            + (f", or {instead}" if instead else "")) from None
        except OSError as e:  # a file system without locks: go on unlocked
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        except OSError as e:  # a full disk: name the file
            raise type(e)(e.errno, e.strerror, str(d / LOCK_NAME)) from e
        _held[lock_path] = fd
        try:
            yield d
        finally:
            del _held[lock_path]
    finally:
        os.close(fd)  # releases the flock
