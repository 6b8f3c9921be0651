"""`scaletrain chat RUN_DIR [--prompt TEXT] [--max-new-tokens N]`: generate with the run's export (trainer/chat.py).

One-shot with --prompt (the generated text on stdout); on a terminal without --prompt, a conversation (an empty
line or Ctrl-D ends it); with stdin piped, each line is one prompt. Torch and transformers load when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from scaletrain.engine.errors import ScaletrainError
from scaletrain.tui.cli.plan_args import stated

DEFAULT_NEW_TOKENS = 64
MAX_NEW_TOKENS = 8192


def configure_chat(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with an export (export/step-N/)")
    p.add_argument("--prompt", metavar="TEXT", help=stated("generate once for TEXT and exit", "ask on the terminal"))
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_NEW_TOKENS, metavar="N",
                   help=stated("tokens generated per answer", str(DEFAULT_NEW_TOKENS)))


def cmd_chat(args: argparse.Namespace) -> int:
    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise ScaletrainError(f"--max-new-tokens must be 1 to {MAX_NEW_TOKENS} (got {args.max_new_tokens})")
    if args.prompt is not None and not args.prompt.strip():
        raise ScaletrainError("--prompt is empty; give some text")
    from scaletrain.trainer.chat import open_chat

    with contextlib.redirect_stdout(sys.stderr):        # library prints are not the answer
        session = open_chat(args.run_dir)
    e = session.export
    print(f"scaletrain: chatting with {e.loadable} (step {e.step}; greedy, {args.max_new_tokens} new tokens)",
          file=sys.stderr)
    if args.prompt is not None:
        print(session.reply(args.prompt, args.max_new_tokens), flush=True)
        return 0
    if not sys.stdin.isatty():
        for line in sys.stdin:
            if line.strip():
                print(session.reply(line.rstrip("\n"), args.max_new_tokens), flush=True)
        return 0
    print("an empty line or Ctrl-D ends the chat", file=sys.stderr)
    while True:
        try:
            prompt = input("you> ")
        except EOFError:
            print()
            return 0
        if not prompt.strip():
            return 0
        print(f"model> {session.reply(prompt, args.max_new_tokens)}", flush=True)
