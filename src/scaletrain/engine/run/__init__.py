"""The run directory and everything that reads or writes it: plan.json, status.json, configs, scripts, launcher, metrics."""
