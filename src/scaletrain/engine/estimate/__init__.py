"""The training setup and the models that predict it: memory, time, calibration from measurement."""
