"""The one exception type users see: a one-line message that names the file and the fix."""


class UserError(Exception):
    """Bad input or environment. The CLI prints `error: <message>` and exits with `exit_code`."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
