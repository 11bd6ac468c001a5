"""Facts about the machine that need no torch: its CPU's name, its load, and the base environment record.

Kept free of heavy imports so that `inceptionlab loadtest` (a client) records them without loading
torch (~2 s). `environment()` is the one environment record's torch-free base: the load generator
writes it as it is, and `runtime.environment()` extends it with the torch fields (build, device,
threads) for env.json and every bench row, so both carry the same keys for the same facts.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import socket
import sys
import threading
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Mapping

log = logging.getLogger(__name__)

# Packages whose versions go into every environment record (env.json, bench and load-test rows,
# export sidecars); read from the installed metadata, so none of them is imported.
RECORDED_PACKAGES = ("torch", "torchvision", "numpy", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu",
                     "onnxruntime-migraphx", "openvino", "nncf", "tokenizers", "aiohttp")


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


# The /proc/cpuinfo flags that decide CPU speed settings (inceptionlab.hardware): AVX2 only, AVX-512, bf16 units
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
        "heap": heap_setting(),
        "host": platform.node(),
        "load_average": load_average(),
        "argv": list(sys.argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


# glibc gives every freed block larger than its mmap threshold (at most 32 MiB) back to the kernel,
# and the next allocation of that size faults its pages in again, zero-filled. A 64-image 299 px
# fp32 batch is 68 MB: allocating and filling one took 21.7 ms with the default heap and 2.5 ms with
# freed blocks kept (AMD EPYC, 2 cores, AVX2 cap), and the resident loader's augmentation went from
# 1,290-1,380 to 4,670-4,790 img/s (the same code, measured back to back). PyTorch's CPU tuning guide
# gets the same by preloading jemalloc or tcmalloc; glibc's own mallopt needs nothing installed. A
# user's allocator or glibc malloc settings win.
HEAP_KEEP_BYTES = 1 << 30
USER_HEAP_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_heap: str | None = None
_libc: Any = None


def keep_freed_memory(env: Mapping[str, str] | None = None, libc: Any = None) -> str:
    """Let glibc keep freed blocks up to 1 GiB for reuse instead of unmapping them; says what it did.

    Once per process. Leaves the heap alone where the user set glibc's malloc variables or tunables,
    preloads another allocator, or the C library is not glibc.
    """
    global _heap
    if _heap is not None:
        return _heap
    env = os.environ if env is None else env
    if any(name in env for name in USER_HEAP_SETTINGS) or "glibc.malloc" in env.get("GLIBC_TUNABLES", ""):
        _heap = "glibc malloc as the user set it"
    elif any(name in env.get("LD_PRELOAD", "") for name in ("jemalloc", "tcmalloc", "mimalloc")):
        _heap = "the preloaded allocator"
    elif platform.libc_ver()[0] != "glibc" and libc is None:
        _heap = "the default allocator (not glibc)"
    else:
        _heap = _set_glibc_thresholds(libc)
    return _heap


def c_library() -> Any:
    """The C library this process already runs on (loaded once)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _set_glibc_thresholds(libc: Any) -> str:
    if libc is None:
        libc = c_library()
    if libc.mallopt(M_MMAP_THRESHOLD, HEAP_KEEP_BYTES) and libc.mallopt(M_TRIM_THRESHOLD, HEAP_KEEP_BYTES):
        return f"glibc malloc keeps freed blocks up to {HEAP_KEEP_BYTES >> 20} MiB"
    log.warning("glibc refused the malloc thresholds; large tensors are unmapped when freed (slower)")
    return "glibc malloc defaults (mallopt refused)"


def heap_setting() -> str:
    """What `keep_freed_memory` did in this process, for env.json and result files."""
    return _heap or "the C library's malloc defaults"


SHARED_MEMORY = "/dev/shm"


def shared_memory_space(path: str = SHARED_MEMORY) -> tuple[int, int] | None:
    """(size, free) of /dev/shm in bytes, where DataLoader workers hand their batches over; None where
    there is none (macOS, Windows)."""
    try:
        stat = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize


PR_SET_NAME = 15  # linux/prctl.h
OS_THREAD_NAME_BYTES = 15  # the kernel keeps 16 bytes, the last one the NUL


def port_in_use(host: str, port: int) -> str | None:
    """Why a server cannot listen on host:port (the OS's words), or None when it can: bound with
    SO_REUSEADDR, as uvicorn and gRPC bind, so a port left in TIME_WAIT by a stopped server counts as free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def os_thread_name(name: str) -> bytes:
    """`name` as the kernel can hold it: at most 15 bytes, keeping a pool thread's index (`preprocess_3`,
    `infer-inception_v3_0` -> `infer-incepti_0`), so the threads of one pool stay told apart."""
    raw = name.encode("ascii", "replace")
    if len(raw) <= OS_THREAD_NAME_BYTES:
        return raw
    head, _, index = raw.rpartition(b"_")
    if head and index.isdigit() and len(index) < OS_THREAD_NAME_BYTES - 1:
        return head[:OS_THREAD_NAME_BYTES - len(index) - 1] + b"_" + index
    return raw[:OS_THREAD_NAME_BYTES]


def name_os_thread() -> None:
    """Give the calling thread's Python name to its OS thread (Linux; elsewhere nothing), so `top -H`,
    py-spy and /proc/PID/task/*/comm tell a server's threads apart: Python before 3.14 leaves every
    thread named after the process. A thread pool's `initializer`."""
    if not sys.platform.startswith("linux"):
        return
    try:
        c_library().prctl(PR_SET_NAME, ctypes.c_char_p(os_thread_name(threading.current_thread().name)), 0, 0, 0)
    except (OSError, AttributeError):  # a C library without prctl: names are a convenience
        log.debug("could not name the OS thread", exc_info=True)
