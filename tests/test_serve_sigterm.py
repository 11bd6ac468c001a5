"""SIGTERM under load, on a real server process: readiness 503, every accepted request answered, exit 0."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from helpers.page_examples import check_example
from serve_helpers import train_tiny_run

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(base: str, process: subprocess.Popen, limit_s: float = 180) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"server exited early: {process.communicate()[0]}"
        try:
            if httpx.get(f"{base}/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)  # polling a starting process: nothing to wait on but the socket
    pytest.fail(f"server not ready within {limit_s} s")


@dataclass
class ServerProcess:
    base: str  # HTTP
    grpc_address: str
    process: subprocess.Popen
    image: bytes  # one val image of the tiny run, encoded


@pytest.fixture
def server(tmp_path_factory):
    run_dir, data = train_tiny_run(tmp_path_factory)
    port, grpc_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    # max-batch 1: a backlog of single-image executions keeps the drain busy long enough to watch.
    process = subprocess.Popen(
        [sys.executable, "-m", "inceptionlab", "serve", f"tiny={run_dir}", "--backend", "eager", "--precision",
         "fp32", "--device", "cpu", "--max-batch", "1", "--max-queue", "64", "--drain-s", "60",
         "--port", str(port), "--grpc-port", str(grpc_port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, process)
        yield ServerProcess(base, f"127.0.0.1:{grpc_port}", process, sorted((data / "val").rglob("*.png"))[0].read_bytes())
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


async def wait_for_backlog(http: httpx.AsyncClient, at_least: int = 10) -> float:
    """Poll /metrics until the server holds a backlog (bounded: 400 polls)."""
    for _ in range(400):
        metrics = (await http.get("/metrics")).text
        pending = sum(float(line.split()[-1]) for line in metrics.splitlines()
                      if line.startswith("inceptionlab_pending_requests"))
        if pending >= at_least:
            break
    return pending


async def _load_then_sigterm(base: str, process: subprocess.Popen, body: bytes, count: int, after=None):
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_connections=count)) as http:
        tasks = [asyncio.create_task(http.post("/v1/classify", content=body)) for _ in range(count)]
        pending = await wait_for_backlog(http)
        process.send_signal(signal.SIGTERM)
        readiness = (await http.get("/v2/health/ready")).status_code
        during = await after() if after else None
        results = await asyncio.gather(*tasks, return_exceptions=True)
    return pending, readiness, results, during


def test_sigterm_under_load_answers_every_accepted_request_and_exits_0(server):
    base, process, body = server.base, server.process, server.image
    pending, readiness, results, _ = asyncio.run(_load_then_sigterm(base, process, body, 48))
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    assert pending >= 10 and readiness == 503
    answered = [r for r in results if isinstance(r, httpx.Response) and r.status_code == 200]
    refused = [r for r in results if isinstance(r, httpx.Response) and r.status_code == 503]
    failed = [r for r in results if not isinstance(r, httpx.Response) or r.status_code not in (200, 503)]
    assert not failed, failed[:3]  # nothing accepted was dropped: each got its answer or a clean 503
    assert len(answered) >= pending and len(answered) + len(refused) == 48
    assert all(len(r.json()["results"][0]["topk"]) == 3 for r in answered)
    assert "draining: readiness 503" in output and "drained" in output
    check_example("server-drain", output)


def test_answers_while_draining_carry_a_json_error_and_close_the_connection(server):
    """perf_analyzer failed with "The document is empty" when the server stopped under load: requests
    sent on a keep-alive connection as the server exited got no answer at all. While draining, every
    answer is the protocol's JSON error and says `Connection: close`, so clients reconnect (and are
    refused with a body) instead of reusing a connection the server is about to close."""
    base, process, body = server.base, server.process, server.image

    async def while_draining():
        async with httpx.AsyncClient(base_url=base, timeout=30) as fresh:
            return [await fresh.post("/v2/models/tiny/infer", content=b'{"inputs": []}'),
                    await fresh.post("/v1/classify", content=body),
                    await fresh.get("/v2/health/ready"),
                    await fresh.get("/v2/models/tiny/ready")]

    pending, readiness, results, during = asyncio.run(_load_then_sigterm(base, process, body, 48, while_draining))
    process.communicate(timeout=120)
    assert pending >= 10 and readiness == 503 and process.returncode == 0
    assert [r.status_code for r in during] == [503, 503, 503, 503]
    assert all(r.headers["connection"] == "close" for r in during)
    assert all(isinstance(r.json().get("error"), str) for r in during[:2])
    assert "shutting down" in during[0].json()["error"] and during[2].json() == {"ready": False}
    # The keep-alive connections that carried the backlog were closed after their answers, each one given.
    assert all(isinstance(r, httpx.Response) and r.status_code in (200, 503) and r.json() for r in results)


async def _grpc_load_then_sigterm(server: ServerProcess, count: int):
    import grpc
    import numpy as np
    import tritonclient.grpc.aio as tg_aio
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from tritonclient.grpc import InferInput

    def image():
        tensor = InferInput("image_bytes", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[server.image]], dtype=object))
        return tensor

    async with tg_aio.InferenceServerClient(server.grpc_address) as client, \
            grpc.aio.insecure_channel(server.grpc_address) as channel, \
            httpx.AsyncClient(base_url=server.base, timeout=60) as http:
        tasks = [asyncio.create_task(client.infer("tiny", [image()])) for _ in range(count)]
        pending = await wait_for_backlog(http)
        server.process.send_signal(signal.SIGTERM)
        for _ in range(400):  # bounded: the signal is handled within milliseconds
            if (await http.get("/v2/health/ready")).status_code == 503:
                break
        health = health_pb2_grpc.HealthStub(channel)
        statuses = {service: (await health.Check(health_pb2.HealthCheckRequest(service=service))).status
                    for service in ("", "live")}
        try:
            await client.infer("tiny", [image()])
            late = None
        except Exception as exc:  # noqa: BLE001 - the refusal is what is checked
            late = exc
        results = await asyncio.gather(*tasks, return_exceptions=True)
    return pending, statuses, late, results


def test_sigterm_under_grpc_load_answers_every_accepted_call_and_refuses_new_ones(server):
    from grpc_health.v1 import health_pb2
    from tritonclient.utils import InferenceServerException

    pending, statuses, late, results = asyncio.run(_grpc_load_then_sigterm(server, 48))
    output, _ = server.process.communicate(timeout=120)
    assert server.process.returncode == 0, output
    assert statuses == {"": health_pb2.HealthCheckResponse.NOT_SERVING, "live": health_pb2.HealthCheckResponse.SERVING}
    assert isinstance(late, InferenceServerException) and late.status() == "StatusCode.UNAVAILABLE"
    assert "shutting down" in late.message()
    answered = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, InferenceServerException) and r.status() == "StatusCode.UNAVAILABLE"]
    failed = [r for r in results if isinstance(r, BaseException) and r not in refused]
    assert not failed, failed[:3]  # every accepted call got its answer, the others a clean UNAVAILABLE
    assert len(answered) >= pending and len(answered) + len(refused) == 48
    assert all(r.as_numpy("probabilities").shape == (1, 3) for r in answered)
    assert "drained" in output


def read_until(process: subprocess.Popen, text: str, limit: int = 200) -> list[str]:
    """The server's output lines up to the first that holds `text` (bounded: `limit` lines)."""
    lines = []
    for _ in range(limit):
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    pytest.fail(f"{text!r} never printed: {''.join(lines)[-2000:]}")


def test_ctrl_c_twice_on_an_idle_server_exits_0_without_a_traceback(server):
    """A user pressing Ctrl-C twice: the first drains (at once, nothing is pending), the second lands
    while uvicorn shuts down. It forced the exit, which skipped the app's shutdown, and uvicorn logged
    the cancelled lifespan as an error with a traceback. A drain already done leaves nothing to force."""
    process = server.process
    process.send_signal(signal.SIGINT)
    read_until(process, "drained")
    process.send_signal(signal.SIGINT)  # during uvicorn's shutdown, which waits 0.1 s after closing
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    assert "Traceback" not in output and "CancelledError" not in output, output


def test_a_second_signal_while_draining_exits_at_once_saying_what_was_left(server):
    """The second signal during a drain that is still answering a backlog: exit now, refusing what is
    queued (503, as while draining) and saying so, no traceback; the batch running finishes."""
    base, process, body = server.base, server.process, server.image

    async def load_then_two_signals():
        async with httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_connections=48)) as http:
            tasks = [asyncio.create_task(http.post("/v1/classify", content=body)) for _ in range(48)]
            pending = await wait_for_backlog(http)
            process.send_signal(signal.SIGINT)
            await asyncio.to_thread(read_until, process, "draining:")
            process.send_signal(signal.SIGINT)
            results = await asyncio.gather(*tasks, return_exceptions=True)
        return pending, results

    pending, results = asyncio.run(load_then_two_signals())
    output, _ = process.communicate(timeout=60)
    assert pending >= 10 and process.returncode == 0, output
    assert "second signal: exiting now" in output and "Traceback" not in output, output
    refused = [r for r in results if isinstance(r, httpx.Response) and r.status_code == 503]
    assert all(isinstance(r, httpx.Response) and r.status_code in (200, 503) for r in results), results
    said = int(output.split("second signal: exiting now: ")[1].split()[0])
    assert said >= 1 and len(refused) >= said  # the queued ones, and any refused while draining before
    assert "exiting" in refused[-1].json()["error"] or "shutting down" in refused[-1].json()["error"]
