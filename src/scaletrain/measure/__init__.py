"""The measuring room: what checks the memory and time model against the real thing, apart from the trainer.

A floor above the trainer (it builds models, data and optimizers as the trainer does) and below the front ends:
the profiler's memory timeline, the saved-tensor recorder, one measured training step and loop, the trace and
data-profile probes the engine runs as one child process (`python -m scaletrain.measure.probe`, the only entry
point the engine names: engine/probes.py), and `scaletrain validate`'s short real runs. torch is imported inside
functions.
"""
