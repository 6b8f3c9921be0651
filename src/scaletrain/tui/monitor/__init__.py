"""The full-screen monitor: per-GPU panels, job progress, log tails and the doctor's fixes."""
