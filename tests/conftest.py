"""Hermetic tests: no user calibration profile or preset directory leaks into the suite."""

import os
import tempfile

_CONFIG = tempfile.mkdtemp(prefix="scaletrain-test-config-")
os.environ["SCALETRAIN_CONFIG_DIR"] = _CONFIG
