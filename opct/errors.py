"""Errors a user can cause and fix. The CLI prints them as one line, without a traceback."""


class OpctError(Exception):
    """A problem with the user's input or environment (bad file, bad flag, missing model).

    The message must say what is wrong and where (`file:line: field: problem` for data files).
    """


class DataError(OpctError):
    """A malformed record in a data file. `str()` is `file:line: field: problem`."""

    def __init__(self, path, line, field, problem):
        self.path, self.line, self.field, self.problem = str(path), line, field, problem
        super().__init__(f"{self.path}:{line}: {field}: {problem}")
