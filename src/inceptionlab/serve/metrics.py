"""Prometheus metrics of one server (its own CollectorRegistry: two apps in one process, as in the
tests, never share or clash). Names follow Triton's idea: inferences (items) vs executions
(batches) give the average batch size; queue and compute time are histograms. Triton's statistics
extension (`/v2/models/NAME/stats`, gRPC ModelStatistics) is read from these same series (`figures`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from inceptionlab.serve.batcher import BatchStats

# Seconds: 0.5 ms (a batch-1 CIFAR CNN) .. 10 s (a queue wait under overload).
TIME_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
OUTCOMES = ("success", "bad_request", "rejected", "timeout", "cancelled", "error")


class ServeMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("inceptionlab_requests", "Inference requests by model and outcome "
                                "(success, bad_request, rejected = queue full or draining, timeout, cancelled = a gRPC "
                                "client gave up, error)",
                                ["model", "outcome"], registry=r)
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
                                      "(parse, decode, queue, compute, encode)", ["model"], buckets=TIME_BUCKETS,
                                      registry=r)
        self.pending = Gauge("inceptionlab_pending_requests", "Requests queued or computing", ["model"], registry=r)
        # Triton's statistics count a batch's compute time once per request in it, and time successes apart.
        self.request_compute = Counter("inceptionlab_request_compute_seconds", "Compute time summed over "
                                       "requests (a batch's time once per request in it)", ["model"], registry=r)
        self.success_time = Counter("inceptionlab_success_seconds", "Whole request time of successful requests",
                                    ["model"], registry=r)
        self.last_inference = Gauge("inceptionlab_last_inference_timestamp_seconds", "When the last batch "
                                    "finished (Unix time)", ["model"], registry=r)

    def add_model(self, name: str, pending: Callable[[], int]) -> None:
        self.pending.labels(name).set_function(pending)
        for outcome in OUTCOMES:  # every series exists from the start: rate() sees the first event
            self.requests.labels(name, outcome)

    def on_batch(self, name: str) -> Callable[[BatchStats], None]:
        def record(stats: BatchStats) -> None:
            self.inferences.labels(name).inc(stats.items)
            self.executions.labels(name).inc()
            self.batch_size.labels(name).observe(stats.items)
            self.compute_time.labels(name).observe(stats.compute_seconds)
            self.request_compute.labels(name).inc(stats.compute_seconds * stats.requests)
            self.last_inference.labels(name).set_to_current_time()
            for wait in stats.queue_seconds:
                self.queue_time.labels(name).observe(wait)

        return record

    def record_request(self, name: str, outcome: str, seconds: float) -> None:
        self.requests.labels(name, outcome).inc()
        self.request_time.labels(name).observe(seconds)
        if outcome == "success":
            self.success_time.labels(name).inc(seconds)

    def figures(self, name: str) -> "ModelFigures":
        """One model's cumulative figures, read back from the registry."""
        def value(sample: str, **labels: str) -> float:
            return self.registry.get_sample_value(sample, {"model": name, **labels}) or 0.0

        return ModelFigures(
            requests=int(sum(value("inceptionlab_requests_total", outcome=o) for o in OUTCOMES)),
            successes=int(value("inceptionlab_requests_total", outcome="success")),
            inferences=int(value("inceptionlab_inferences_total")),
            executions=int(value("inceptionlab_executions_total")),
            executed_requests=int(value("inceptionlab_queue_seconds_count")),
            request_seconds=value("inceptionlab_request_seconds_sum"),
            success_seconds=value("inceptionlab_success_seconds_total"),
            queue_seconds=value("inceptionlab_queue_seconds_sum"),
            compute_seconds=value("inceptionlab_request_compute_seconds_total"),
            last_inference_s=value("inceptionlab_last_inference_timestamp_seconds"),
        )

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
