"""Facts about the machine that need no torch: its CPU's name, its load, and the base environment record.

Kept free of heavy imports so that `inceptionlab loadtest` (a client) records them without loading
torch (~2 s). `environment()` is the one environment record's torch-free base: the load generator
writes it as it is, and `runtime.environment()` extends it with the torch fields (build, device,
threads) for env.json and every bench row, so both carry the same keys for the same facts.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

# Packages whose versions go into every environment record (env.json, bench and load-test rows,
# export sidecars); read from the installed metadata, so none of them is imported.
RECORDED_PACKAGES = ("torch", "torchvision", "numpy", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu",
                     "onnxruntime-migraphx", "openvino", "nncf", "tokenizers", "httpx")


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


def package_versions() -> dict[str, str]:
    """Python's version and those of the RECORDED_PACKAGES that are installed."""
    found = {"python": platform.python_version()}
    for name in RECORDED_PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


# The /proc/cpuinfo flags that decide CPU speed settings (hardware.py): AVX2 only, AVX-512, bf16 units
# (AVX-512 bf16 on Zen 4 and Cooper Lake, AMX on Sapphire Rapids), fp16 units.
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16", "amx_fp16")


def cpu_flags() -> frozenset[str]:
    """Every flag /proc/cpuinfo lists for the first CPU (empty where there is no /proc)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


# Variables that change what a figure means: an ISA cap makes a CPU with bf16 units measure as one
# without (ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 stands in for an AVX2-only CPU), thread
# counts and OpenMP's waiting change throughput under load, and so does the allocator (the heap entry).
SPEED_ENV = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "INCEPTIONLAB_AUTO",
             "LD_PRELOAD", "GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def environment() -> dict[str, Any]:
    """The machine and software a figure was measured on, as far as they are known without torch."""
    flags = cpu_flags()
    return {
        "versions": package_versions(),
        "cpu": cpu_model_name(),
        "cpu_flags": [flag for flag in SPEED_FLAGS if flag in flags],
        "cpu_count": os.cpu_count(),
        "speed_env": {name: os.environ[name] for name in SPEED_ENV if name in os.environ},
        "heap": _heap_setting(),
        "host": platform.node(),
        "load_average": load_average(),
        "argv": list(sys.argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _heap_setting() -> str:
    from inceptionlab.hardware import heap_setting  # hardware.py imports this module

    return heap_setting()


SHARED_MEMORY = "/dev/shm"


def shared_memory_space(path: str = SHARED_MEMORY) -> tuple[int, int] | None:
    """(size, free) of /dev/shm in bytes, where DataLoader workers hand their batches over; None where
    there is none (macOS, Windows)."""
    try:
        stat = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize
