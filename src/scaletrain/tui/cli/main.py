"""`scaletrain` entry point: parse (parser.py), dispatch, and turn bad input into one line and exit 2.

Nothing imported at module level may pull in Textual or torch: `scaletrain plan` must answer in well under a
second. The wizard, the trainer and the monitor are imported by the commands that need them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from scaletrain.engine.errors import ScaletrainError
from scaletrain.tui.cli.parser import build_parser

EXIT_INTERRUPTED = 130


def _run_top_level(args: argparse.Namespace) -> int:
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
        print(f"scaletrain: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("scaletrain: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ModuleNotFoundError as e:
        print(f"scaletrain: error: missing dependency {e.name!r}; install scaletrain[train]", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
