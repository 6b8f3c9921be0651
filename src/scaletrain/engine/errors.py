"""One exception type for bad input: the CLI turns it into one line and a non-zero exit."""


class ScaletrainError(Exception):
    """A user-facing error: the message says what was wrong and what is accepted."""

    exit_code = 2
