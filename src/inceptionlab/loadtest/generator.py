"""Load generator for any Open Inference Protocol (KServe v2) server: ours, Triton, KServe.

    settings = LoadSettings("http://127.0.0.1:8000", model="inception_v3", rate=20, duration=10)
    result = run_load(settings)                      # one open-loop (or closed-loop) measurement
    sweep = run_sweep(settings)                      # raise the rate until p99 > SLO

Two ways to offer load:

* **open loop** (`rate`): arrivals follow a Poisson process fixed in advance (seeded), and each
  request's latency is measured from its *scheduled* send time. A server that stalls for 300 ms
  therefore shows 300 ms of lateness on every request that was due during the stall, not only on
  the one it was serving (MLPerf LoadGen's server scenario; a closed loop would simply stop asking,
  "coordinated omission").
* **closed loop** (`concurrency`): C clients each send, wait for the answer, and send again.

Requests go over HTTP (`POST /v2/models/{name}/infer` with the binary tensor data extension, or
`body="json"`: the plain JSON form, for servers without the extension) or gRPC (ModelInfer with
`raw_input_contents`), prepared once (payloads.py, transports.py,
grpc_client.py); both loops are the same whatever the protocol. Outcomes are counted apart: ok,
rejected (HTTP 503, gRPC RESOURCE_EXHAUSTED/UNAVAILABLE: the server's bounded queue is full),
timeout, and other errors; latency percentiles are over successful requests, and a rate only "holds
the SLO" when p99 <= SLO *and* failures stay under `max_error_rate`. The server's own view (average
batch size, queue and compute time) is read from its `/metrics` (HTTP) or statistics (gRPC)
(server_metrics.py).

The client's own cost is reported beside every figure: its process's CPU time over the measurement's
wall time (`client_cpu`, in cores), and how late it sent (`send_lag_p99_ms`). On a small machine the
generator competes with the server for the same cores; above CLIENT_CPU_WARN of a core (one event
loop, one thread) or SEND_LAG_WARN_MS of lag the row carries a warning that the client, not the
server, may be what was measured. It is the whole process's CPU: a server in the same process (as in
some tests) counts too.

A client: it imports serve's protocol codec and message definitions (serve/protocol.py,
serve/proto) and nothing else of serve, and no torch (start-up time; the import-linter contract in
pyproject.toml and tests/test_loadtest.py hold it to that).

Everything is bounded: the schedule ends at `duration`, every request has a `timeout`, in-flight
requests are capped, and the loop stops by itself.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import numpy as np

from inceptionlab.errors import UserError
from inceptionlab.host import load_average
from inceptionlab.loadtest.payloads import BODIES, PAYLOADS, ModelInfo, Prepared, encoded_images
from inceptionlab.loadtest.server_metrics import server_stats
from inceptionlab.loadtest.transports import PROTOCOLS, HttpTransport, Record, Transport

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
# A closed-loop client waiting on a stalled server is one case; an open loop whose server is far
# past saturation would keep opening requests forever. Past this many in flight the client stops
# sending and counts the request as "not_sent" (it is reported, never hidden).
MAX_IN_FLIGHT = 1024
# When the generator may be what limits a measurement. Its event loop is one thread: past ~70% of a
# core, requests start to queue inside the client (sends late, answers read late). A JPEG request cost
# it ~1.1 ms of CPU over HTTP (aiohttp) and ~1.4 ms over gRPC at 20/s, ~0.7 ms over either at 150/s, on
# a 2-core AMD EPYC Zen 4 (docs/serving/loadtest.md), so the warning comes near a thousand requests/s. A p99 send lag
# above 10 ms is already a tenth of a typical 100 ms SLO.
CLIENT_CPU_WARN = 0.7  # cores
SEND_LAG_WARN_MS = 10.0
SendFn = Callable[[Prepared, float, float], Awaitable[Record]]  # transport.send(request, scheduled, timeout)


# --------------------------------------------------------------------------------------- settings


@dataclass
class LoadSettings:
    url: str  # http: the base URL (http://HOST:8000); grpc: HOST:PORT (8001)
    model: str | None = None  # None: the only model the server lists
    rate: float | None = None  # open loop, requests/s (Poisson arrivals)
    concurrency: int | None = None  # closed loop, clients
    duration: float = 10.0  # s of offered load per measurement
    min_requests: int = 0  # open loop: last at least min_requests / rate s (a p99 needs ~100 samples)
    payload: str = "image"  # image (BYTES, encoded files) | tensor (preprocessed, from metadata)
    images: list[Path] = field(default_factory=list)  # files/folders; empty: sample pictures or generated
    slo_ms: float = 100.0
    max_error_rate: float = 0.01  # failures (503, errors, timeouts) allowed while holding the SLO
    timeout: float = 30.0  # s per request, end to end
    connections: int = 64  # HTTP pool size; requests beyond it wait for a connection (and it shows)
    warmup: int = 4  # sequential untimed requests before the first measurement
    seed: int = 0  # Poisson schedule
    max_requests: int = 100_000  # hard cap on one measurement's schedule
    api_key: str | None = None  # sent as `Authorization: Bearer KEY` (our server's --api-key)
    protocol: str = "http"  # http | grpc
    body: str = "binary"  # http: binary (the binary tensor data extension) | json (the plain JSON form) | raw
    # (the image file as the body) | multipart (a form with the file): payloads.BODIES
    path: str | None = None  # http: the route requests go to ({model}: its name); None: transports.request_path


    def check(self) -> None:
        if self.rate is not None and self.concurrency is not None:
            raise UserError("give either --rate R (open loop) or --concurrency C (closed loop), not both")
        if self.rate is not None and not self.rate > 0:
            raise UserError(f"--rate {self.rate}: give a rate above 0 requests/s")
        if self.concurrency is not None and self.concurrency < 1:
            raise UserError(f"--concurrency {self.concurrency}: give at least 1 client")
        if not self.duration > 0:
            raise UserError(f"--duration {self.duration}: give a duration above 0 s")
        if self.payload not in PAYLOADS:
            raise UserError(f"--payload {self.payload}: use one of {', '.join(PAYLOADS)}")
        if self.protocol not in PROTOCOLS:
            raise UserError(f"--protocol {self.protocol}: use one of {', '.join(PROTOCOLS)}")
        if self.body not in BODIES:
            raise UserError(f"--body {self.body}: use one of {', '.join(BODIES)}")


# --------------------------------------------------------------------------------------- maths


def poisson_schedule(rate: float, duration: float, seed: int = 0, limit: int = 100_000) -> np.ndarray:
    """Send times (s from the start) of a Poisson process of `rate`/s over [0, duration): exponential
    gaps with mean 1/rate from a seeded generator, so a run can be repeated exactly."""
    rng = np.random.default_rng(seed)
    expected = rate * duration
    # Draw enough gaps in one call: mean + 6 sigma of a Poisson count covers all but ~1e-9 of runs.
    count = min(int(expected + 6 * math.sqrt(expected) + 16), limit)
    times = np.cumsum(rng.exponential(1.0 / rate, size=count))
    return times[times < duration]


def percentiles(latencies_ms: np.ndarray | list[float]) -> dict[str, float | None]:
    """p50/p90/p99/p99.9 (numpy's linear interpolation) of the latencies; None when there are none."""
    values = np.asarray(latencies_ms, dtype=float)
    keys = [percentile_key(q) for q in PERCENTILES]
    if values.size == 0:
        return dict.fromkeys(keys)
    return {key: round(float(v), 3) for key, v in zip(keys, np.percentile(values, PERCENTILES))}


def percentile_key(q: float) -> str:
    return f"p{q:g}".replace(".", "") + "_ms"  # 99.9 -> p999_ms


# --------------------------------------------------------------------------------------- loops


async def open_loop(send: SendFn, requests: list[Prepared], schedule: np.ndarray,
                    timeout: float) -> tuple[list[Record], int, float]:
    """Send request i at start + schedule[i] whatever happened to earlier ones; returns the records,
    how many were not sent (in-flight cap) and the start time."""
    start = time.perf_counter() + 0.01  # 10 ms to spare: the first request is not already late
    pending: set[asyncio.Task[Record]] = set()
    finished: list[Record] = []
    not_sent = 0
    for index, offset in enumerate(schedule):
        due = start + float(offset)
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(pending) >= MAX_IN_FLIGHT:
            not_sent += 1
            continue
        task = asyncio.create_task(send(requests[index % len(requests)], due, timeout))
        pending.add(task)
        task.add_done_callback(lambda t: (pending.discard(t), finished.append(t.result())))
    if pending:
        await asyncio.wait(pending)  # each is bounded by `timeout`
    return finished, not_sent, start


async def closed_loop(send: SendFn, requests: list[Prepared], concurrency: int, duration: float, timeout: float,
                      limit: int) -> tuple[list[Record], float]:
    """C clients send back to back until `duration` is over (or `limit` requests were sent)."""
    start = time.perf_counter()
    end = start + duration
    records: list[Record] = []
    counter = iter(range(limit))

    async def client_loop() -> None:
        for index in counter:
            now = time.perf_counter()
            if now >= end:
                return
            records.append(await send(requests[index % len(requests)], now, timeout))

    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return records, start


# --------------------------------------------------------------------------------------- results


def summarize(records: list[Record], start: float, duration: float, slo_ms: float, max_error_rate: float,
              not_sent: int = 0) -> dict[str, Any]:
    """Counts, rates and percentiles of one measurement. Achieved rate: successful responses over the
    time from start to the last answer (at least `duration`): a server that falls behind finishes late."""
    outcomes = {name: 0 for name in ("ok", "rejected", "timeout", "error")}
    for record in records:
        outcomes[record.outcome] += 1
    ok_latency = np.array([r.latency_ms for r in records if r.outcome == "ok"])
    from_send = np.array([(r.done - r.sent) * 1e3 for r in records if r.outcome == "ok"])
    lag = np.array([(r.sent - r.scheduled) * 1e3 for r in records])
    window = max([duration] + [r.done - start for r in records])
    attempted = len(records) + not_sent
    failed = attempted - outcomes["ok"]
    stats = percentiles(ok_latency)
    row: dict[str, Any] = {
        "sent": len(records), "not_sent": not_sent, **outcomes,
        "error_rate": round(failed / attempted, 4) if attempted else None,
        "offered_rate": round(attempted / duration, 3),
        "achieved_rate": round(outcomes["ok"] / window, 3),
        "mean_ms": round(float(ok_latency.mean()), 3) if ok_latency.size else None,
        **stats,
        "max_ms": round(float(ok_latency.max()), 3) if ok_latency.size else None,
        "over_slo": int((ok_latency > slo_ms).sum()),  # successful but later than the SLO
        # How late the client itself sent (event loop busy, pool exhausted): large values mean the
        # client, not the server, limited the test.
        "send_lag_p99_ms": round(float(np.percentile(lag, 99)), 3) if lag.size else None,
        # Latency from the actual send, as perf_analyzer and most clients count it: the difference
        # from p50_ms/p99_ms is the client's own delay (and a stalled server's hidden queue).
        **{key.replace("_ms", "_from_send_ms"): value for key, value in percentiles(from_send).items()
           if key in ("p50_ms", "p99_ms")},
        "slo_ms": slo_ms,
    }
    row["slo_met"] = bool(stats["p99_ms"] is not None and stats["p99_ms"] <= slo_ms
                          and row["error_rate"] is not None and row["error_rate"] <= max_error_rate)
    return row


def client_usage(cpu_start: float, wall_start: float) -> dict[str, float]:
    """The generator's process CPU time since `cpu_start` (time.process_time) and its share of the wall
    time since `wall_start` (time.perf_counter), in cores."""
    cpu, wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
    return {"client_cpu_s": round(cpu, 3), "client_cpu": round(cpu / wall, 3) if wall > 0 else 0.0}


def client_warnings(row: dict[str, Any]) -> list[str]:
    """Why the generator itself may have limited this measurement (empty: no sign of it)."""
    warnings = []
    if row["client_cpu"] > CLIENT_CPU_WARN:
        warnings.append(f"the load generator used {row['client_cpu']:.0%} of a core (> {CLIENT_CPU_WARN:.0%}): it may "
                        "be the bottleneck; run it on another machine or lower the load")
    lag = row.get("send_lag_p99_ms")
    if row["mode"] == "open" and lag is not None and lag > SEND_LAG_WARN_MS:
        warnings.append(f"1% of requests were sent over {lag:.0f} ms after their scheduled time (> "
                        f"{SEND_LAG_WARN_MS:g} ms): the load generator fell behind its schedule, and its "
                        "latencies include that delay")
    return warnings


async def measure(load: LoadClient, settings: LoadSettings, rate: float | None = None,
                  concurrency: int | None = None, seed: int | None = None) -> dict[str, Any]:
    """One measurement (open loop at `rate` or closed loop with `concurrency`) with the server's own
    figures and the client's CPU use."""
    transport, info, requests = load.transport, load.info, load.requests
    before = await transport.counters(info.name)
    duration = settings.duration
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    if rate is not None:
        duration = max(duration, settings.min_requests / rate)
        schedule = poisson_schedule(rate, duration, settings.seed if seed is None else seed, settings.max_requests)
        records, not_sent, start = await open_loop(transport.send, requests, schedule, settings.timeout)
        row = {"mode": "open", "rate": rate, "concurrency": None}
    else:
        assert concurrency is not None
        records, start = await closed_loop(transport.send, requests, concurrency, settings.duration,
                                           settings.timeout, settings.max_requests)
        not_sent = 0
        row = {"mode": "closed", "rate": None, "concurrency": concurrency}
    usage = client_usage(cpu_start, wall_start)
    after = await transport.counters(info.name)
    row.update(summarize(records, start, duration, settings.slo_ms, settings.max_error_rate, not_sent))
    row.update({"duration_s": round(duration, 3), "protocol": transport.protocol, "payload": settings.payload,
                "model": info.name, **usage, "server": server_stats(before, after), "loadavg_1min": load_average()})
    row["client_warnings"] = client_warnings(row)
    return row


# --------------------------------------------------------------------------------------- sweep


def next_rate(history: list[tuple[float, bool]], factor: float, resolution: float) -> float | None:
    """The rate to try after `history` (rate, held SLO) in order: multiply by `factor` while it holds,
    then bisect between the highest rate that held and the lowest that failed until they are within
    `resolution` (relative). None: done."""
    held = [rate for rate, ok in history if ok]
    failed = [rate for rate, ok in history if not ok]
    if not failed:
        return history[-1][0] * factor
    high = min(failed)
    if not held:  # even the first rate failed: step down, at most 3 times (start / 4 with factor 1.6)
        return high / factor if high > history[0][0] / factor ** 3 * 1.0001 else None
    low = max(held)
    if high - low <= resolution * low:
        return None
    return math.sqrt(low * high)  # geometric middle: rates span orders of magnitude


async def sweep_rates(measure_rate: Callable[[float], Awaitable[dict[str, Any]]], start: float,
                      factor: float = 1.6, resolution: float = 0.1, max_steps: int = 12,
                      on_row: Callable[[dict[str, Any]], None] = lambda row: None) -> dict[str, Any]:
    """Raise the offered rate until p99 exceeds the SLO, refine, and report the highest rate that held
    it. `measure_rate(rate)` returns a row with `slo_met`; at most `max_steps` measurements."""
    rows: list[dict[str, Any]] = []
    history: list[tuple[float, bool]] = []
    rate: float | None = start
    while rate is not None and len(rows) < max_steps:
        row = await measure_rate(rate)
        rows.append(row)
        on_row(row)
        history.append((rate, bool(row["slo_met"])))
        rate = next_rate(history, factor, resolution)
    held = [r for r in rows if r["slo_met"]]
    best = max(held, key=lambda r: r["rate"]) if held else None
    return {"rows": rows, "best": best, "best_rate": best["rate"] if best else None,
            "best_achieved_rate": best["achieved_rate"] if best else None, "complete": rate is None}


# --------------------------------------------------------------------------------------- entry points


def open_transport(settings: LoadSettings) -> Transport:
    if settings.protocol == "grpc":
        # grpcio (~0.1 s to import) only when gRPC is asked for: HTTP runs start without it.
        from inceptionlab.loadtest.grpc_client import GrpcTransport

        return GrpcTransport(settings.url, settings.api_key)
    return HttpTransport(settings.url, settings.connections, settings.api_key, settings.timeout, settings.body,
                         settings.path)


@dataclass
class LoadClient:
    """A client ready to offer load: its transport (connections), the model's metadata, the prepared requests."""

    transport: Transport
    info: ModelInfo
    requests: list[Prepared]
    step: int = -1


async def open_client(settings: LoadSettings) -> LoadClient:
    transport = open_transport(settings)
    try:
        info = await transport.model_info(settings.model)
        requests = transport.prepare(info, settings.payload, encoded_images(settings.images))
        await _warm_up(transport, settings, info, requests)
    except BaseException:
        await transport.aclose()
        raise
    return LoadClient(transport, info, requests)


async def _warm_up(transport: Transport, settings: LoadSettings, info: ModelInfo, requests: list[Prepared]) -> None:
    """Untimed requests first (connections, the server's first calls); a failing server stops here."""
    for index in range(settings.warmup):
        record = await transport.send(requests[index % len(requests)], time.perf_counter(), settings.timeout)
        if record.outcome == "error" or record.outcome == "timeout":
            detail = f": {record.detail}" if record.detail else ""
            hint = "; Triton serving an ONNX export takes tensors: try --payload fp32" if settings.payload == "image" else ""
            raise UserError(f"{transport.target} ({transport.protocol}), model {info.name}: warm-up request failed "
                            f"({record.status or record.outcome}){detail}{hint}")


def _run(coroutine_factory: Callable[[LoadClient], Awaitable[Any]], settings: LoadSettings) -> Any:
    async def main() -> Any:
        client = await open_client(settings)
        try:
            return await coroutine_factory(client)
        finally:
            await client.transport.aclose()

    return asyncio.run(main())


def run_load(settings: LoadSettings) -> dict[str, Any]:
    """One measurement at `settings.rate` (open loop) or `settings.concurrency` (closed loop)."""
    settings.check()
    if settings.rate is None and settings.concurrency is None:
        raise UserError("give --rate R or --concurrency C (or --sweep)")
    return _run(lambda load: measure(load, settings, settings.rate, settings.concurrency), settings)


def run_sweep(settings: LoadSettings, start_rate: float | None = None, factor: float = 1.6,
              resolution: float = 0.1, max_steps: int = 12,
              on_row: Callable[[dict[str, Any]], None] = lambda row: None) -> dict[str, Any]:
    """Open-loop measurements at rising rates until p99 > SLO; the highest rate that held it."""
    settings.check()
    if settings.concurrency is not None:
        raise UserError("--sweep raises an open-loop rate; drop --concurrency")
    start = start_rate or settings.rate or 1.0

    async def sweep(load: LoadClient) -> dict[str, Any]:
        async def measure_rate(rate: float) -> dict[str, Any]:
            step = load.step = load.step + 1  # a fresh Poisson draw per step
            return await measure(load, settings, rate=rate, seed=settings.seed + step)

        return await sweep_rates(measure_rate, start, factor, resolution, max_steps, on_row)

    return _run(sweep, settings)


def settings_dict(settings: LoadSettings) -> dict[str, Any]:
    data = asdict(settings)
    data["images"] = [str(p) for p in settings.images]
    data["api_key"] = "***" if settings.api_key else None  # never written to results files
    return data
