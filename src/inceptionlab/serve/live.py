"""The server at work, for the page: what its own metrics say happened over the last seconds, per
model and front end, kept for the last minutes.

Every PERIOD_S the metrics registry is sampled (ServeMetrics.snapshot: the same series /metrics
shows). Each point of the view is the difference between a sample and the one SPAN_S before it:
per model and protocol, requests/s, rejections/s (queue full or draining), other errors/s, and p50/p99
of successful requests' time in the server, interpolated inside the histogram's buckets as
Prometheus' histogram_quantile does; per model (a batch mixes both protocols), items/s, the average
batch size (items / batches: above 1 means dynamic batching is at work) and the queue depth at that
moment. `GET /v1/live` answers `view()` (app.py); the page polls it every second and draws it.

Cost, on a 2-core AMD EPYC with one model: a sample ~0.5 ms of the event loop a second (0.05% of a
core), a view of 5 minutes ~5 ms (15 kB of JSON), only while a page is open.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import time
from collections import deque
from typing import Any, Sequence

from inceptionlab.serve.metrics import OUTCOMES, ModelSnapshot, ServeMetrics

log = logging.getLogger(__name__)

PERIOD_S = 1.0
SPAN_S = 5.0  # each point covers the last 5 s: at 20 requests/s a p99 of ~100 requests, not ~20
HISTORY_S = 300.0  # the chart's last 5 minutes (~300 samples per model: a few kB of JSON)
FAILURES = tuple(o for o in OUTCOMES if o not in ("success", "rejected"))  # the page's "errors"


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile of a histogram given as (upper bound, cumulative count) pairs ending with +Inf,
    linear inside the bucket that holds it (Prometheus' histogram_quantile); in the +Inf bucket, the
    highest finite bound. None when the histogram is empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


class LiveStats:
    """Samples of one server's metrics over the last HISTORY_S, and the page's view of them."""

    def __init__(self, metrics: ServeMetrics, period_s: float = PERIOD_S, span_s: float = SPAN_S,
                 history_s: float = HISTORY_S):
        self.metrics = metrics
        self.period_s, self.span_s, self.history_s = period_s, span_s, history_s
        self.samples: deque[tuple[float, dict[str, ModelSnapshot]]] = deque(
            maxlen=math.ceil((history_s + span_s) / period_s) + 1)

    def sample(self, now: float | None = None) -> None:
        self.samples.append((time.monotonic() if now is None else now, self.metrics.snapshot()))

    async def run(self) -> None:
        """Sample every period_s until cancelled (the app's lifespan). A failed sample is logged and
        the next one tried: the page's figures never stop the server."""
        while True:
            try:
                self.sample()
            except Exception:
                log.exception("live figures: sampling the metrics failed")
            await asyncio.sleep(self.period_s)

    def view(self, protocols: Sequence[str]) -> dict[str, Any]:
        """Per model: times (s, 0 = the newest sample, negative before) and a value per time of each
        figure; per protocol also the totals since start. No points before two samples exist."""
        samples = list(self.samples)
        times = [t for t, _ in samples]
        newest = times[-1] if times else 0.0
        # Each point against the sample SPAN_S earlier (half a period of slack for the timer's jitter),
        # or the oldest one while the server is younger than that.
        pairs = [(i, max(0, bisect.bisect_right(times, t - self.span_s + self.period_s / 2) - 1))
                 for i, t in enumerate(times) if i > 0 and newest - t <= self.history_s]
        models = {}
        for name, latest in (samples[-1][1].items() if samples else ()):
            steps = [(samples[j][1].get(name, ModelSnapshot()), samples[i][1][name], times[i] - times[j])
                     for i, j in pairs]
            models[name] = {
                "t": [round(times[i] - newest, 1) for i, _ in pairs],
                **_columns([_model_point(*step) for step in steps], ("items_per_s", "avg_batch", "pending")),
                "protocols": {p: _protocol_view(p, latest, steps) for p in protocols},
            }
        return {"period_s": self.period_s, "span_s": self.span_s, "history_s": self.history_s,
                "protocols": list(protocols), "models": models}


def _columns(points: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, list[Any]]:
    return {key: [point[key] for point in points] for key in keys}


def _model_point(before: ModelSnapshot, after: ModelSnapshot, seconds: float) -> dict[str, Any]:
    items, batches = after.inferences - before.inferences, after.executions - before.executions
    return {"items_per_s": _rate(items, seconds), "avg_batch": round(items / batches, 2) if batches > 0 else None,
            "pending": int(after.pending)}


def _protocol_view(protocol: str, latest: ModelSnapshot, steps: list[tuple[ModelSnapshot, ModelSnapshot, float]]
                   ) -> dict[str, Any]:
    totals = latest.requests.get(protocol, {})
    points = [_protocol_point(protocol, *step) for step in steps]
    return {"requests": int(sum(totals.values())), "rejected": int(totals.get("rejected", 0)),
            "errors": int(sum(totals.get(o, 0) for o in FAILURES)),
            **_columns(points, ("requests_per_s", "rejected_per_s", "errors_per_s", "p50_ms", "p99_ms"))}


def _protocol_point(protocol: str, before: ModelSnapshot, after: ModelSnapshot, seconds: float) -> dict[str, Any]:
    old, new = before.requests.get(protocol, {}), after.requests.get(protocol, {})

    def delta(*outcomes: str) -> float:
        return sum(new.get(o, 0.0) - old.get(o, 0.0) for o in outcomes)

    earlier = dict(before.latency.get(protocol, []))
    buckets = [(bound, count - earlier.get(bound, 0.0)) for bound, count in after.latency.get(protocol, [])]
    p50, p99 = bucket_quantile(0.5, buckets), bucket_quantile(0.99, buckets)
    return {"requests_per_s": _rate(delta(*new), seconds), "rejected_per_s": _rate(delta("rejected"), seconds),
            "errors_per_s": _rate(delta(*FAILURES), seconds),
            "p50_ms": None if p50 is None else round(p50 * 1e3, 2),
            "p99_ms": None if p99 is None else round(p99 * 1e3, 2)}


def _rate(count: float, seconds: float) -> float:
    return round(count / seconds, 2) if seconds > 0 else 0.0
