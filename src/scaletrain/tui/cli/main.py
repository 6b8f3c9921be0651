"""`scaletrain` entry point: parse (parser.py), dispatch, and turn bad input into one line and exit 2.

Anything else that escapes a command is also one line (exit 1, naming it a bug) unless SCALETRAIN_DEBUG is set,
which shows the traceback; every known bad input is refused where it enters, with exit 2.

Nothing imported at module level may pull in Textual or torch: `scaletrain plan` must answer in well under a
second. The wizard, the trainer and the monitor are imported by the commands that need them.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import io_problem
from scaletrain.engine.units import printable
from scaletrain.tui.cli.parser import build_parser

EXIT_INTERRUPTED = 130
EXIT_UNEXPECTED = 1
DEBUG_ENV = "SCALETRAIN_DEBUG"          # set: an unexpected exception shows its traceback
MAX_ERROR_CHARS = 500                  # an error line, prefix included, fits a few rows; a longer message is cut
ERROR_PREFIX = "scaletrain: error: "


def _run_top_level(args: argparse.Namespace) -> int:
    if args.plain and args.headless:
        raise ScaletrainError("--plain asks the plan's questions on the terminal and --headless replays a preset "
                              "without asking: give one of them")
    if args.detach and not args.headless:
        raise ScaletrainError("--detach starts a headless run in the background: give --headless too (the wizard "
                              "always launches in the background)")
    if args.detach and args.dry_run:
        raise ScaletrainError("--dry-run launches nothing and --detach launches in the background: give one of them")
    if args.headless or args.save_preset:
        from scaletrain.tui.cli.headless import run_headless
        return run_headless(args)
    if args.plain:
        from scaletrain.tui.wizard.plain import run_plain
        return run_plain(args)
    from scaletrain.tui.wizard.app import run_wizard
    return run_wizard(args)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        run = getattr(args, "_run", None)
        code = run(args) if run is not None else _run_top_level(args)
    except ScaletrainError as e:
        _error_line(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        print("scaletrain: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ModuleNotFoundError as e:
        _error_line(f"missing dependency {e.name!r}; install scaletrain[train]")
        return 2
    except BrokenPipeError:
        return 0
    except Exception as e:              # a case no check foresaw: one line, the traceback on request
        answer = io_problem(e)          # the system said no (a full disk, a symlink loop, a long name): an answer
        if answer is not None:
            _error_line(answer)
            return 2
        if os.environ.get(DEBUG_ENV):
            raise
        _error_line(f"unexpected {e.__class__.__name__}: {e} (this is a scaletrain bug; set {DEBUG_ENV}=1 for the "
                    "traceback)")
        return EXIT_UNEXPECTED
    return int(code or 0)


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """A message as one line of at most `limit` characters (line breaks become spaces, control and direction
    characters their escapes, the rest is cut)."""
    flat = printable(" ".join(str(text).split()))
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def _error_line(message: str) -> None:
    try:
        print(ERROR_PREFIX + one_line(message, MAX_ERROR_CHARS - len(ERROR_PREFIX)), file=sys.stderr)
    except (OSError, ValueError):       # stderr closed (a hung-up terminal): the exit code still says it
        pass


if __name__ == "__main__":
    sys.exit(main())
