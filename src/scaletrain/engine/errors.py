"""One exception type for bad input: the CLI turns it into one line and a non-zero exit."""


class ScaletrainError(Exception):
    """A user-facing error: the message says what was wrong and what is accepted."""

    exit_code = 2


# `scaletrain plan` (and the headless path) when the plan does not fit a resource it knows: GPU memory, host RAM or
# disk. Bad input stays exit 2 (ScaletrainError.exit_code).
EXIT_DOES_NOT_FIT = 3
