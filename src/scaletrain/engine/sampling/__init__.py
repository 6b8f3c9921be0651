"""Live numbers for the monitor: GPUs (NVML or replay), host processes and the run directory, at a fixed cadence."""
