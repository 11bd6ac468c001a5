"""`inceptionlab loadtest`: the measurement maths, and the client against stub KServe v2 servers.

The HTTP stub (FastAPI + uvicorn on 127.0.0.1, a thread of this process) parses requests the way the
binary tensor extension defines them, can serve one request at a time with a fixed service time,
stall once (blocking its event loop, like a GC pause), reject with 503 or fail with 500, and
exports the counters our server exports on /metrics. The gRPC stub (grpcio's server with one worker
thread, the messages of serve/proto) does the same over gRPC. Then both protocols against
`inceptionlab serve` itself, whose own /metrics must count what the client saw.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
from helpers.page_examples import check_example

from inceptionlab import host
from inceptionlab.errors import UserError
from inceptionlab.loadtest import generator as lt
from inceptionlab.loadtest.payloads import Prepared, TensorRequest, file_body, infer_body, json_infer_body
from inceptionlab.loadtest.transports import request_path
from inceptionlab.loadtest.report import format_table, plot_latency_vs_rate
from inceptionlab.loadtest.server_metrics import parse_metrics, server_stats, statistics_counters
from inceptionlab.loadtest.transports import HttpTransport
from inceptionlab.serve.protocol import HEADER_LENGTH, encode_bytes_elements, parse_infer_request

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
from fastapi import FastAPI, Request, Response  # noqa: E402 (module level: FastAPI resolves the annotations)
from serve_helpers import quiet_uvicorn_config  # noqa: E402 (after the importorskip above)


# --------------------------------------------------------------------------------------- stub server


@dataclass
class Behaviour:
    service_ms: float = 1.0  # per request, one request at a time (an asyncio lock)
    stall_at: int | None = None  # request number whose handler blocks the server's loop
    stall_ms: float = 300.0
    reject_every: int = 0  # every Nth request: 503
    fail_every: int = 0  # every Nth request: 500
    inputs: list = field(default_factory=lambda: [{"name": "image", "datatype": "BYTES", "shape": [-1]}])
    seen: list = field(default_factory=list)  # decoded inputs of accepted requests
    auth: str | None = None  # the last Authorization header
    count: int = 0
    json_bodies: int = 0  # requests in the plain JSON form (no binary extension)


def stub_app(behaviour: Behaviour):
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    registry = CollectorRegistry()
    inferences = Counter("inceptionlab_inferences", "images inferred", ["model"], registry=registry)
    executions = Counter("inceptionlab_executions", "model executions", ["model"], registry=registry)
    queue = Histogram("inceptionlab_queue_seconds", "queue time", ["model"], registry=registry)
    compute = Histogram("inceptionlab_compute_seconds", "compute time", ["model"], registry=registry)
    lock = asyncio.Lock()
    app = FastAPI()

    @app.get("/v2/health/ready")
    def ready():
        return {}

    @app.get("/v2/models/{name}")
    def metadata(name: str):
        if name != "stub":
            return Response(status_code=404, content=json.dumps({"error": f"unknown model {name}"}))
        return {"name": name, "platform": "stub", "inputs": behaviour.inputs,
                "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]}

    @app.get("/metrics")
    def metrics():
        return Response(generate_latest(registry), media_type="text/plain")

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request):
        behaviour.count += 1
        number = behaviour.count
        behaviour.auth = request.headers.get("authorization")
        body = await request.body()
        if "Inference-Header-Content-Length" in request.headers:
            length = int(request.headers["Inference-Header-Content-Length"])
            header = json.loads(body[:length])
            spec = header["inputs"][0]
            data = body[length:]
            assert len(data) == spec["parameters"]["binary_data_size"]
        else:  # the plain JSON form: encoded files as {"b64": ...}
            behaviour.json_bodies += 1
            spec = json.loads(body)["inputs"][0]
            data = encode_bytes_elements([base64.b64decode(item["b64"]) for item in spec["data"]])
        if behaviour.stall_at == number:
            time.sleep(behaviour.stall_ms / 1e3)  # blocks the whole server, as a stalled process would
        if behaviour.reject_every and number % behaviour.reject_every == 0:
            return Response(status_code=503, content=b'{"error": "queue full"}')
        if behaviour.fail_every and number % behaviour.fail_every == 0:
            return Response(status_code=500, content=b'{"error": "boom"}')
        arrived = time.perf_counter()
        async with lock:
            started = time.perf_counter()
            await asyncio.sleep(behaviour.service_ms / 1e3)
        queue.labels(name).observe(started - arrived)
        compute.labels(name).observe(time.perf_counter() - started)
        inferences.labels(name).inc()
        executions.labels(name).inc()
        behaviour.seen.append((spec, data))
        out = np.zeros(10, np.float32).tobytes()
        reply = json.dumps({"model_name": name, "outputs": [{"name": "logits", "datatype": "FP32", "shape": [1, 10],
                                                              "parameters": {"binary_data_size": len(out)}}]}).encode()
        return Response(reply + out, headers={"Inference-Header-Content-Length": str(len(reply))},
                        media_type="application/octet-stream")

    return app


@pytest.fixture
def stub():
    """A stub server on 127.0.0.1 (a free port); yields (url, behaviour)."""
    behaviour = Behaviour()
    # The socket is bound and listening before the server thread starts, so requests made before
    # uvicorn is serving wait in the kernel's backlog instead of failing: no waiting loop needed.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = quiet_uvicorn_config(stub_app(behaviour), log_level="error", lifespan="off", timeout_keep_alive=30)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", behaviour
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def settings(url: str, **kwargs) -> lt.LoadSettings:
    defaults = {"model": "stub", "duration": 1.0, "warmup": 1, "slo_ms": 100.0}
    return lt.LoadSettings(url, **{**defaults, **kwargs})


# --------------------------------------------------------------------------------------- maths


def test_percentiles_match_definition_and_empty_is_none():
    values = np.arange(1, 1001, dtype=float)  # 1..1000 ms
    stats = lt.percentiles(values)
    assert stats == {"p50_ms": 500.5, "p90_ms": 900.1, "p99_ms": 990.01, "p999_ms": 999.001}
    assert lt.percentiles([]) == {"p50_ms": None, "p90_ms": None, "p99_ms": None, "p999_ms": None}


def test_poisson_schedule_has_poisson_statistics_and_is_repeatable():
    rate, duration = 50.0, 200.0  # 10,000 expected arrivals
    times = lt.poisson_schedule(rate, duration, seed=0)
    expected = rate * duration
    assert abs(len(times) - expected) < 4 * np.sqrt(expected)  # Poisson count: sd = sqrt(mean)
    assert np.all(np.diff(times) > 0) and times[0] >= 0 and times[-1] < duration
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential gaps: CV 1
    # Arrivals per 1 s window are Poisson: variance equal to the mean (dispersion index 1).
    per_second = np.histogram(times, bins=int(duration), range=(0, duration))[0]
    assert per_second.var() / per_second.mean() == pytest.approx(1.0, abs=0.25)
    assert np.array_equal(times, lt.poisson_schedule(rate, duration, seed=0))
    assert not np.array_equal(times[:100], lt.poisson_schedule(rate, duration, seed=1)[:100])


def test_latency_is_counted_from_scheduled_time_not_send_time():
    # The client sent 200 ms late (busy) and the server took 50 ms: the user waited 250 ms.
    records = [lt.Record(scheduled=10.0, sent=10.2, done=10.25, outcome="ok", status=200)]
    row = lt.summarize(records, start=10.0, duration=1.0, slo_ms=100.0, max_error_rate=0.01)
    assert row["p50_ms"] == pytest.approx(250.0)
    assert row["send_lag_p99_ms"] == pytest.approx(200.0)
    assert row["p50_from_send_ms"] == row["p99_from_send_ms"] == pytest.approx(50.0)  # what perf_analyzer counts
    assert row["slo_met"] is False


def test_binary_bytes_tensor_matches_tritons_serializer():
    utils = pytest.importorskip("tritonclient.utils")
    items = [b"\xff\xd8jpeg", b"", b"x" * 300]
    ours = encode_bytes_elements(items)  # the server's codec, which the client sends with
    theirs = utils.serialize_byte_tensor(np.array(items, dtype=np.object_))
    assert ours == theirs.item()  # a 0-d object array holding the serialized bytes
    request = infer_body("image", "BYTES", [3], ours, "logits")
    length = int(request.headers[HEADER_LENGTH])
    header = json.loads(request.body[:length])
    assert header["inputs"][0] == {"name": "image", "shape": [3], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(ours)}}
    assert request.body[length:] == ours


@pytest.mark.parametrize("datatype, shape, data", [
    ("BYTES", [2, 1], encode_bytes_elements([b"\xff\xd8jpeg", b"\x89PNG"])),
    ("UINT8", [1, 3, 2, 2], bytes(range(12))),
    ("FP32", [1, 2], np.array([0.5, -2.0], np.float32).tobytes()),
])
def test_the_json_body_is_the_same_request_as_the_binary_one(datatype, shape, data):
    tensor = TensorRequest("images", datatype, shape, data, "probabilities")
    binary = infer_body(tensor.input_name, datatype, shape, data, tensor.output)
    plain = json_infer_body(tensor)
    assert plain.headers == {"Content-Type": "application/json"} and HEADER_LENGTH not in plain.headers
    one, other = parse_infer_request(binary.body, binary.headers[HEADER_LENGTH]), parse_infer_request(plain.body, None)
    assert one.outputs == other.outputs == ["probabilities"] and not other.binary_all
    [a], [b] = one.inputs, other.inputs
    assert (a.name, a.datatype, a.shape) == (b.name, b.datatype, b.shape)
    assert a.data == b.data if datatype == "BYTES" else np.array_equal(a.data, b.data)


def test_next_rate_grows_then_bisects_then_stops():
    assert lt.next_rate([(10, True)], 2.0, 0.1) == 20
    assert lt.next_rate([(10, True), (20, False)], 2.0, 0.1) == pytest.approx(np.sqrt(200))
    assert lt.next_rate([(10, True), (10.5, False)], 2.0, 0.1) is None
    # The first rate already fails: step down, three times at most.
    history = [(16.0, False)]
    while (rate := lt.next_rate(history, 2.0, 0.1)) is not None:
        history.append((rate, False))
    assert [r for r, _ in history] == [16.0, 8.0, 4.0, 2.0]


def test_sweep_stops_at_the_slo_and_reports_the_highest_rate_that_held():
    measured = []

    async def fake_measure(rate):  # p99 grows with load: 10 ms per request/s, SLO 100 ms -> 10/s
        measured.append(rate)
        p99 = 10.0 * rate
        return {"rate": rate, "p99_ms": p99, "slo_met": p99 <= 100.0, "achieved_rate": rate}

    result = asyncio.run(lt.sweep_rates(fake_measure, start=2.0, factor=1.6, resolution=0.05))
    assert result["complete"]
    assert 10.0 / 1.05 <= result["best_rate"] <= 10.0
    first_fail = next(r for r in measured if r > 10.0)
    assert max(measured) == first_fail  # never went past the first rate that failed
    assert all(row["slo_met"] == (row["rate"] <= 10.0) for row in result["rows"])


def test_server_stats_from_our_metrics_and_tritons():
    ours = lambda inf, ex, q, c, n: (  # noqa: E731
        f'inceptionlab_inferences_total{{model="m"}} {inf}\n'
        f'inceptionlab_executions_total{{model="m"}} {ex}\n'
        f'inceptionlab_queue_seconds_sum{{model="m"}} {q}\ninceptionlab_queue_seconds_count{{model="m"}} {n}\n'
        f'inceptionlab_compute_seconds_sum{{model="m"}} {c}\ninceptionlab_compute_seconds_count{{model="m"}} {n}\n'
        f'inceptionlab_request_seconds_sum{{model="m"}} {2 * c}\ninceptionlab_request_seconds_count{{model="m"}} {n}\n'
        f'inceptionlab_requests_total{{model="m",outcome="rejected"}} {n // 10}\n'
        f'inceptionlab_inferences_total{{model="other"}} 999\n')
    before = parse_metrics(ours(10, 10, 0.1, 0.5, 10), "m")
    after = parse_metrics(ours(110, 35, 1.1, 3.0, 110), "m")
    stats = server_stats(before, after)
    # 100 images in 25 executions: batches of 4; 1 s queued and 2.5 s computing over 100 requests.
    assert stats["metrics"] == "inceptionlab" and stats["avg_batch"] == 4.0
    assert stats["queue_ms"] == pytest.approx(10.0) and stats["compute_ms"] == pytest.approx(25.0)
    assert stats["request_ms"] == pytest.approx(50.0) and stats["outcomes"] == {"rejected": 10}
    triton = lambda inf, ex, ok, q, c: (  # noqa: E731
        f'nv_inference_count{{model="m",version="1"}} {inf}\nnv_inference_exec_count{{model="m",version="1"}} {ex}\n'
        f'nv_inference_request_success{{model="m",version="1"}} {ok}\n'
        f'nv_inference_queue_duration_us{{model="m",version="1"}} {q}\n'
        f'nv_inference_compute_infer_duration_us{{model="m",version="1"}} {c}\n')
    stats = server_stats(parse_metrics(triton(0, 0, 0, 0, 0), "m"),
                            parse_metrics(triton(64, 8, 64, 128000, 640000), "m"))
    assert stats["metrics"] == "triton" and stats["avg_batch"] == 8.0
    assert stats["queue_ms"] == pytest.approx(2.0) and stats["compute_ms"] == pytest.approx(10.0)
    assert server_stats(None, after) == {} and server_stats({"x": 1.0}, {"x": 2.0}) == {}


# --------------------------------------------------------------------------------------- against the stub


# The machine running the tests may be shared (load average 10 on 2 cores was seen): timings are
# asserted with margins that hold when a request costs ~50 ms of overhead instead of ~1 ms.


def test_open_loop_latency_includes_a_stall(stub):
    url, behaviour = stub
    behaviour.stall_at, behaviour.stall_ms = 20, 600.0  # ~0.4 s into a 50/s run
    row = lt.run_load(settings(url, rate=50.0, duration=2.0, slo_ms=300.0))
    assert row["error"] == row["rejected"] == row["timeout"] == 0 and row["ok"] == row["sent"] > 60
    # Every request due during the 600 ms stall waited for it: those due in its first 300 ms are
    # >= 300 ms late, ~50/s x 0.3 s = 15 requests. A closed loop would have shown one.
    assert row["max_ms"] >= 550.0
    assert row["over_slo"] >= 8
    assert row["server"]["inferences"] == row["ok"]


def test_min_requests_stretches_a_slow_open_loop(stub):
    url, _ = stub
    row = lt.run_load(settings(url, rate=20.0, duration=0.2, min_requests=30))
    assert row["duration_s"] == pytest.approx(1.5) and row["sent"] >= 15  # Poisson: 30 expected, sd 5.5


def test_closed_loop_misses_what_the_open_loop_sees(stub):
    url, behaviour = stub
    behaviour.stall_at, behaviour.stall_ms = 5, 600.0
    row = lt.run_load(settings(url, concurrency=1, duration=1.5, slo_ms=300.0))
    assert row["mode"] == "closed" and row["ok"] == row["sent"] > 5
    assert row["max_ms"] >= 550.0  # the one request the server was serving during the stall
    assert row["over_slo"] <= 2  # ... and about only that one: the client stopped asking meanwhile


def test_closed_loop_throughput_and_littles_law(stub):
    url, behaviour = stub
    behaviour.service_ms = 10.0  # one at a time: at most ~100 requests/s
    row = lt.run_load(settings(url, concurrency=4, duration=1.5))
    assert row["error"] == row["rejected"] == 0
    assert 10.0 <= row["achieved_rate"] <= 101.0
    # Little's law: 4 requests always in the system -> mean latency = 4 / throughput.
    assert row["mean_ms"] == pytest.approx(4 / row["achieved_rate"] * 1e3, rel=0.3)
    assert row["server"]["avg_batch"] == 1.0 and row["server"]["compute_ms"] >= 9.0


def test_503_and_errors_are_counted_apart_and_fail_the_slo(stub):
    url, behaviour = stub
    behaviour.reject_every, behaviour.fail_every = 4, 10
    row = lt.run_load(settings(url, concurrency=1, duration=1.0, warmup=0))
    n = row["sent"]
    assert n >= 10
    assert row["rejected"] == n // 4
    assert row["error"] == n // 10 - n // 20  # multiples of 20 were already rejected as multiples of 4
    assert row["ok"] == n - row["rejected"] - row["error"]
    assert row["error_rate"] == pytest.approx((row["rejected"] + row["error"]) / n, abs=1e-4)
    assert row["slo_met"] is False  # fast answers, but 30% of them failures


def test_a_request_past_its_timeout_is_a_timeout_and_an_unreachable_server_an_error(stub):
    """Outcomes over HTTP: an answer later than --timeout counts as a timeout (not an error, not ok), and a
    server that stops answering mid-run as errors, each request bounded either way."""
    url, behaviour = stub
    behaviour.service_ms = 400.0
    row = lt.run_load(settings(url, concurrency=2, duration=0.3, warmup=0, timeout=0.1))
    assert row["sent"] >= 2 and row["timeout"] == row["sent"] and row["ok"] == row["error"] == 0
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    records = asyncio.run(_send_once(dead))
    assert [r.outcome for r in records] == ["error"] and records[0].detail == "ClientConnectorError"


async def _send_once(url: str) -> list:
    transport = HttpTransport(url, connections=1, api_key=None, timeout=5.0)
    transport.endpoint = f"{url}/v2/models/stub/infer"
    try:
        return [await transport.send(Prepared(b"{}", {}), time.perf_counter(), 5.0)]
    finally:
        await transport.aclose()


def test_tensor_payload_follows_the_models_metadata(stub):
    url, behaviour = stub
    behaviour.inputs = [{"name": "images", "datatype": "UINT8", "shape": [-1, 3, 32, 24]}]
    row = lt.run_load(settings(url, concurrency=1, duration=0.2, payload="tensor"))
    assert row["ok"] > 0 and row["error"] == 0
    spec, data = behaviour.seen[-1]
    assert spec["datatype"] == "UINT8" and spec["shape"] == [1, 3, 32, 24] and len(data) == 3 * 32 * 24
    # Our server lists only its image input and takes encoded files there too.
    lt.run_load(settings(url, concurrency=1, duration=0.2, payload="image"))
    spec, data = behaviour.seen[-1]
    assert spec["name"] == "images" and spec["datatype"] == "BYTES" and spec["shape"] == [1]
    row = lt.run_load(settings(url, concurrency=1, duration=0.2, payload="fp32"))
    spec, data = behaviour.seen[-1]
    assert spec["datatype"] == "FP32" and len(data) == 4 * 3 * 32 * 24
    pixels = np.frombuffer(data, np.float32)
    assert 0.0 <= pixels.min() and pixels.max() <= 1.0
    behaviour.inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    with pytest.raises(UserError, match="no input to send --payload tensor"):
        lt.run_load(settings(url, concurrency=1, duration=0.2, payload="tensor"))


def test_a_json_body_goes_to_the_same_endpoint(stub):
    url, behaviour = stub
    row = lt.run_load(settings(url, concurrency=1, duration=0.2, payload="image", body="json"))
    assert row["ok"] > 0 and row["error"] == 0
    assert behaviour.json_bodies > 0  # the stub parsed plain JSON, not the binary extension
    with pytest.raises(UserError, match="--body xml"):
        lt.run_load(settings(url, concurrency=1, duration=0.2, body="xml"))


def test_image_payload_sends_real_jpegs(stub, tmp_path):
    from PIL import Image

    url, behaviour = stub
    Image.new("RGB", (64, 48), (200, 30, 30)).save(tmp_path / "red.jpg")
    lt.run_load(settings(url, concurrency=1, duration=0.2, images=[tmp_path]))
    spec, data = behaviour.seen[-1]
    (length,) = struct.unpack("<I", data[:4])
    assert spec["datatype"] == "BYTES" and length == len(data) - 4
    assert Image.open(io.BytesIO(data[4:])).size == (64, 48)


def test_sweep_against_a_server_with_fixed_capacity(stub):
    url, behaviour = stub
    behaviour.service_ms = 20.0  # capacity 50 requests/s
    result = lt.run_sweep(settings(url, duration=1.0, slo_ms=300.0), start_rate=10.0, factor=2.0,
                          resolution=0.25, max_steps=6)
    rates = [row["rate"] for row in result["rows"]]
    assert rates[:3] == [10.0, 20.0, 40.0] and result["rows"][0]["slo_met"]
    # A 1 s window can hold a rate slightly above capacity (the backlog is still short): the SLO is
    # about the latency users saw in the window, and the achieved rate tells the truth.
    assert result["best_rate"] is not None and 20.0 <= result["best_rate"] < 65.0
    assert result["best"]["achieved_rate"] <= 51.0  # never more than the server can do
    assert any(not row["slo_met"] for row in result["rows"])  # it went past the SLO, then stopped
    assert result["rows"][-1]["rate"] < max(row["rate"] for row in result["rows"])  # and came back down


def test_cli_json_rows_results_file_and_plot(stub, cli, tmp_path):
    url, _ = stub
    result = cli("loadtest", url, "--model", "stub", "--rate", "40", "--duration", "0.5", "--warmup", "1",
                 "--json", "--out", tmp_path)
    assert result.code == 0, result.err
    row = json.loads(result.out.strip().splitlines()[0])
    assert row["mode"] == "open" and row["rate"] == 40.0 and row["ok"] > 0 and "p999_ms" in row
    saved = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert saved[0]["p99_ms"] == row["p99_ms"] and saved[0]["env"]["cpu"] and "loadtest" in saved[0]["command"]
    # One environment record: the client's is the torch-free base that env.json and bench rows extend.
    from inceptionlab.runtime import environment

    assert set(saved[0]["env"]) == set(host.environment()) and set(saved[0]["env"]) < set(environment("cpu"))
    png = (tmp_path / "plots" / "loadtest.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_cli_table_and_bad_inputs(stub, cli, tmp_path):
    url, _ = stub
    result = cli("loadtest", url, "--model", "stub", "--concurrency", "2", "--duration", "0.3", "--out", tmp_path,
                 "--no-plot")
    assert result.code == 0, result.err
    assert "achieved/s" in result.out and "C=2" in result.out
    missing = cli("loadtest", url, "--model", "nope", "--rate", "5", "--duration", "0.2", "--out", tmp_path)
    assert missing.code != 0 and "error:" in missing.err and "--model" in missing.err
    both = cli("loadtest", url, "--rate", "5", "--concurrency", "2", "--out", tmp_path)
    assert both.code != 0 and "not both" in both.err
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{free.getsockname()[1]}"
    down = cli("loadtest", dead, "--model", "stub", "--rate", "5", "--out", tmp_path)
    assert down.code != 0 and "cannot reach" in down.err
    # Without --model the first request is the repository index: a dead server is still said to be one,
    # not "cannot tell which model to load" with the advice to pass --model.
    unnamed = cli("loadtest", dead, "--rate", "5", "--out", tmp_path)
    assert unnamed.code != 0 and "cannot reach the server" in unnamed.err and "--model" not in unnamed.err
    assert len(unnamed.err.strip().splitlines()) == 1


def test_api_key_is_sent_and_never_written(stub, cli, tmp_path, monkeypatch):
    from inceptionlab.loadtest.report import redacted

    url, behaviour = stub
    monkeypatch.setattr("sys.argv", ["inceptionlab", "loadtest", url, "--api-key", "s3cret"])
    result = cli("loadtest", url, "--model", "stub", "--concurrency", "1", "--duration", "0.2", "--api-key", "s3cret",
                 "--out", tmp_path, "--no-plot")
    assert result.code == 0, result.err
    assert behaviour.auth == "Bearer s3cret"
    assert "s3cret" not in (tmp_path / "results.jsonl").read_text()
    assert redacted(["x", "--api-key", "k", "--api-key=k2"]) == ["x", "--api-key", "***", "--api-key=***"]


# --------------------------------------------------------------------------------------- a stub gRPC server


@dataclass
class GrpcBehaviour:
    service_ms: float = 1.0  # per request; one worker thread serves one request at a time
    stall_at: int | None = None  # request number whose handler blocks the only worker
    stall_ms: float = 300.0
    reject_every: int = 0  # every Nth request: RESOURCE_EXHAUSTED (our server's full queue)
    fail_every: int = 0  # every Nth request: INTERNAL
    seen: list = field(default_factory=list)  # accepted ModelInferRequests
    keys: list = field(default_factory=list)  # the authorization metadata of each inference
    count: int = 0


@pytest.fixture
def grpc_stub():
    """An Open Inference Protocol gRPC server on 127.0.0.1 with the stub model `stub` (BYTES image
    input [-1, 1]); yields (HOST:PORT, behaviour)."""
    from concurrent import futures

    import grpc
    from google.protobuf import json_format

    from inceptionlab.serve.proto import message

    behaviour = GrpcBehaviour()

    def metadata(request, context):
        if request.name != "stub":
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {request.name!r}")
        return json_format.ParseDict({"name": "stub", "platform": "stub",
                                      "inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [-1, 1]}],
                                      "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]},
                                     message("ModelMetadataResponse")())

    def infer(request, context):
        behaviour.count += 1
        number = behaviour.count
        behaviour.keys.append(dict(context.invocation_metadata()).get("authorization"))
        if behaviour.stall_at == number:
            time.sleep(behaviour.stall_ms / 1e3)  # the only worker: every request behind it waits
        if behaviour.reject_every and number % behaviour.reject_every == 0:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
        if behaviour.fail_every and number % behaviour.fail_every == 0:
            context.abort(grpc.StatusCode.INTERNAL, "boom")
        time.sleep(behaviour.service_ms / 1e3)
        behaviour.seen.append(request)
        reply = message("ModelInferResponse")(model_name=request.model_name)
        reply.outputs.add(name="logits", datatype="FP32", shape=[1, 10])
        reply.raw_output_contents.append(np.zeros(10, np.float32).tobytes())
        return reply

    def statistics(request, context):
        done = len(behaviour.seen)
        return json_format.ParseDict({"model_stats": [{"name": "stub", "inference_count": done, "execution_count": done,
                                                       "inference_stats": {"success": {"count": done, "ns": 0},
                                                                           "queue": {"count": done, "ns": done * 10**6},
                                                                           "compute_infer": {"count": done,
                                                                                             "ns": 2 * done * 10**6}}}]},
                                     message("ModelStatisticsResponse")())

    def handler(function, name):
        return grpc.unary_unary_rpc_method_handler(function, request_deserializer=message(f"{name}Request").FromString,
                                                   response_serializer=lambda reply: reply.SerializeToString())

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
        "ModelMetadata": handler(metadata, "ModelMetadata"), "ModelInfer": handler(infer, "ModelInfer"),
        "ModelStatistics": handler(statistics, "ModelStatistics")}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()  # listening when it returns
    yield f"127.0.0.1:{port}", behaviour
    server.stop(grace=None).wait(10)


def test_grpc_open_loop_latency_counts_from_the_scheduled_time(grpc_stub):
    target, behaviour = grpc_stub
    behaviour.stall_at, behaviour.stall_ms = 20, 600.0  # ~0.4 s into a 50/s run
    row = lt.run_load(settings(target, protocol="grpc", rate=50.0, duration=2.0, slo_ms=300.0))
    assert row["protocol"] == "grpc" and row["error"] == row["rejected"] == row["timeout"] == 0
    assert row["ok"] == row["sent"] > 60
    # As over HTTP: every request due during the 600 ms stall waited for it (~15 of them >= 300 ms late).
    assert row["max_ms"] >= 550.0 and row["over_slo"] >= 8
    assert row["server"]["metrics"] == "statistics" and row["server"]["inferences"] == row["ok"]
    request = behaviour.seen[-1]  # raw_input_contents: one encoded image, length-prefixed, shape [1, 1]
    assert request.model_name == "stub" and [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == \
        [("image_bytes", "BYTES", [1, 1])] and [o.name for o in request.outputs] == ["logits"]
    (length,) = struct.unpack("<I", request.raw_input_contents[0][:4])
    assert length == len(request.raw_input_contents[0]) - 4 > 100


def test_grpc_status_codes_are_counted_as_http_statuses_are(grpc_stub):
    target, behaviour = grpc_stub
    behaviour.reject_every, behaviour.fail_every = 4, 10
    row = lt.run_load(settings(target, protocol="grpc", concurrency=1, duration=1.0, warmup=0))
    n = row["sent"]
    assert n >= 10 and row["rejected"] == n // 4  # RESOURCE_EXHAUSTED: what 503 is over HTTP
    assert row["error"] == n // 10 - n // 20 and row["ok"] == n - row["rejected"] - row["error"]
    assert row["slo_met"] is False


def test_the_grpc_table_is_the_pages(grpc_stub, cli, tmp_path):
    target, _ = grpc_stub
    result = cli("loadtest", target, "--protocol", "grpc", "--model", "stub", "--payload", "image", "--rate", "20",
                 "--duration", "0.5", "--out", tmp_path, "--no-plot")
    assert result.code == 0, result.err
    progress, *after = result.err.splitlines()  # as a terminal shows them: the rate's line and where the
    check_example("loadtest-grpc-table", "\n".join([progress, result.out, *after]), labels=["stub"])  # rows went


def test_grpc_bad_targets_fail_in_one_line(grpc_stub, cli, tmp_path):
    target, behaviour = grpc_stub
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{free.getsockname()[1]}"
    down = cli("loadtest", dead, "--protocol", "grpc", "--model", "stub", "--rate", "5", "--out", tmp_path)
    assert down.code != 0 and "cannot reach the server" in down.err and "HOST:PORT" in down.err
    assert len(down.err.strip().splitlines()) == 1
    url = cli("loadtest", f"http://{target}", "--protocol", "grpc", "--model", "stub", "--rate", "5", "--out", tmp_path)
    assert url.code != 0 and "not an http:// URL" in url.err
    missing = cli("loadtest", target, "--protocol", "grpc", "--model", "nope", "--rate", "5", "--out", tmp_path)
    assert missing.code != 0 and "NOT_FOUND" in missing.err and "--model" in missing.err
    protocol = cli("loadtest", target, "--protocol", "smtp", "--rate", "5", "--out", tmp_path)
    assert protocol.code != 0 and "--protocol smtp" in protocol.err
    # The key goes as metadata, as over HTTP as a header; a grpc:// prefix is allowed.
    ok = cli("loadtest", f"grpc://{target}", "--protocol", "grpc", "--model", "stub", "--concurrency", "1",
             "--duration", "0.2", "--api-key", "s3cret", "--out", tmp_path, "--no-plot")
    assert ok.code == 0, ok.err
    assert behaviour.keys and set(behaviour.keys) == {"Bearer s3cret"} and "over grpc" in ok.out


# --------------------------------------------------------------------------------------- the client's own cost


def _spin(seconds: float) -> None:
    """Burn `seconds` of this thread's CPU time (whatever else runs on the machine)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_busy_generator_reports_its_cpu_and_is_warned(stub, cli, tmp_path, monkeypatch):
    url, _ = stub
    send = HttpTransport.send

    async def expensive_send(self, request, scheduled, timeout):  # 50 ms of CPU on the client's event loop
        _spin(0.05)
        return await send(self, request, scheduled, timeout)

    monkeypatch.setattr(HttpTransport, "send", expensive_send)
    # 40 requests/s x 50 ms = 2 cores of work for a one-thread client: it must fall behind its schedule.
    row = lt.run_load(settings(url, rate=40.0, duration=1.0, warmup=0))
    assert row["client_cpu_s"] >= 0.05 * row["sent"]  # every spin is in the process's CPU time
    assert 0.0 < row["client_cpu"] <= (os.cpu_count() or 1) + 0.1  # cores, over the measurement's wall time
    assert row["send_lag_p99_ms"] > 200 and any("fell behind its schedule" in w for w in row["client_warnings"])
    result = cli("loadtest", url, "--model", "stub", "--rate", "40", "--duration", "1", "--warmup", "0",
                 "--out", tmp_path, "--no-plot")
    assert result.code == 0, result.err
    assert "client CPU" in result.out and "warning (rate 40/s): " in result.out
    assert next(line for line in result.out.splitlines() if line.strip().startswith("40/s")).split()[-2].endswith("!")


def test_client_warnings_name_cpu_and_lag():
    row = {"mode": "open", "client_cpu": 0.85, "send_lag_p99_ms": 2.0}
    assert len(lt.client_warnings(row)) == 1 and "85% of a core" in lt.client_warnings(row)[0]
    assert lt.client_warnings({**row, "client_cpu": 0.3}) == []
    late = lt.client_warnings({**row, "client_cpu": 0.3, "send_lag_p99_ms": 25.0})
    assert len(late) == 1 and "25 ms after their scheduled time" in late[0]
    # A closed loop sends when the previous answer came: it has no schedule to lag behind.
    assert lt.client_warnings({"mode": "closed", "client_cpu": 0.3, "send_lag_p99_ms": 25.0}) == []


def test_statistics_extension_counters_give_the_same_server_figures():
    """gRPC reads Triton's statistics (JSON form: int64 as strings, zeros left out) where HTTP reads /metrics."""
    before = statistics_counters({"name": "m", "inference_count": "10", "execution_count": "10",
                                  "inference_stats": {"success": {"count": "10", "ns": "100000000"},
                                                      "queue": {"count": "10", "ns": "10000000"},
                                                      "compute_infer": {"count": "10", "ns": "50000000"}}})
    after = statistics_counters({"name": "m", "inference_count": "50", "execution_count": "30",
                                 "inference_stats": {"success": {"count": "50", "ns": "500000000"},
                                                     "fail": {"count": "3"},
                                                     "queue": {"count": "50", "ns": "90000000"},
                                                     "compute_infer": {"count": "50", "ns": "450000000"}}})
    stats = server_stats(before, after)
    assert stats["metrics"] == "statistics" and stats["inferences"] == 40 and stats["avg_batch"] == 2.0
    assert stats["queue_ms"] == pytest.approx(2.0) and stats["compute_ms"] == pytest.approx(10.0)
    assert stats["request_ms"] == pytest.approx(10.0) and stats["outcomes"] == {"success": 40, "fail": 3}



def test_table_and_plot_from_rows(tmp_path):
    rows = [{"mode": "open", "rate": r, "concurrency": None, "offered_rate": r, "achieved_rate": r, "ok": 10,
             "rejected": 0, "error": 0, "timeout": 0, "not_sent": 0, "p50_ms": 5.0 * r, "p90_ms": 8.0 * r,
             "p99_ms": 10.0 * r, "p999_ms": 12.0 * r, "slo_ms": 100.0, "slo_met": r <= 10,
             "server": {"avg_batch": 1.5, "queue_ms": 1.0, "compute_ms": 3.0}} for r in (5.0, 10.0, 20.0)]
    table = format_table(rows)
    assert "MISSED" in table.splitlines()[-1] and "held" in table.splitlines()[2] and "1.50" in table
    path = plot_latency_vs_rate(rows, tmp_path / "p.png", "t")
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert plot_latency_vs_rate([{**rows[0], "mode": "closed"}], tmp_path / "q.png") is None


# --------------------------------------------------------------------------------------- against `inceptionlab serve`


class SlowTinyNet(__import__("torch").nn.Module):
    """A 3-class CNN that takes >= 10 ms per batch whatever its size, like a model whose cost is
    dominated by per-call overhead: the case dynamic batching exists for."""

    def __init__(self):
        import torch

        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                       torch.nn.Linear(4, 3))

    def forward(self, x):
        time.sleep(0.01)  # the fixed per-call cost (a real model's kernel launches, weight reads)
        return self.net(x)


@pytest.fixture
def real_servers():
    """`inceptionlab serve`'s app with a tiny model (max batch 8, 5 ms delay, queue of 4) on 127.0.0.1,
    HTTP and gRPC: (base URL, gRPC HOST:PORT)."""
    models = pytest.importorskip("inceptionlab.serve.models")
    app_module = pytest.importorskip("inceptionlab.serve.app")
    import httpx

    from inceptionlab.infer.batching import batch_buckets
    from inceptionlab.infer.runtimes import TorchSession
    from inceptionlab.models.spec import ModelSpec
    from inceptionlab.serve.service import RequestSettings

    spec = ModelSpec("tiny", 3, ["a", "b", "c"], crop_size=32, resize_size=36)
    buckets = batch_buckets(8)
    net = SlowTinyNet().eval()
    engine = models.Engine({b: TorchSession(net, "fp32", "nchw", "cpu", b) for b in buckets}, buckets)
    served = models.ServedModel("tiny", spec, "test", "eager", "fp32", "cpu", [engine], max_batch=8)
    app = app_module.create_app([served], RequestSettings(max_delay_ms=5.0, max_queue=4), grpc_address="127.0.0.1:0")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(quiet_uvicorn_config(app, log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    # uvicorn accepts connections (waiting in the listening socket's backlog until then) only after the
    # app's start-up, which starts the gRPC front end: once this answers, its port is known.
    assert httpx.get(f"{url}/v2/health/ready", timeout=60).status_code == 200
    yield url, f"127.0.0.1:{app.state.serve.grpc_port}"
    server.should_exit = True
    thread.join(timeout=30)
    sock.close()


@pytest.fixture
def real_server(real_servers):
    return real_servers[0]


def _requests_by_protocol(metrics: str, outcome: str) -> dict[str, float]:
    """inceptionlab_requests_total of `outcome` per front end, from /metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "inceptionlab_requests_total" and sample.labels["outcome"] == outcome:
                counts[sample.labels["protocol"]] = counts.get(sample.labels["protocol"], 0.0) + sample.value
    return counts


@pytest.mark.parametrize("payload", ["image", "fp32"])
def test_grpc_against_our_server_counts_what_its_metrics_count(real_servers, payload):
    import httpx

    url, target = real_servers
    before = _requests_by_protocol(httpx.get(f"{url}/metrics").text, "success")
    row = lt.run_load(lt.LoadSettings(target, model="tiny", protocol="grpc", concurrency=4, duration=1.0,
                                      payload=payload, slo_ms=1e4, warmup=2))
    after = _requests_by_protocol(httpx.get(f"{url}/metrics").text, "success")
    assert row["protocol"] == "grpc" and row["payload"] == payload
    assert row["ok"] == row["sent"] > 10 and row["rejected"] == row["error"] == row["timeout"] == 0
    # The server counted every request the client saw answered (and the 2 warm-up ones), all as gRPC.
    assert after["grpc"] - before["grpc"] == row["ok"] + 2 and after["http"] == before["http"]
    server = row["server"]  # from the statistics extension, over gRPC, around the measurement only
    assert server["metrics"] == "statistics" and server["inferences"] == row["ok"]
    assert server["outcomes"] == {"success": row["ok"], "fail": 0}
    assert server["avg_batch"] >= 1.0 and server["compute_ms"] >= 10.0  # SlowTinyNet: >= 10 ms per batch


def test_grpc_rejections_match_our_servers(real_servers):
    import httpx

    url, target = real_servers
    before = _requests_by_protocol(httpx.get(f"{url}/metrics").text, "rejected")
    # 300 requests/s against at most ~8 per 10 ms batch with a queue of 4: most are turned away.
    row = lt.run_load(lt.LoadSettings(target, model="tiny", protocol="grpc", rate=300.0, duration=1.0,
                                      payload="fp32", warmup=1))
    after = _requests_by_protocol(httpx.get(f"{url}/metrics").text, "rejected")
    assert row["rejected"] > 0 and row["ok"] > 0 and row["error"] == 0
    assert after["grpc"] - before["grpc"] == row["rejected"] and row["slo_met"] is False


def test_against_our_server_batches_form_and_metrics_agree(real_server):
    row = lt.run_load(lt.LoadSettings(real_server, model="tiny", concurrency=4, duration=1.5, payload="tensor",
                                      slo_ms=1e4, warmup=2))
    assert row["ok"] == row["sent"] > 10 and row["rejected"] == row["error"] == 0
    server = row["server"]
    assert server["metrics"] == "inceptionlab" and server["inferences"] == row["ok"]
    assert server["outcomes"]["success"] == row["ok"]
    # 4 clients and a 10 ms batch: requests arriving during a batch wait for the next one together, so
    # executions are fewer than inferences. How many share a batch depends on the client's speed: 1.33
    # on an idle 2-core machine, 1.5-2 under load; 1 would mean no batching at all.
    assert server["avg_batch"] > 1.1 and server["compute_ms"] >= 10.0
    image = lt.run_load(lt.LoadSettings(real_server, model="tiny", concurrency=2, duration=0.5, payload="image",
                                        warmup=1))
    assert image["ok"] > 0 and image["error"] == 0


def test_against_our_server_503s_match_its_rejections(real_server):
    # 300 requests/s against at most ~8 per 10 ms batch with a queue of 4: most are turned away.
    row = lt.run_load(lt.LoadSettings(real_server, model="tiny", rate=300.0, duration=1.0, payload="tensor",
                                      warmup=1))
    assert row["rejected"] > 0 and row["ok"] > 0 and row["error"] == 0
    assert row["server"]["outcomes"]["rejected"] == row["rejected"]
    assert row["slo_met"] is False


def test_the_load_generator_imports_no_torch_and_nothing_of_serve_but_the_protocol():
    """Start-up time of a client, and the layer contract: what `inceptionlab loadtest` imports to run
    (over gRPC too: the message definitions, not the server)."""
    modules = ("inceptionlab.cli.loadtest", "inceptionlab.loadtest.generator", "inceptionlab.loadtest.report",
               "inceptionlab.loadtest.grpc_client", "inceptionlab.fileio")
    script = (f"import json, sys\nfor name in {modules!r}: __import__(name)\n"
              "print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert not [m for m in loaded if m == "torch" or m.startswith(("torch.", "torchvision"))]
    assert [m for m in loaded if m.startswith("inceptionlab.serve")] == \
        ["inceptionlab.serve", "inceptionlab.serve.proto", "inceptionlab.serve.protocol"]


@pytest.mark.parametrize("body", ["raw", "multipart"])
def test_image_files_as_the_body_or_a_form_go_to_our_classify_route(real_server, body):
    """What a web page or a phone sends: the file itself (raw) or a form with it (multipart), to
    /v1/classify, each answered and counted by the server as an HTTP request of the model."""
    import httpx

    before = _requests_by_protocol(httpx.get(f"{real_server}/metrics").text, "success")
    row = lt.run_load(lt.LoadSettings(real_server, model="tiny", concurrency=2, duration=0.5, payload="image",
                                      body=body, slo_ms=1e4, warmup=1))
    after = _requests_by_protocol(httpx.get(f"{real_server}/metrics").text, "success")
    assert row["ok"] == row["sent"] > 0 and row["error"] == row["rejected"] == 0
    assert after["http"] - before["http"] == row["ok"] + 1 and row["server"]["inferences"] == row["ok"]
    with pytest.raises(UserError, match="body raw sends image files: use payload image"):
        lt.run_load(lt.LoadSettings(real_server, model="tiny", concurrency=1, duration=0.2, payload="tensor",
                                    body="raw"))


def test_a_multipart_body_is_one_file_field_as_a_form_parser_reads_it():
    from starlette.datastructures import Headers
    from starlette.formparsers import MultiPartParser

    prepared = file_body(b"\x89PNG fake bytes", "multipart")

    async def parse():
        async def stream():
            yield prepared.body

        return await MultiPartParser(Headers(prepared.headers), stream()).parse()

    form = asyncio.run(parse())
    (upload,) = [value for _, value in form.multi_items()]
    assert asyncio.run(upload.read()) == b"\x89PNG fake bytes"
    assert file_body(b"abc", "raw") == Prepared(b"abc", {"Content-Type": "application/octet-stream"})
    assert request_path(None, "raw", "demo") == "/v1/classify?model=demo"
    assert request_path(None, "json", "demo") == "/v2/models/demo/infer"
    assert request_path("/predict/{model}", "multipart", "demo") == "/predict/demo"
