"""`inceptionlab loadtest`: the measurement maths, and the client against a stub KServe v2 server.

The stub (FastAPI + uvicorn on 127.0.0.1, a thread of this process) parses requests the way the
binary tensor extension defines them, can serve one request at a time with a fixed service time,
stall once (blocking its event loop, like a GC pause), reject with 503 or fail with 500, and
exports the counters our server exports on /metrics.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

from inceptionlab import host
from inceptionlab.errors import UserError
from inceptionlab.loadtest import generator as lt
from inceptionlab.loadtest.payloads import infer_body
from inceptionlab.loadtest.report import format_table, plot_latency_vs_rate
from inceptionlab.loadtest.server_metrics import parse_metrics, server_stats
from inceptionlab.serve.protocol import HEADER_LENGTH, encode_bytes_elements

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
from fastapi import FastAPI, Request, Response  # noqa: E402 (module level: FastAPI resolves the annotations)


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
        length = int(request.headers["Inference-Header-Content-Length"])
        header = json.loads(body[:length])
        spec = header["inputs"][0]
        data = body[length:]
        assert len(data) == spec["parameters"]["binary_data_size"]
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
    config = uvicorn.Config(stub_app(behaviour), log_level="error", lifespan="off", timeout_keep_alive=30)
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
def real_server():
    """`inceptionlab serve`'s app with a tiny model (max batch 8, 5 ms delay, queue of 4) on 127.0.0.1."""
    models = pytest.importorskip("inceptionlab.serve.models")
    app_module = pytest.importorskip("inceptionlab.serve.app")
    from inceptionlab.infer.batching import batch_buckets
    from inceptionlab.infer.runtimes import TorchSession
    from inceptionlab.models.spec import ModelSpec
    from inceptionlab.serve.service import RequestSettings

    spec = ModelSpec("tiny", 3, ["a", "b", "c"], crop_size=32, resize_size=36)
    buckets = batch_buckets(8)
    net = SlowTinyNet().eval()
    engine = models.Engine({b: TorchSession(net, "fp32", "nchw", "cpu", b) for b in buckets}, buckets)
    served = models.ServedModel("tiny", spec, "test", "eager", "fp32", "cpu", [engine], max_batch=8)
    app = app_module.create_app([served], RequestSettings(max_delay_ms=5.0, max_queue=4))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=30)
    sock.close()


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
    """Start-up time of a client, and the layer contract: what `inceptionlab loadtest` imports to run."""
    modules = ("inceptionlab.cli.loadtest", "inceptionlab.loadtest.generator", "inceptionlab.loadtest.report",
               "inceptionlab.fileio")
    script = (f"import json, sys\nfor name in {modules!r}: __import__(name)\n"
              "print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert not [m for m in loaded if m == "torch" or m.startswith(("torch.", "torchvision"))]
    assert [m for m in loaded if m.startswith("inceptionlab.serve")] == ["inceptionlab.serve", "inceptionlab.serve.protocol"]
