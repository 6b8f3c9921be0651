"""Local devices: what NVML sees, and the planned Hardware it becomes."""
