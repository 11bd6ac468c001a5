"""How the load generator talks to a server: one transport per protocol, the same five calls each.

    transport = HttpTransport("http://127.0.0.1:8000", connections=64, api_key=None, timeout=30.0)
    info = await transport.model_info("inception_v3")          # the model's inputs and outputs
    requests = transport.prepare(info, "image", encoded)        # encoded once, before the load
    record = await transport.send(requests[0], scheduled, timeout=30.0)
    counters = await transport.counters(info.name)              # the server's own cumulative figures

HTTP (`HttpTransport`, here): aiohttp's client session with a bounded connection pool, the binary
tensor data extension, the server's `/metrics`. gRPC (`GrpcTransport`, grpc_client.py): grpcio's
asyncio channel, `raw_input_contents`, the statistics extension (ModelStatistics). Outcomes mean the
same in both: ok; rejected (HTTP 503; gRPC RESOURCE_EXHAUSTED or UNAVAILABLE, what ours and Triton answer
when the queue is full or the server drains); timeout; error (anything else).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from inceptionlab.errors import UserError
from inceptionlab.loadtest.payloads import FILE_BODIES, ModelInfo, Prepared, prepare_requests
from inceptionlab.loadtest.server_metrics import scrape

PROTOCOLS = ("http", "grpc")
DETAIL_CHARS = 300  # of an error answer, kept for the warm-up's message


@dataclass
class Record:
    """One request: when it was due, sent and answered (s on the client's clock), and how it ended."""

    scheduled: float
    sent: float
    done: float
    outcome: str  # ok | rejected | timeout | error
    status: int | str | None = None  # HTTP status, or gRPC status code name
    detail: str | None = None  # the server's error message, for failures

    @property
    def latency_ms(self) -> float:
        return (self.done - self.scheduled) * 1e3


class Transport(Protocol):
    protocol: str
    target: str

    async def model_info(self, model: str | None) -> ModelInfo: ...

    def prepare(self, info: ModelInfo, payload: str, encoded: list[bytes]) -> list[Prepared]: ...

    async def send(self, request: Prepared, scheduled: float, timeout: float) -> Record: ...

    async def counters(self, model: str) -> dict[str, float] | None: ...

    async def aclose(self) -> None: ...


class HttpTransport:
    """The Open Inference Protocol over HTTP/1.1: `POST /v2/models/{name}/infer`.

    aiohttp rather than httpx: the client shares the machine's cores with the server it measures. On
    a 2-core AMD EPYC (Zen 4, avx512_bf16) against the demo model, on the same open-loop Poisson
    schedules, httpx spent 1.9-2.0 ms of the client's CPU per request at 100 and 180 requests/s and
    3.0 ms at 250/s, where its pool fell behind (p99 1.8 s); aiohttp 0.63-0.81 ms, and 0.56 ms at
    250/s (p99 85 ms).
    """

    protocol = "http"

    def __init__(self, url: str, connections: int, api_key: str | None, timeout: float, body: str = "binary",
                 path: str | None = None):
        # Made in the running event loop (open_client): aiohttp binds its session to it.
        self.target, self.body, self.path = url, body, path
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections),
                                             timeout=aiohttp.ClientTimeout(total=timeout), headers=headers)
        self.endpoint = ""  # set by prepare: the model the requests go to

    async def model_info(self, model: str | None) -> ModelInfo:
        """`GET /v2/models/{name}`; without a name, the one model in Triton's repository index."""
        url = self.target
        if model is None:
            model = await self._only_model()
        try:
            async with self.session.get(f"{url}/v2/models/{model}") as response:
                status, text = response.status, await response.text()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise self._unreachable(exc) from None
        if status == 401:
            raise _wants_key(f"{url}/v2/models/{model}")
        if status != 200:
            raise UserError(f"{url}/v2/models/{model}: HTTP {status}; check --model NAME")
        meta = json.loads(text)
        return ModelInfo(meta.get("name", model), meta.get("inputs", []), meta.get("outputs", []))

    async def _only_model(self) -> str:
        index = f"{self.target}/v2/repository/index"
        try:
            async with self.session.post(index, json={"ready": True}) as response:
                status, text = response.status, await response.text()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:  # nothing answers: the server is down
            raise self._unreachable(exc) from None
        if status == 401:
            raise _wants_key(index)
        try:
            names = [entry["name"] for entry in json.loads(text)] if status == 200 else []
        except (ValueError, KeyError, TypeError):  # a server without Triton's repository extension
            names = []
        return only_model(self.target, names)

    def _unreachable(self, exc: Exception) -> UserError:
        return UserError(f"{self.target}: cannot reach the server ({type(exc).__name__}); is it running? "
                         "(--protocol http takes the server's HTTP URL, e.g. http://127.0.0.1:8000)")

    def prepare(self, info: ModelInfo, payload: str, encoded: list[bytes]) -> list[Prepared]:
        self.endpoint = f"{self.target}{request_path(self.path, self.body, info.name)}"
        return prepare_requests(info, payload, encoded, self.body)

    async def send(self, request: Prepared, scheduled: float, timeout: float) -> Record:
        sent = time.perf_counter()
        try:
            async with self.session.post(self.endpoint, data=request.body, headers=request.headers,
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                status, content = response.status, await response.read()
        except TimeoutError:  # aiohttp's timeouts are TimeoutErrors (some are ClientErrors too)
            return Record(scheduled, sent, time.perf_counter(), "timeout")
        except (aiohttp.ClientError, OSError) as exc:  # refused, reset, closed mid-answer: the server failed this one
            return Record(scheduled, sent, time.perf_counter(), "error", detail=type(exc).__name__)
        done = time.perf_counter()
        if status == 200:
            return Record(scheduled, sent, done, "ok", status)
        return Record(scheduled, sent, done, "rejected" if status == 503 else "error", status,
                      content.decode(errors="replace").strip()[:DETAIL_CHARS])

    async def counters(self, model: str) -> dict[str, float] | None:
        return await scrape(self.session, self.target, model)

    async def aclose(self) -> None:
        await self.session.close()


def request_path(path: str | None, body: str, model: str) -> str:
    """Where requests go: `path` as given ({model} stands for the model's name), else the protocol's infer
    route, or our server's classify route for an image file as the body or a form (FILE_BODIES)."""
    if path is None:
        path = "/v1/classify?model={model}" if body in FILE_BODIES else "/v2/models/{model}/infer"
    return path.replace("{model}", model)


def _wants_key(url: str) -> UserError:
    return UserError(f"{url}: HTTP 401; the server wants a key: pass --api-key KEY (or set INCEPTIONLAB_API_KEY)")


def only_model(target: str, names: list[str]) -> str:
    """The one model a repository index lists, or a one-line error asking for --model."""
    if len(names) != 1:
        raise UserError(f"{target}: cannot tell which model to load (repository index: {names or 'unavailable'}); "
                        "pass --model NAME")
    return names[0]
