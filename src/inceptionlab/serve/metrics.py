"""Prometheus metrics of one server (its own CollectorRegistry: two apps in one process, as in the
tests, never share or clash). Names follow Triton's idea: inferences (items) vs executions
(batches) give the average batch size; queue and compute time are histograms."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from inceptionlab.serve.batcher import BatchStats

# Seconds: 0.5 ms (a batch-1 CIFAR CNN) .. 10 s (a queue wait under overload).
TIME_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
OUTCOMES = ("success", "bad_request", "rejected", "timeout", "error")


class ServeMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("inceptionlab_requests", "Inference requests by model and outcome "
                                "(success, bad_request, rejected = queue full or draining, timeout, error)",
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
            for wait in stats.queue_seconds:
                self.queue_time.labels(name).observe(wait)

        return record

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
