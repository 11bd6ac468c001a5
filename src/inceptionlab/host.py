"""Facts about the machine that need no torch: its CPU's name and its load.

Kept free of heavy imports so that `inceptionlab loadtest` (a client) records them without loading
torch (~2 s); `runtime.environment()` uses the same functions.
"""

from __future__ import annotations

import os
import platform


def cpu_model_name() -> str:
    # platform.processor() is empty on most Linux systems; /proc/cpuinfo has the marketing name.
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none): figures taken under load say so."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None
