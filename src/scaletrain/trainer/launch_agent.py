"""`python -m scaletrain.trainer.launch_agent ARGS`: `accelerate launch ARGS`, with Python's garbage collector paused
while accelerate and torch load, and what they loaded frozen out of its sight after (engine/startup.py).

Why: the launch's own process (accelerate's command line and torch's elastic agent in it) loads torch before any
rank can start, and ends after every rank has, so its start and its exit are on every launch's path. `python -c`
importing accelerate's launcher and torch's elastic runner took 1.25 s of one core, start to exit; with the
collector paused and the objects frozen 0.89 s: the import runs no collections, and the exit no final collection
over torch's objects (2026-12-02, this 2-core VM, runs alternated). Everything else is accelerate's own, as
`accelerate launch` runs it: its argument parser, its config file, its errors and exit codes.
"""

from __future__ import annotations

from scaletrain.engine.startup import collector_paused


def main() -> None:
    with collector_paused():
        from accelerate.commands.launch import main as accelerate_launch
        import torch.distributed.run  # noqa: F401  (the elastic agent accelerate runs, loaded with the rest)
    accelerate_launch()


if __name__ == "__main__":
    main()
