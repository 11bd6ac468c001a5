"""The page's live figures (serve/live.py, GET /v1/live): rates, latency percentiles from the
histogram's buckets, batch size and queue depth per model and front end, from the server's own
metrics. (The page drawing them: test_serve_browser.py.)"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from helpers.page_examples import check_example
from serve_helpers import classify_over_both, serve_model, train_tiny_run, uvicorn_thread

from inceptionlab.serve.batcher import BatchStats
from inceptionlab.serve.live import LiveStats, bucket_quantile
from inceptionlab.serve.metrics import TIME_BUCKETS, ServeMetrics


def test_bucket_quantile_is_prometheus_histogram_quantile():
    buckets = [(0.001, 0.0), (0.002, 10.0), (0.005, 10.0), (float("inf"), 10.0)]
    assert bucket_quantile(0.5, buckets) == pytest.approx(0.0015)  # rank 5 of 10, halfway through (1, 2] ms
    assert bucket_quantile(1.0, buckets) == pytest.approx(0.002)
    assert bucket_quantile(0.5, [(0.001, 0.0), (float("inf"), 0.0)]) is None
    # Beyond the last finite bound: that bound (Prometheus' answer too).
    assert bucket_quantile(0.99, [(0.001, 1.0), (0.01, 1.0), (float("inf"), 100.0)]) == 0.01


def test_percentiles_from_the_servers_buckets_are_close_to_the_exact_ones():
    metrics = ServeMetrics()
    metrics.add_model("m", lambda: 0)
    live = LiveStats(metrics)
    live.sample(now=0.0)
    latencies = np.random.default_rng(0).lognormal(np.log(0.03), 0.5, size=2000)  # ~30 ms, a long right tail
    for seconds in latencies:
        metrics.record_request("m", "http", "success", float(seconds))
    live.sample(now=1.0)
    http = live.view(["http"])["models"]["m"]["protocols"]["http"]
    exact_p50, exact_p99 = np.percentile(latencies, [50, 99]) * 1e3
    # Buckets step by at most 1.67x (TIME_BUCKETS): interpolated inside one, off by a fraction of the value.
    assert max(b / a for a, b in zip(TIME_BUCKETS, TIME_BUCKETS[1:])) <= 1.67
    assert http["p50_ms"][-1] == pytest.approx(exact_p50, rel=0.1)
    assert http["p99_ms"][-1] == pytest.approx(exact_p99, rel=0.15)


def test_live_view_rates_batches_and_queue_per_model_and_protocol():
    metrics = ServeMetrics()
    queued = {"m": 3}
    metrics.add_model("m", lambda: queued["m"])
    record_batch = metrics.on_batch("m")
    live = LiveStats(metrics, period_s=1.0, span_s=5.0, history_s=10.0)
    live.sample(now=0.0)
    for _ in range(10):
        metrics.record_request("m", "http", "success", 0.012)
    for _ in range(4):
        metrics.record_request("m", "grpc", "success", 0.020)
    metrics.record_request("m", "grpc", "rejected", 0.0001)
    metrics.record_request("m", "http", "bad_request", 0.001)
    for _ in range(7):  # 14 items in 7 batches: 2 per batch
        record_batch(BatchStats(requests=2, items=2, queue_seconds=[0.001, 0.002], compute_seconds=0.01))
    live.sample(now=1.0)
    view = live.view(["http", "grpc"])
    model = view["models"]["m"]
    http, grpc = model["protocols"]["http"], model["protocols"]["grpc"]
    assert view["protocols"] == ["http", "grpc"] and model["t"] == [0.0]
    # Younger than the 5 s span: the rates are over the 1 s the server has existed.
    assert (http["requests"], http["rejected"], http["errors"]) == (11, 0, 1)
    assert (grpc["requests"], grpc["rejected"], grpc["errors"]) == (5, 1, 0)
    assert http["requests_per_s"] == [11.0] and grpc["rejected_per_s"] == [1.0] and http["errors_per_s"] == [1.0]
    assert 10.0 <= http["p50_ms"][0] <= 15.0 and 15.0 <= grpc["p50_ms"][0] <= 20.0  # inside their buckets
    assert model["avg_batch"] == [2.0] and model["items_per_s"] == [14.0] and model["pending"] == [3]
    # Quiet for 6 s: each point covers the 5 s before it, so the burst leaves the figures.
    queued["m"] = 0
    for second in range(2, 8):
        live.sample(now=float(second))
    model = live.view(["http", "grpc"])["models"]["m"]
    assert model["t"] == [-6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0]
    assert model["protocols"]["http"]["requests_per_s"] == [11.0, 5.5, 3.67, 2.75, 2.2, 0.0, 0.0]
    assert model["protocols"]["http"]["p50_ms"][-1] is None and model["avg_batch"][-1] is None
    assert model["pending"][-1] == 0 and model["protocols"]["http"]["requests"] == 11  # totals stay
    # Only the last history_s are kept in the view.
    for second in range(8, 30):
        live.sample(now=float(second))
    assert live.view(["http"])["models"]["m"]["t"][0] == -10.0


def test_live_endpoint_tells_the_protocols_apart(tmp_path_factory):
    """Requests over HTTP and gRPC to one model: /v1/live and /metrics count each under its front end."""

    from inceptionlab.serve.app import create_app
    from inceptionlab.serve.service import RequestSettings

    run_dir, data = train_tiny_run(tmp_path_factory)
    image = sorted((data / "val").rglob("*.png"))[0].read_bytes()
    app = create_app([serve_model(run_dir)], RequestSettings(), grpc_address="127.0.0.1:0")
    with uvicorn_thread(app) as base:
        classify_over_both(base, app.state.serve.grpc_port, image, http_calls=3, grpc_calls=2)
        app.state.live.sample()  # the sampler's next tick, now
        live = httpx.get(f"{base}/v1/live").json()
        metrics = httpx.get(f"{base}/metrics").text
    assert live["protocols"] == ["http", "grpc"]
    check_example("server-live", json.dumps(live))
    protocols = live["models"]["tiny"]["protocols"]
    assert protocols["http"]["requests"] == 3 and protocols["grpc"]["requests"] == 2
    assert protocols["http"]["p50_ms"][-1] > 0 and protocols["grpc"]["requests_per_s"][-1] > 0
    assert live["models"]["tiny"]["avg_batch"][-1] >= 1.0
    assert 'inceptionlab_requests_total{model="tiny",outcome="success",protocol="grpc"} 2.0' in metrics
    assert 'inceptionlab_requests_total{model="tiny",outcome="success",protocol="http"} 3.0' in metrics
    assert 'inceptionlab_success_seconds_count{model="tiny",protocol="http"} 3.0' in metrics
