"""The server's own view of a measurement, read before and after it: over HTTP from its `/metrics`
(Prometheus text), over gRPC from Triton's statistics extension (ModelStatistics).

inferences / executions = average batch size, and mean queue and compute time per request, from our
server's `inceptionlab_*` metrics, Triton's `nv_inference_*`, or either's statistics.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# Counters read from /metrics, per server family. Times are cumulative; `scale` turns them into ms.
# Ours are prometheus-client histograms (`_sum` in seconds, `_count`): queue and whole-request time
# per request, compute time per executed batch. Triton's are microsecond counters summed over
# requests (a batch's compute time counts once per request in it), divided by successful requests.
METRIC_FAMILIES = {
    "inceptionlab": {
        "inferences": "inceptionlab_inferences_total", "executions": "inceptionlab_executions_total",
        "queue": "inceptionlab_queue_seconds_sum", "queue_count": "inceptionlab_queue_seconds_count",
        "compute": "inceptionlab_compute_seconds_sum", "compute_count": "inceptionlab_compute_seconds_count",
        "request": "inceptionlab_request_seconds_sum", "request_count": "inceptionlab_request_seconds_count",
        "scale": 1e3,
    },
    "triton": {
        "inferences": "nv_inference_count", "executions": "nv_inference_exec_count",
        "queue": "nv_inference_queue_duration_us", "queue_count": "nv_inference_request_success",
        "compute": "nv_inference_compute_infer_duration_us", "compute_count": "nv_inference_request_success",
        "request": "nv_inference_request_duration_us", "request_count": "nv_inference_request_success",
        "scale": 1e-3,
    },
    # Triton's statistics extension (ours answers it from the same counters as /metrics): nanoseconds
    # summed over requests, flattened by statistics_counters. Outcomes: success and fail only.
    "statistics": {
        "inferences": "inference_count", "executions": "execution_count",
        "queue": "queue_ns", "queue_count": "queue_count",
        "compute": "compute_infer_ns", "compute_count": "compute_infer_count",
        "request": "success_ns", "request_count": "success_count",
        "scale": 1e-6,
    },
}


def parse_metrics(text: str, model: str | None = None) -> dict[str, float]:
    """Prometheus text -> {sample name: value summed over label sets}, keeping only samples of
    `model` when they carry a model label (Triton and ours label per model)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):  # prometheus-client's series creation timestamps
                continue
            if model is not None and "model" in sample.labels and sample.labels["model"] != model:
                continue
            key = sample.name if not sample.labels.get("outcome") else f"{sample.name}{{outcome={sample.labels['outcome']}}}"
            values[key] = values.get(key, 0.0) + float(sample.value)
    return values


def statistics_counters(model_stats: dict[str, Any]) -> dict[str, float]:
    """One model's entry of the statistics extension, in its JSON form (int64 values may be strings,
    zeros left out), flattened into the counters METRIC_FAMILIES["statistics"] names."""
    values = {"inference_count": float(model_stats.get("inference_count", 0)),
              "execution_count": float(model_stats.get("execution_count", 0))}
    for part, duration in model_stats.get("inference_stats", {}).items():
        values[f"{part}_count"] = float(duration.get("count", 0))
        values[f"{part}_ns"] = float(duration.get("ns", 0))
    for outcome in ("success", "fail"):
        values[f"statistics{{outcome={outcome}}}"] = values.get(f"{outcome}_count", 0.0)
    return values


def server_stats(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any]:
    """What the server saw during a measurement: average batch size and mean queue/compute ms per
    request, from the difference of its counters. {} when it has no metrics we know. `request_ms`
    (the whole request inside the server) minus queue and compute is parsing, decoding and encoding."""
    if not before or not after:
        return {}
    for family, names in METRIC_FAMILIES.items():
        if names["inferences"] not in after:
            continue
        delta = {key: after.get(name, 0.0) - before.get(name, 0.0)
                 for key, name in names.items() if isinstance(name, str)}
        stats: dict[str, Any] = {"metrics": family, "inferences": int(delta["inferences"]),
                                 "executions": int(delta["executions"])}
        stats["avg_batch"] = round(delta["inferences"] / delta["executions"], 3) if delta["executions"] > 0 else None
        for part in ("queue", "compute", "request"):
            count = delta[f"{part}_count"]
            stats[f"{part}_ms"] = round(delta[part] * names["scale"] / count, 3) if count > 0 else None
        stats["outcomes"] = _outcome_deltas(before, after)
        return stats
    return {}


def _outcome_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    outcomes = {}
    for key, value in after.items():
        if "{outcome=" in key:
            outcome = key.split("{outcome=", 1)[1].rstrip("}")
            outcomes[outcome] = int(value - before.get(key, 0.0))
    return outcomes


async def scrape(session: aiohttp.ClientSession, url: str, model: str | None) -> dict[str, float] | None:
    """The server's counters now, or None when it has no readable /metrics."""
    try:
        async with session.get(f"{url}/metrics") as response:
            if response.status != 200:
                return None
            return parse_metrics(await response.text(), model)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return None
