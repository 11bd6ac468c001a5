"""benchmarks/serve_cpu.py's CPU by thread: what it reads from /proc and how it groups a pool's threads."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc/PID/task")


@pytest.fixture
def serve_cpu(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # its sibling modules (_results, _servers)
    import serve_cpu

    return serve_cpu


def test_a_pools_threads_are_one_group_and_the_main_thread_is_the_event_loop(serve_cpu):
    before = {1: ("python", 1.0), 2: ("preprocess_0", 0.5), 3: ("preprocess_1", 0.0), 4: ("infer-model_0", 2.0)}
    after = {1: ("python", 1.2), 2: ("preprocess_0", 0.8), 3: ("preprocess_1", 0.1), 4: ("infer-model_0", 2.0),
             5: ("python", 0.4)}  # a thread born in the window counts from zero; an idle one is left out
    assert serve_cpu.thread_groups(1, before, after, requests=100) == {
        "preprocess": 4.0, "python": 4.0, "main (event loop)": 2.0}


def test_a_named_threads_cpu_is_read_from_proc_under_its_name(serve_cpu):
    from inceptionlab.host import name_os_thread

    done, release = threading.Event(), threading.Event()

    def burn() -> None:
        name_os_thread()
        end = time.thread_time() + 0.3  # this thread's own CPU clock: 0.3 s of work, however loaded the machine
        while time.thread_time() < end:
            sum(range(1000))
        done.set()
        release.wait(timeout=60)  # alive until read: /proc forgets a thread once it ends

    before = serve_cpu.thread_cpu_seconds(os.getpid())
    worker = threading.Thread(target=burn, name="burner_0")
    worker.start()
    assert done.wait(timeout=60)
    after = serve_cpu.thread_cpu_seconds(os.getpid())
    release.set()
    worker.join(timeout=60)
    groups = serve_cpu.thread_groups(os.getpid(), before, after, requests=1)
    assert groups["burner"] >= 250  # ms: the 300 its loop spent, read in the kernel's 10 ms ticks
