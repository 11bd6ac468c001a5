"""CPU threads: the CPUs this process may use (affinity, cgroup quota) and the governor that gives
threads up while other processes keep CPUs busy."""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping


def usable_cpus(affinity: Callable[[], set[int]] | None = None, quota: Callable[[], float | None] | None = None) -> int:
    """CPUs this process may actually use: its affinity mask, capped by a cgroup CPU quota."""
    try:
        count = len((affinity or (lambda: os.sched_getaffinity(0)))())
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        count = os.cpu_count() or 1
    limit = (quota or cgroup_cpu_quota)()
    if limit is not None:
        count = min(count, max(1, math.ceil(limit)))
    return max(1, count)


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by the cgroup (v2 cpu.max, or v1 cfs quota/period); None when unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


@dataclass(frozen=True)
class CpuSample:
    """CPU-seconds spent so far: by every process on our CPUs (`busy`) and by this process tree (`own`)."""

    busy: float
    own: float
    wall: float


def cpu_sample(cpus: Iterable[int] | None = None, stat: Path = Path("/proc/stat")) -> CpuSample | None:
    """A snapshot of /proc/stat's busy time on `cpus` (default: our affinity) and our own CPU time.

    Busy is user + nice + system + irq + softirq + steal (a hypervisor's steal is as lost to us as
    another process's time). Own is this process's threads (process_time) plus its live children
    (DataLoader workers), from /proc. None where /proc/stat does not exist.
    """
    try:
        allowed = {f"cpu{n}" for n in (cpus if cpus is not None else os.sched_getaffinity(0))}
        lines = stat.read_text().splitlines()
    except (OSError, AttributeError):
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = 0
    for line in lines:
        fields = line.split()
        if fields and fields[0] in allowed:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
            busy += user + nice + system + irq + softirq + steal
    return CpuSample(busy / tick, time.process_time() + _children_cpu_seconds(tick), time.monotonic())


def _children_cpu_seconds(tick: int) -> float:
    total = 0.0
    for children in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            for pid in children.read_text().split():
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def others_cpu_seconds(before: CpuSample | None, after: CpuSample | None) -> tuple[float, float] | None:
    """(CPU-seconds other processes used, wall seconds) between two samples of `cpu_sample`; None if unknown."""
    if before is None or after is None:
        return None
    used = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, used), after.wall - before.wall


def others_cpus(before: CpuSample | None, after: CpuSample | None, min_wall_s: float = 0.05) -> float | None:
    """CPUs' worth of time other processes used between two samples (None: unknown, or a window under
    `min_wall_s`, which /proc/stat's 10 ms ticks cannot resolve)."""
    seconds = others_cpu_seconds(before, after)
    if seconds is None or seconds[1] < min_wall_s:
        return None
    return seconds[0] / seconds[1]


class ThreadGovernor:
    """torch's CPU thread count follows the CPUs that other processes leave free.

    OpenMP splits every operator evenly over its threads and waits for the slowest: a thread that
    shares its core with another busy process makes each operator wait for that process's time slice.
    On 2 cores with one busy process beside it, the demo's epoch fell from 72 to 14-16 img/s with 2
    threads (AMD EPYC, 2026-11-24); one thread on the free core loses only the second core's share.
    So: threads = CPUs we may use minus what others used since the last check (rounded), at least 1,
    re-checked before each training step but at most every `min_interval_s`: checking only at log
    intervals left the demo's first epoch at 35 img/s for its first 20 steps beside a busy process,
    against 71 once it had switched (AMD EPYC, 2 cores, 2026-11-25). A user's OMP_NUM_THREADS or
    train.threads fixes the count instead.
    """

    def __init__(self, limit: int, *, sample: Callable[[], CpuSample | None] = cpu_sample,
                 set_threads: Callable[[int], None] | None = None, say: Callable[[str], None] | None = None,
                 fixed: bool = False, min_interval_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        import torch  # start-up time: the package is imported before torch

        self.limit, self.fixed, self.min_interval_s, self.clock = max(1, limit), fixed, min_interval_s, clock
        self.sampled_at = clock()
        self.sample, self.say = sample, say
        self.set_threads = set_threads or torch.set_num_threads
        self.threads = self.limit
        self.set_threads(self.threads)
        self.last = None if fixed else sample()
        self.changes = 0

    def describe(self) -> str:
        how = "fixed" if self.fixed else "fewer while other processes keep CPUs busy"
        return f"threads: {self.threads} ({how})"

    def others(self) -> float | None:
        """CPUs' worth of time other processes used since the last call (None: unknown)."""
        now = self.sample()
        before, self.last = self.last, now
        return others_cpus(before, now)

    def update(self, *_: Any) -> int:
        """Re-size torch's pool for the load seen since the last call; returns the thread count."""
        if self.fixed:
            return self.threads
        if self.clock() - self.sampled_at < self.min_interval_s:
            return self.threads  # a window this short says little, and /proc reads cost time
        self.sampled_at = self.clock()
        others = self.others()
        if others is None:
            return self.threads
        target = min(self.limit, max(1, round(self.limit - others)))
        if target != self.threads:
            self.changes += 1
            if self.say is not None:
                self.say(f"threads: {self.threads} -> {target} (other processes used {others:.1f} of "
                         f"{self.limit} CPUs since the last check)")
            self.threads = target
            self.set_threads(target)
        return self.threads


def thread_limit(requested: int | None, env: Mapping[str, str] | None = None) -> tuple[int, bool]:
    """(threads, fixed): train.threads or OMP_NUM_THREADS fix the count; else the usable CPUs, governed."""
    env = os.environ if env is None else env
    if requested:
        return requested, True
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp), True
    return usable_cpus(), False
