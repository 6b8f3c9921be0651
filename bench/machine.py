"""What machine a benchmark ran on: recorded next to every result so numbers are never quoted without it."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine() -> dict:
    return {"hostname": socket.gethostname(), "cpu_model": cpu_model(), "cpu_cores": os.cpu_count(),
            "python": platform.python_version(), "platform": platform.platform(),
            "load_average_1m_at_start": os.getloadavg()[0]}   # other work on the box skews every number


def machine_line() -> str:
    m = machine()
    return (f"{m['cpu_model']}, {m['cpu_cores']} cores, {platform.system()} {platform.machine()}, "
            f"Python {m['python']}")
