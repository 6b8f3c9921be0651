"""Launching a run directory and keeping it honest: the launcher (`accelerate launch` in its own session), the
process tree, per-rank logs, torchelastic's summary, the run-directory lock, the watchdog that outlives a killed
launcher, status.json, and relaunching with a remedy."""
