"""host.keep_freed_memory: freed tensors stay in glibc's heap for reuse, unless the user chose the allocator."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from inceptionlab import host


class FakeLibc:
    def __init__(self, accepts: bool = True):
        self.calls: list[tuple[int, int]] = []
        self.accepts = accepts

    def mallopt(self, option: int, value: int) -> int:
        self.calls.append((option, value))
        return int(self.accepts)


@pytest.mark.parametrize("env,kept", [
    ({}, True),
    ({"MALLOC_MMAP_THRESHOLD_": "65536"}, False),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, False),
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, False),
])
def test_freed_blocks_are_kept_unless_the_user_chose_the_allocator(monkeypatch, env, kept):
    monkeypatch.setattr(host, "_heap", None)
    libc = FakeLibc()
    said = host.keep_freed_memory(env, libc)
    assert (libc.calls == [(host.M_MMAP_THRESHOLD, 1 << 30), (host.M_TRIM_THRESHOLD, 1 << 30)]) == kept
    assert libc.calls or "glibc malloc keeps" not in said
    assert host.heap_setting() == said == host.environment()["heap"]  # recorded with every figure
    assert host.keep_freed_memory({}, libc) == said and len(libc.calls) == (2 if kept else 0)  # once per process


def test_a_refused_threshold_is_reported_not_claimed(monkeypatch, caplog):
    monkeypatch.setattr(host, "_heap", None)
    assert host.keep_freed_memory({}, FakeLibc(accepts=False)) == "glibc malloc defaults (mallopt refused)"
    assert "refused" in caplog.text


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
                    reason="counts page faults of glibc's heap with Linux's getrusage")
def test_a_large_tensor_allocated_again_is_not_faulted_in_again():
    """The real C library: a 64 MiB tensor allocated 30 times in turn faults pages in every time by
    default; with freed blocks kept the heap settles within a few rounds and then faults nothing.
    Rounds that fault are counted, not pages, so huge pages (THP) change nothing."""
    script = """
import resource, sys, torch
from inceptionlab import host
if sys.argv[1] == "keep":
    host.keep_freed_memory({})
faulted = 0
for round in range(30):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(16 << 20).fill_(1)
    faulted += round >= 20 and resource.getrusage(resource.RUSAGE_SELF).ru_minflt > before
print(faulted)
"""
    faulted = {mode: int(subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True,
                                        check=True).stdout) for mode in ("default", "keep")}
    assert faulted["default"] >= 9  # of the last ten rounds
    assert faulted["keep"] <= 1


@pytest.mark.parametrize("command, kept", [("serve", False), ("loadtest", False), ("predict", False),
                                           ("train", True), ("demo", True), ("evaluate", True), ("bench", True)])
def test_freed_blocks_are_kept_only_by_the_commands_measured_with_it(monkeypatch, command, kept):
    """A long-running server keeps glibc's defaults: with the 1 GiB thresholds, every arena would keep up
    to 1 GiB of what a burst of large requests freed, for as long as the server runs."""
    from inceptionlab.cli import app

    calls: list[str] = []
    monkeypatch.setattr(host, "keep_freed_memory", lambda *args, **kwargs: calls.append(command) or "kept")
    with pytest.raises(SystemExit) as exited:
        app.main([command, "--help"])
    assert exited.value.code == 0
    assert calls == ([command] if kept else [])
