"""A server in a subprocess for the serving benchmarks (serve.py, serve_cpu.py): a free port, waiting
until it answers its readiness probe, and stopping it the way a deployment does (SIGTERM, then drain)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

READY_TIMEOUT_S = 900  # first start exports Inception v3, compiles each batch size, checks reduced precisions


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def checkout_env(src: Path | None) -> dict[str, str] | None:
    """The environment in which `python -m inceptionlab` imports the package at `src` (another checkout's
    src/, for a before/after with one client); None: this process's own environment, unchanged."""
    if src is None:
        return None
    paths = [str(src.resolve()), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}


def wait_until_ready(url: str, process: subprocess.Popen, log_file: Path, what: str = "server") -> None:
    """Until `url` answers 200; a one-line error with the log's tail if the process exits first."""
    deadline = time.perf_counter() + READY_TIMEOUT_S
    with httpx.Client(timeout=2.0) as client:
        while time.perf_counter() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{what} exited ({process.returncode}): {log_file.read_text()[-2000:]}")
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)  # polling a subprocess's readiness: nothing to wait on instead
    raise RuntimeError(f"{what} not ready after {READY_TIMEOUT_S} s; see {log_file}")


def stop_gracefully(process: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM (the server drains accepted requests, then exits); SIGKILL if it has not after `timeout_s`."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
