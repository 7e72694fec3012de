"""Errors a user can cause and fix. The CLI prints them as one line, without a traceback."""


class OpctError(Exception):
    """A problem with the user's input or environment (bad file, bad flag, missing model).

    The message must say what is wrong and where (`file:line: field: problem` for data files).
    """


class DataError(OpctError):
    """A malformed record in a data file. `str()` is `file:line: field: problem`, or `file: problem` for the file as a
    whole (line 0, field `<file>`: missing, empty)."""

    def __init__(self, path, line, field, problem):
        self.path, self.line, self.field, self.problem = str(path), line, field, problem
        whole = not line and field == "<file>"
        super().__init__(f"{self.path}: {problem}" if whole else f"{self.path}:{line}: {field}: {problem}")


def first_line(exc: BaseException, default: str | None = None) -> str:
    """The first non-blank line of `exc`'s message, stripped: what a one-line error quotes of a library's exception.

    An exception with no message (or only blank lines, or a `__str__` that itself fails) gives `default`, or the
    exception's type name when no default is given, so the quote is never empty and never raises.
    """
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not replace the error being reported
        text = ""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()),
                type(exc).__name__ if default is None else default)


# ------------------------------------------------------------------------------------------------ at the CLI boundary
# Operating-system and decoding errors are the user's to fix too (a full disk, a directory where a file belongs, a
# file that is not UTF-8), but they surface as OSError / UnicodeDecodeError / RecursionError from deep inside a
# library. `user_message` turns them into `PATH: problem`, naming the file from the exception or, failing that, from
# the innermost file object open in the traceback's frames.

_OS_PROBLEMS = {
    "ENOSPC": "no space left on device", "EDQUOT": "disk quota exceeded", "EROFS": "read-only file system",
    "EACCES": "permission denied", "EPERM": "operation not permitted", "EISDIR": "is a directory, expected a file",
    "ENOTDIR": "not a directory", "EEXIST": "already exists", "ENOENT": "no such file or directory",
    "EFBIG": "file too large", "ENAMETOOLONG": "file name too long", "EMFILE": "too many open files",
    "ENOTEMPTY": "directory not empty", "EIO": "input/output error", "ELOOP": "too many levels of symbolic links",
}


def os_problem(e: OSError) -> str:
    """What went wrong, in words, without the path."""
    import errno

    name = errno.errorcode.get(e.errno or -1, "")
    return _OS_PROBLEMS.get(name) or e.strerror or str(e) or type(e).__name__


def blocking_file(path: str) -> str | None:
    """The first part of `path` that exists and is not a directory (a file where a directory is needed)."""
    import os

    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        p = os.sep.join(parts[:i])
        if os.path.lexists(p) and not os.path.isdir(p):
            return path if p == os.path.abspath(path) else p
    return None


def not_a_dir(path) -> str:
    """What `path`, which is there and is not a directory, is: "a file", "a broken symbolic link" (a dangling link
    was said to be a file) or "a special file"."""
    import os

    if os.path.islink(path) and not os.path.exists(path):
        return "a broken symbolic link"
    return "a file" if os.path.isfile(path) else "a special file"


def _file_in_traceback(exc: BaseException) -> str | None:
    """The name of the innermost file object held by a frame of `exc`'s traceback (the file being read)."""
    import io

    found, tb = None, exc.__traceback__
    while tb is not None:
        for v in list(tb.tb_frame.f_locals.values()):
            if isinstance(v, io.IOBase) and isinstance(getattr(v, "name", None), str):
                found = v.name
        tb = tb.tb_next
    return found


def user_message(exc: BaseException) -> str | None:
    """`PATH: problem` for an error the user can fix, or None for a bug (which keeps its traceback)."""
    import json

    if isinstance(exc, OpctError):
        return str(exc)
    if isinstance(exc, OSError):
        import errno

        path = exc.filename if exc.filename is not None else _file_in_traceback(exc)
        if path is None:
            return os_problem(exc)
        path = str(path)
        if exc.errno in (errno.EEXIST, errno.ENOTDIR) and (blocker := blocking_file(path)):
            return f"{blocker}: is {not_a_dir(blocker)}, not a directory" + \
                (f" (needed for {path})" if blocker != path else "")
        where = f"{path} -> {exc.filename2}" if exc.filename2 is not None else path
        return f"{where}: {os_problem(exc)}"
    path = _file_in_traceback(exc)
    prefix = f"{path}: " if path else ""
    if isinstance(exc, UnicodeDecodeError):
        return f"{prefix}not UTF-8 text (byte {exc.start}: {exc.reason})"
    if isinstance(exc, RecursionError):
        return f"{prefix or 'input: '}nested too deeply to read"
    if isinstance(exc, json.JSONDecodeError):
        return f"{prefix}not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    if type(exc).__module__.split(".")[0] == "yaml" and type(exc).__name__.endswith("Error"):
        mark = getattr(exc, "problem_mark", None)
        name = getattr(mark, "name", None)
        if not prefix and name and not name.startswith("<"):
            prefix = f"{name}: "
        problem = getattr(exc, "problem", None) or str(exc) or type(exc).__name__
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{prefix}not valid YAML ({problem}{where})"
    return None
