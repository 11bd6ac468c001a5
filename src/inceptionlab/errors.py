"""The two kinds of failure: the user's (a one-line fix) and the program's own (a traceback to report).

`UserError` is bad input or set-up: the CLI prints `error: <message>` and exits 2 (or the error's
`exit_code`), never a traceback. Everything else that escapes a command is the program's own failure:
an exporter, a runtime or a library that crashed. The CLI logs its traceback (standard `logging`,
with the cause chained), prints a one-line summary and exits with `INTERNAL_ERROR_EXIT`; with
`--debug` or `INCEPTIONLAB_DEBUG=1` it re-raises instead. `ProgramError` gives such a failure a
summary that says what was being done, with the library's exception kept as its `__cause__`.
"""

# sysexits.h's EX_SOFTWARE ("an internal software error"): apart from 1 (some inputs failed), 2 (a
# UserError), 3 (training diverged) and 130 (interrupted), so a script can tell a bug from a mistake.
INTERNAL_ERROR_EXIT = 70


class UserError(Exception):
    """Bad input or environment. The CLI prints `error: <message>` and exits with `exit_code`."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ProgramError(Exception):
    """The program's own failure, raised `from` the exception that caused it: the CLI logs the whole
    chain's traceback, prints this message as the one-line summary and exits `INTERNAL_ERROR_EXIT`."""


def summary_of(exc: BaseException) -> str:
    """One line for any exception: a ProgramError's message, else `Type: first line of its message`."""
    if isinstance(exc, ProgramError):
        return " ".join(str(exc).split())
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
