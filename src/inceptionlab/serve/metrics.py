"""Prometheus metrics of one server (its own CollectorRegistry: two apps in one process, as in the
tests, never share or clash). Names follow Triton's idea: inferences (items) vs executions
(batches) give the average batch size; queue and compute time are histograms. Triton's statistics
extension (`/v2/models/NAME/stats`, gRPC ModelStatistics) is read from these same series (`figures`),
and so is the page's live view (live.py, from `snapshot`).

Per-request series carry the front end (`protocol`: http or grpc) as well as the model; per-batch
series only the model, since one batch mixes requests of both protocols."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from inceptionlab.serve.batcher import BatchStats

# Seconds: 0.5 ms (a batch-1 CIFAR CNN) .. 10 s (a queue wait under overload), in steps of at most 1.67x:
# the page's p50/p99 are interpolated inside a bucket (as Prometheus' histogram_quantile does), so a
# step of 1.5-1.67x bounds their error to a fraction of the value rather than 2.5x with 1-2-5 steps.
TIME_BUCKETS = (0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
                0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
OUTCOMES = ("success", "bad_request", "rejected", "timeout", "cancelled", "error")
PROTOCOLS = ("http", "grpc")


class ServeMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("inceptionlab_requests", "Inference requests by model, front end (http, grpc) and "
                                "outcome (success, bad_request, rejected = queue full or draining, timeout, "
                                "cancelled = a gRPC client gave up, error)",
                                ["model", "protocol", "outcome"], registry=r)
        self.inferences = Counter("inceptionlab_inferences", "Items inferred (images or texts)", ["model"], registry=r)
        self.executions = Counter("inceptionlab_executions", "Batches executed (inferences / executions = "
                                  "average batch size)", ["model"], registry=r)
        self.batch_size = Histogram("inceptionlab_batch_size", "Items per executed batch", ["model"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.queue_time = Histogram("inceptionlab_queue_seconds", "Time a request waited for its batch to start",
                                    ["model"], buckets=TIME_BUCKETS, registry=r)
        self.compute_time = Histogram("inceptionlab_compute_seconds", "Time one batch took to compute",
                                      ["model"], buckets=TIME_BUCKETS, registry=r)
        self.request_time = Histogram("inceptionlab_request_seconds", "Whole request time in the server "
                                      "(parse, decode, queue, compute, encode), every outcome",
                                      ["model", "protocol"], buckets=TIME_BUCKETS, registry=r)
        # Latency percentiles are of successful requests: a full queue's fast refusals would pull them down.
        self.success_time = Histogram("inceptionlab_success_seconds", "Whole request time of successful requests",
                                      ["model", "protocol"], buckets=TIME_BUCKETS, registry=r)
        self.pending = Gauge("inceptionlab_pending_requests", "Requests queued or computing", ["model"], registry=r)
        # Triton's statistics count a batch's compute time once per request in it, and time successes apart.
        self.request_compute = Counter("inceptionlab_request_compute_seconds", "Compute time summed over "
                                       "requests (a batch's time once per request in it)", ["model"], registry=r)
        self.last_inference = Gauge("inceptionlab_last_inference_timestamp_seconds", "When the last batch "
                                    "finished (Unix time)", ["model"], registry=r)
        self._request_series: dict[tuple[str, str, str], tuple[Any, Any, Any]] = {}  # record_request's, by labels

    def add_model(self, name: str, pending: Callable[[], int]) -> None:
        self.pending.labels(name).set_function(pending)
        for protocol in PROTOCOLS:  # every series exists from the start: rate() sees the first event
            self.request_time.labels(name, protocol)
            self.success_time.labels(name, protocol)
            for outcome in OUTCOMES:
                self.requests.labels(name, protocol, outcome)

    def on_batch(self, name: str) -> Callable[[BatchStats], None]:
        # The model's series, looked up once: `labels()` validates and locks at every call (~10 calls a request).
        inferences, executions_total, batch_size, compute_time, request_compute, last_inference, queue_time = (
            series.labels(name) for series in (self.inferences, self.executions, self.batch_size, self.compute_time,
                                               self.request_compute, self.last_inference, self.queue_time))

        def record(stats: BatchStats) -> None:
            inferences.inc(stats.items)
            executions = stats.executions()
            executions_total.inc(len(executions))
            for items in executions:  # consecutive batches of one request: each its share of the time
                batch_size.observe(items)
                compute_time.observe(stats.compute_seconds / len(executions))
            request_compute.inc(stats.compute_seconds * stats.requests)
            last_inference.set_to_current_time()
            for wait in stats.queue_seconds:
                queue_time.observe(wait)

        return record

    def record_request(self, name: str, protocol: str, outcome: str, seconds: float) -> None:
        key = (name, protocol, outcome)
        if key not in self._request_series:
            self._request_series[key] = (self.requests.labels(*key), self.request_time.labels(name, protocol),
                                         self.success_time.labels(name, protocol) if outcome == "success" else None)
        count, time, success = self._request_series[key]
        count.inc()
        time.observe(seconds)
        if success is not None:
            success.observe(seconds)

    def figures(self, name: str) -> "ModelFigures":
        """One model's cumulative figures, read back from the registry."""
        def value(sample: str, **labels: str) -> float:
            return self.registry.get_sample_value(sample, {"model": name, **labels}) or 0.0

        def both(sample: str, **labels: str) -> float:  # summed over the front ends
            return sum(value(sample, protocol=p, **labels) for p in PROTOCOLS)

        return ModelFigures(
            requests=int(sum(both("inceptionlab_requests_total", outcome=o) for o in OUTCOMES)),
            successes=int(both("inceptionlab_requests_total", outcome="success")),
            inferences=int(value("inceptionlab_inferences_total")),
            executions=int(value("inceptionlab_executions_total")),
            executed_requests=int(value("inceptionlab_queue_seconds_count")),
            request_seconds=both("inceptionlab_request_seconds_sum"),
            success_seconds=both("inceptionlab_success_seconds_sum"),
            queue_seconds=value("inceptionlab_queue_seconds_sum"),
            compute_seconds=value("inceptionlab_request_compute_seconds_total"),
            last_inference_s=value("inceptionlab_last_inference_timestamp_seconds"),
        )

    def snapshot(self) -> dict[str, "ModelSnapshot"]:
        """Every model's cumulative counts now, in one pass over the registry (the page's live view
        samples this every second; get_sample_value would walk the registry once per value)."""
        models: dict[str, ModelSnapshot] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                labels = sample.labels
                if "model" not in labels:
                    continue
                model = models.setdefault(labels["model"], ModelSnapshot())
                if sample.name == "inceptionlab_inferences_total":
                    model.inferences = sample.value
                elif sample.name == "inceptionlab_executions_total":
                    model.executions = sample.value
                elif sample.name == "inceptionlab_pending_requests":
                    model.pending = sample.value
                elif sample.name == "inceptionlab_requests_total":
                    model.requests.setdefault(labels["protocol"], {})[labels["outcome"]] = sample.value
                elif sample.name == "inceptionlab_success_seconds_bucket":
                    model.latency.setdefault(labels["protocol"], []).append((float(labels["le"]), sample.value))
        for model in models.values():
            for buckets in model.latency.values():
                buckets.sort()
        return models

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class ModelFigures:
    requests: int  # every outcome
    successes: int
    inferences: int  # items
    executions: int  # batches
    executed_requests: int  # requests that reached a batch (each waited in the queue once)
    request_seconds: float  # summed over all requests
    success_seconds: float
    queue_seconds: float
    compute_seconds: float  # summed over executed requests
    last_inference_s: float  # Unix time; 0 before the first batch


@dataclass
class ModelSnapshot:
    """One model's cumulative counts at one moment (ServeMetrics.snapshot)."""

    inferences: float = 0.0  # items
    executions: float = 0.0  # batches
    pending: float = 0.0  # queued or computing, now
    requests: dict[str, dict[str, float]] = field(default_factory=dict)  # protocol -> outcome -> count
    # protocol -> (upper bound s, cumulative count) of successful requests' time, ending with +Inf
    latency: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
