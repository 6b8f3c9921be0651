"""`python -m scaletrain.measure.probe KIND [ARGS]`: the one entry point the engine runs (engine/probes.py).

    trace [--serve]           a model config's structure, regimes and LoRA counts (measure/trace.py)
    data-profile --data …     your data read, tokenized and blocked as the trainer will (measure/data_profile.py)
    tokenizer-check SOURCE    the trainer's tokenizer of SOURCE loads and really tokenizes (trainer/tokenizer_check.py)

Each kind is imported when asked for, so a trace server does not load the data reader and the reverse.
"""

from __future__ import annotations

import sys

from scaletrain.engine.probes import PROBES


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    kind, rest = (argv[0], argv[1:]) if argv else ("", [])
    if kind == "trace":
        from scaletrain.engine.startup import TRANSFORMERS_STACK, import_stack
        from scaletrain.measure import trace

        import_stack(*TRANSFORMERS_STACK)     # not peft: a full fine-tuning plan's trace never imports it
        return trace.main(rest)
    if kind == "data-profile":
        from scaletrain.measure import data_profile
        return data_profile.main(rest)
    if kind == "tokenizer-check":
        from scaletrain.trainer import tokenizer_check
        return tokenizer_check.main(rest)
    print(f"python -m scaletrain.measure.probe: give one of {', '.join(PROBES)} (got {kind or 'nothing'!r})",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
