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

Requests are `POST /v2/models/{name}/infer` with the binary tensor data extension, prepared once
(payloads.py). Outcomes are counted apart: ok (200), rejected (503: the server's bounded queue is
full), timeout, and other errors; latency percentiles are over successful requests, and a rate only
"holds the SLO" when p99 <= SLO *and* failures stay under `max_error_rate`. The server's own view
(average batch size, queue and compute time) is read from its `/metrics` (server_metrics.py).

A client: it imports serve's protocol codec and nothing else of serve, and no torch (start-up time;
the import-linter contract in pyproject.toml and tests/test_loadtest.py hold it to that).

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

import httpx
import numpy as np

from inceptionlab.errors import UserError
from inceptionlab.host import load_average
from inceptionlab.loadtest.payloads import PAYLOADS, ModelInfo, Prepared, encoded_images, prepare_requests
from inceptionlab.loadtest.server_metrics import scrape, server_stats

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
# A closed-loop client waiting on a stalled server is one case; an open loop whose server is far
# past saturation would keep opening requests forever. Past this many in flight the client stops
# sending and counts the request as "not_sent" (it is reported, never hidden).
MAX_IN_FLIGHT = 1024


# --------------------------------------------------------------------------------------- settings


@dataclass
class LoadSettings:
    url: str
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
    connections: int = 64  # httpx pool size; requests beyond it wait for a connection (and it shows)
    warmup: int = 4  # sequential untimed requests before the first measurement
    seed: int = 0  # Poisson schedule
    max_requests: int = 100_000  # hard cap on one measurement's schedule
    api_key: str | None = None  # sent as `Authorization: Bearer KEY` (our server's --api-key)

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


# --------------------------------------------------------------------------------------- server


async def model_info(client: httpx.AsyncClient, url: str, model: str | None) -> ModelInfo:
    """`GET /v2/models/{name}`; without a name, the one model in Triton's repository index."""
    if model is None:
        model = await _only_model(client, url)
    try:
        response = await client.get(f"{url}/v2/models/{model}")
    except httpx.HTTPError as exc:
        raise UserError(f"{url}: cannot reach the server ({type(exc).__name__}); is it running?") from None
    if response.status_code == 401:
        raise UserError(f"{url}/v2/models/{model}: HTTP 401; the server wants a key: pass --api-key KEY "
                        "(or set INCEPTIONLAB_API_KEY)")
    if response.status_code != 200:
        raise UserError(f"{url}/v2/models/{model}: HTTP {response.status_code}; check --model NAME")
    meta = response.json()
    return ModelInfo(meta.get("name", model), meta.get("inputs", []), meta.get("outputs", []))


async def _only_model(client: httpx.AsyncClient, url: str) -> str:
    try:
        response = await client.post(f"{url}/v2/repository/index", json={"ready": True})
        names = [entry["name"] for entry in response.json()] if response.status_code == 200 else []
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        names = []
    if len(names) != 1:
        raise UserError(f"{url}: cannot tell which model to load (repository index: {names or 'unavailable'}); "
                        "pass --model NAME")
    return names[0]


async def wait_ready(client: httpx.AsyncClient, url: str, timeout: float = 60.0) -> None:
    """Poll `GET /v2/health/ready` every 0.2 s until 200, at most `timeout` s."""
    deadline = time.perf_counter() + timeout
    while True:
        try:
            if (await client.get(f"{url}/v2/health/ready")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.perf_counter() > deadline:
            raise UserError(f"{url}: not ready after {timeout:.0f} s (GET /v2/health/ready)")
        await asyncio.sleep(0.2)


# --------------------------------------------------------------------------------------- one request


@dataclass
class Record:
    """One request: when it was due, sent and answered (s on the client's clock), and how it ended."""

    scheduled: float
    sent: float
    done: float
    outcome: str  # ok | rejected (503) | timeout | error
    status: int | None = None

    @property
    def latency_ms(self) -> float:
        return (self.done - self.scheduled) * 1e3


async def send(client: httpx.AsyncClient, endpoint: str, request: Prepared, scheduled: float,
               timeout: float) -> Record:
    sent = time.perf_counter()
    try:
        response = await asyncio.wait_for(
            client.post(endpoint, content=request.body, headers=request.headers), timeout)
    except asyncio.TimeoutError:
        return Record(scheduled, sent, time.perf_counter(), "timeout")
    except (httpx.HTTPError, OSError):  # refused, reset, closed mid-answer: the server failed this one
        return Record(scheduled, sent, time.perf_counter(), "error")
    done = time.perf_counter()
    status = response.status_code
    outcome = "ok" if status == 200 else "rejected" if status == 503 else "error"
    return Record(scheduled, sent, done, outcome, status)


# --------------------------------------------------------------------------------------- loops


async def open_loop(client: httpx.AsyncClient, endpoint: str, requests: list[Prepared], schedule: np.ndarray,
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
        task = asyncio.create_task(send(client, endpoint, requests[index % len(requests)], due, timeout))
        pending.add(task)
        task.add_done_callback(lambda t: (pending.discard(t), finished.append(t.result())))
    if pending:
        await asyncio.wait(pending)  # each is bounded by `timeout`
    return finished, not_sent, start


async def closed_loop(client: httpx.AsyncClient, endpoint: str, requests: list[Prepared], concurrency: int,
                      duration: float, timeout: float, limit: int) -> tuple[list[Record], float]:
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
            records.append(await send(client, endpoint, requests[index % len(requests)], now, timeout))

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
        "slo_ms": slo_ms,
    }
    row["slo_met"] = bool(stats["p99_ms"] is not None and stats["p99_ms"] <= slo_ms
                          and row["error_rate"] is not None and row["error_rate"] <= max_error_rate)
    return row


async def measure(client: httpx.AsyncClient, settings: LoadSettings, info: ModelInfo, requests: list[Prepared],
                  rate: float | None = None, concurrency: int | None = None, seed: int | None = None) -> dict[str, Any]:
    """One measurement (open loop at `rate` or closed loop with `concurrency`) with the server's metrics."""
    endpoint = f"{settings.url}/v2/models/{info.name}/infer"
    before = await scrape(client, settings.url, info.name)
    duration = settings.duration
    if rate is not None:
        duration = max(duration, settings.min_requests / rate)
        schedule = poisson_schedule(rate, duration, settings.seed if seed is None else seed, settings.max_requests)
        records, not_sent, start = await open_loop(client, endpoint, requests, schedule, settings.timeout)
        row = {"mode": "open", "rate": rate, "concurrency": None}
    else:
        assert concurrency is not None
        records, start = await closed_loop(client, endpoint, requests, concurrency, settings.duration,
                                           settings.timeout, settings.max_requests)
        not_sent = 0
        row = {"mode": "closed", "rate": None, "concurrency": concurrency}
    after = await scrape(client, settings.url, info.name)
    row.update(summarize(records, start, duration, settings.slo_ms, settings.max_error_rate, not_sent))
    row.update({"duration_s": round(duration, 3), "payload": settings.payload, "model": info.name,
                "server": server_stats(before, after), "loadavg_1min": load_average()})
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


@dataclass
class LoadClient:
    """A client ready to offer load: its HTTP connection pool, the model's metadata, the prepared bodies."""

    client: httpx.AsyncClient
    info: ModelInfo
    requests: list[Prepared]
    step: int = -1


async def open_client(settings: LoadSettings) -> LoadClient:
    limits = httpx.Limits(max_connections=settings.connections, max_keepalive_connections=settings.connections)
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(settings.timeout), headers=headers)
    try:
        info = await model_info(client, settings.url, settings.model)
        requests = prepare_requests(info, settings.payload, encoded_images(settings.images))
        await _warm_up(client, settings, info, requests)
    except BaseException:
        await client.aclose()
        raise
    return LoadClient(client, info, requests)


async def _warm_up(client: httpx.AsyncClient, settings: LoadSettings, info: ModelInfo,
                   requests: list[Prepared]) -> None:
    """Untimed requests first (connections, the server's first calls); a failing server stops here."""
    endpoint = f"{settings.url}/v2/models/{info.name}/infer"
    for index in range(settings.warmup):
        record = await send(client, endpoint, requests[index % len(requests)], time.perf_counter(), settings.timeout)
        if record.outcome == "error" or record.outcome == "timeout":
            detail = await _error_detail(client, endpoint, requests[0])
            hint = "; Triton serving an ONNX export takes tensors: try --payload fp32" if settings.payload == "image" else ""
            raise UserError(f"{endpoint}: warm-up request failed ({record.status or record.outcome}){detail}{hint}")


async def _error_detail(client: httpx.AsyncClient, endpoint: str, request: Prepared) -> str:
    try:
        response = await client.post(endpoint, content=request.body, headers=request.headers)
        return f": {response.text.strip()}"[:300]
    except Exception:  # only for the message: the failure itself is already known
        return ""


def _run(coroutine_factory: Callable[[LoadClient], Awaitable[Any]], settings: LoadSettings) -> Any:
    async def main() -> Any:
        client = await open_client(settings)
        try:
            return await coroutine_factory(client)
        finally:
            await client.client.aclose()

    return asyncio.run(main())


def run_load(settings: LoadSettings) -> dict[str, Any]:
    """One measurement at `settings.rate` (open loop) or `settings.concurrency` (closed loop)."""
    settings.check()
    if settings.rate is None and settings.concurrency is None:
        raise UserError("give --rate R or --concurrency C (or --sweep)")
    return _run(lambda load: measure(load.client, settings, load.info, load.requests, settings.rate,
                                     settings.concurrency), settings)


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
            return await measure(load.client, settings, load.info, load.requests, rate=rate,
                                 seed=settings.seed + step)

        return await sweep_rates(measure_rate, start, factor, resolution, max_steps, on_row)

    return _run(sweep, settings)


def settings_dict(settings: LoadSettings) -> dict[str, Any]:
    data = asdict(settings)
    data["images"] = [str(p) for p in settings.images]
    data["api_key"] = "***" if settings.api_key else None  # never written to results files
    return data
