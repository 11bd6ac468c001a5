"""A loaded `inceptionlab serve` does no full garbage collection over what start-up allocated.

The models and libraries a server loads are several hundred thousand tracked objects; one
generation-2 collection over them stopped the event loop for ~200 ms in a loaded window (AMD EPYC,
2 cores, the demo model). The server moves them out of the collector's reach once it is ready.
The server runs in a subprocess (freezing is process-wide), with a `gc.callbacks` probe installed
before anything is imported; the probe's record is compared with the window in which this test
offered load. Counts of collections, never a time threshold.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from serve_helpers import train_tiny_run

# The server process: a gc.callbacks probe first, then `inceptionlab serve` as the CLI runs it; it
# prints when uvicorn listens (and on which port), and the probe's record when it exits.
SERVER = r"""
import gc, json, sys, time

full = []  # (started, seconds) of every generation-2 collection, on the system-wide monotonic clock
def probe(phase, info):
    if info["generation"] != 2:
        return
    if phase == "start":
        probe.started = time.monotonic()
    else:
        full.append((probe.started, time.monotonic() - probe.started))
gc.callbacks.append(probe)

from inceptionlab.serve import server

startup = server.DrainingServer.startup
async def announce(self, sockets=None):
    await startup(self, sockets)
    port = self.servers[0].sockets[0].getsockname()[1]
    print("LISTENING", port, gc.get_freeze_count(), len(gc.get_objects()), flush=True)
server.DrainingServer.startup = announce

from inceptionlab.cli.app import main
try:
    main(sys.argv[1:])
finally:
    print("FULL", json.dumps(full), flush=True)
"""

REQUESTS = 600
CLIENTS = 8


def _read_until(process: subprocess.Popen, prefix: str) -> str:
    """The rest of the first stdout line starting with `prefix` (the process's output is bounded)."""
    for line in process.stdout:
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    raise AssertionError(f"the server exited ({process.wait()}) before printing {prefix}")


async def _load(base: str, image: bytes) -> list[int]:
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        queue = iter(range(REQUESTS))
        codes: list[int] = []

        async def client() -> None:
            for _ in queue:
                codes.append((await http.post("/v1/classify", content=image)).status_code)

        await asyncio.gather(*(client() for _ in range(CLIENTS)))
        return codes


@pytest.mark.timeout(600)
def test_a_loaded_server_does_no_full_collection_over_its_start_up_objects(tmp_path_factory):
    run_dir, data = train_tiny_run(tmp_path_factory)
    image = sorted((data / "val").rglob("*.png"))[0].read_bytes()
    command = [sys.executable, "-c", SERVER, "serve", str(run_dir), "--backend", "eager", "--precision", "fp32",
               "--max-batch", "4", "--instances", "1", "--max-delay-ms", "1", "--port", "0", "--grpc-port", "off"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        port, frozen, unfrozen = map(int, _read_until(process, "LISTENING").split())
        began = time.monotonic()
        codes = asyncio.run(_load(f"http://127.0.0.1:{port}", image))
        ended = time.monotonic()
        process.send_signal(signal.SIGTERM)
        full = json.loads(_read_until(process, "FULL"))
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert codes == [200] * REQUESTS
    during = [seconds for started, seconds in full if began <= started <= ended]
    assert during == [], f"{len(during)} full collection(s) under load, {max(during) * 1e3:.0f} ms the longest"
    assert frozen > 10 * unfrozen  # start-up's objects are out of the collector's reach
