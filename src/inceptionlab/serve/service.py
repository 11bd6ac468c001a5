"""What the two front ends share: models and their batchers, metrics, readiness and the drain, the
one inference path, and the protocol's extension answers (model configuration, statistics,
repository index) as plain dicts in Triton's JSON form.

HTTP (app.py) sends these dicts as they are; gRPC (grpc_server.py) fills the proto messages of the
same names from them, so both protocols answer from one place. Errors are `ServeError`s of a kind
that fixes the HTTP status, the gRPC status code and the metrics outcome together (KINDS).

Every inference request has an id (`request_id_from`): the client's `X-Request-ID` header (gRPC: the
`x-request-id` metadata), else a new one. Both front ends send it back (the `X-Request-ID` header,
gRPC trailing metadata); a request that fails by the server's fault is answered 500 (gRPC INTERNAL)
naming its id, and the server's log holds that failure's traceback under the same id.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping

import numpy as np

from inceptionlab import __version__
from inceptionlab.errors import UserError, summary_of
from inceptionlab.host import name_os_thread
from inceptionlab.serve.batcher import Draining, DynamicBatcher, QueueFull
from inceptionlab.serve.metrics import ServeMetrics
from inceptionlab.serve.models import ENCODED_INPUT, IMAGE_INPUT, ServedModel
from inceptionlab.serve.protocol import (
    InferRequest,
    ProtocolError,
    config_data_type,
    parse_infer_request,
    top_classes,
)

log = logging.getLogger(__name__)

SERVER_NAME = "inceptionlab"
# Triton's extension names for what both front ends implement. model_repository: the index, and load
# and unload of the models given at start-up (unload stops serving one, load serves it again; there is
# no repository folder to load others from). classification: `parameters.classification` on an output.
EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration", "model_repository", "statistics"]
MODEL_VERSION = "1"  # each model has one version; a request may name it, or leave it out


@dataclass
class RequestSettings:
    """How requests are batched, queued, limited and authenticated (both protocols alike)."""

    max_delay_ms: float | None = None  # None: each model's own, decided with its serving plan
    max_queue: int = 256  # per model's batcher; the preprocessing pool queues as many jobs at most
    timeout_s: float = 30.0
    max_body_bytes: int = 20 * 1024 * 1024  # 20 MiB: a 12 Mpx JPEG is ~5 MB, a 32x299x299 FP32 batch 34 MB
    api_key: str | None = None
    topk: int = 5
    preprocess_threads: int = max(2, os.cpu_count() or 2)
    retry_after_s: int = 1
    # Requests in progress at once per front end (HTTP requests, gRPC calls): what bounds the memory
    # bodies hold (128 x --max-body-mb 20 = 2.5 GiB at worst). A 2-core server holding a 100 ms p99 at
    # 300 requests/s has ~30 in progress (Little's law), so the bound only meets overload.
    max_concurrency: int = 128


@dataclass(frozen=True)
class Kind:
    http: int
    grpc: str  # a grpc.StatusCode name (grpc is imported only where gRPC is served)
    outcome: str  # the metrics outcome label


# What a refused request is, in each protocol. (A missing API key, a body over --max-body-mb and a
# request past --max-concurrency are refused before any route runs, by each front end: 401 /
# UNAUTHENTICATED, 413 / RESOURCE_EXHAUSTED and 503 / RESOURCE_EXHAUSTED.)
KINDS = {
    "invalid": Kind(400, "INVALID_ARGUMENT", "bad_request"),
    "not_found": Kind(404, "NOT_FOUND", "bad_request"),
    "queue_full": Kind(503, "RESOURCE_EXHAUSTED", "rejected"),
    "draining": Kind(503, "UNAVAILABLE", "rejected"),
    "timeout": Kind(504, "DEADLINE_EXCEEDED", "timeout"),
    "internal": Kind(500, "INTERNAL", "error"),
}


class ServeError(Exception):
    """A request the server answers with an error: `kind` (KINDS) says how in each protocol."""

    def __init__(self, kind: str, message: str, retry_after_s: int | None = None):
        super().__init__(" ".join(message.split()))
        self.kind, self.retry_after_s = kind, retry_after_s

    @property
    def status(self) -> int:
        return KINDS[self.kind].http


def key_matches(headers: Mapping[str, str], key: str) -> bool:
    """The API key as 'Authorization: Bearer KEY' or 'X-API-Key: KEY' (HTTP headers, gRPC metadata)."""
    given = headers.get("x-api-key") or ""
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    return hmac.compare_digest(given.encode(), key.encode())


API_KEY_HELP = "missing or wrong API key: send it as 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"

REQUEST_ID_HEADER = "x-request-id"  # what proxies and tracing already set (HTTP header, gRPC metadata)
_MAX_REQUEST_ID = 128


def request_id_from(headers: Mapping[str, str]) -> str:
    """The client's `X-Request-ID` when it is a short printable string, else a new random id (32 hex
    digits): what the answer carries back and the server's log names."""
    given = (headers.get(REQUEST_ID_HEADER) or "").strip()
    if given and len(given) <= _MAX_REQUEST_ID and given.isprintable():
        return given
    return uuid.uuid4().hex


@dataclass
class Counted:
    request_id: str = ""
    outcome: str = "error"  # until the request is answered or refused for a known reason


class ServeState:
    """What the front ends share: the models, their batchers, the metrics, readiness, the drain."""

    def __init__(self, models: list[ServedModel], settings: RequestSettings):
        self.models = {m.name: m for m in models}
        self.settings = settings
        self.metrics = ServeMetrics()
        self.batchers: dict[str, DynamicBatcher] = {}
        self.ready = False
        self.draining = False
        self.abandoned = False  # a forced exit: shut down without answering what is accepted
        self.on_drain: list[Callable[[], Awaitable[None]]] = []  # e.g. the gRPC health service
        self.grpc_port: int | None = None  # where the gRPC front end listens, when it runs
        self.unloaded: set[str] = set()  # models taken out of service by the repository's unload
        self.preprocess = ThreadPoolExecutor(settings.preprocess_threads, thread_name_prefix="preprocess",
                                             initializer=name_os_thread)
        self.preprocessing = 0  # jobs handed to the pool and not finished (running or queued)

    @property
    def accepting(self) -> bool:
        return self.ready and not self.draining

    def start(self) -> None:
        for name, model in self.models.items():
            batcher = DynamicBatcher(model.run, model.max_batch, self.delay_ms(model) / 1e3,
                                     self.settings.max_queue, len(model.engines), self.metrics.on_batch(name), name,
                                     max_request=model.max_request, auto_limit=model.auto_limit,
                                     rule=model.batch_rule)
            batcher.start()
            self.batchers[name] = batcher
            self.metrics.add_model(name, lambda b=batcher: b.pending)
        self.ready = True

    def stop_accepting(self) -> None:
        """Readiness turns false and new requests are refused, from this moment on."""
        self.draining = True
        for batcher in self.batchers.values():
            batcher.draining = True

    def abandon(self) -> int:
        """A forced exit: stop accepting, refuse what is queued (503 / UNAVAILABLE, as while draining),
        and let the shutdown skip the drain. Returns how many requests were queued."""
        self.stop_accepting()
        self.abandoned = True
        return sum(batcher.abandon() for batcher in self.batchers.values())

    def pending(self) -> int:
        """Accepted requests not yet answered: queued or running, over every model."""
        return sum(batcher.pending for batcher in self.batchers.values())

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting, then answer everything accepted (bounded): True when all was answered."""
        if not self.draining:
            self.stop_accepting()
        for callback in self.on_drain:
            await callback()
        self.on_drain.clear()
        results = await asyncio.gather(*(b.drain(timeout_s) for b in self.batchers.values()))
        return all(results)

    async def stop(self) -> None:
        await asyncio.gather(*(b.stop() for b in self.batchers.values()))
        self.preprocess.shutdown(wait=False, cancel_futures=True)

    def model(self, name: str, version: str = "", loaded: bool = True) -> ServedModel:
        """The served model `name` at `version` ("" or "1"); with `loaded`, refused while unloaded."""
        if name not in self.models:
            raise ServeError("not_found", f"unknown model {name!r}; this server has {', '.join(self.models)}")
        if version not in ("", MODEL_VERSION):  # Triton's words, so clients moving between the two read the same
            raise ServeError("not_found", f"Request for unknown model: '{name}' version {version} is not found")
        if loaded and name in self.unloaded:
            raise ServeError("not_found", f"model {name!r} is unloaded; load it again: POST "
                             f"/v2/repository/models/{name}/load (gRPC RepositoryModelLoad)")
        return self.models[name]

    def model_ready(self, name: str, version: str = "") -> bool:
        self.model(name, version, loaded=False)
        return self.accepting and name not in self.unloaded

    def load_model(self, name: str) -> None:
        """The repository's load: a model given at start-up and unloaded since is served again."""
        if name not in self.models:
            raise ServeError("not_found", f"model {name!r} is not in this server's repository: it serves the models "
                             f"given at start-up ({', '.join(self.models)}); start the server with it")
        self.unloaded.discard(name)

    def unload_model(self, name: str) -> None:
        """The repository's unload: new requests for `name` are refused; queued ones are still answered."""
        self.model(name, loaded=False)
        self.unloaded.add(name)

    def in_thread(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """`fn(*args)` in the preprocessing pool, to await; refused at once (503) while the pool's
        queue holds --max-queue jobs: a queue without a bound only adds waiting under overload."""
        self._check_preprocessing()
        self.preprocessing += 1
        future = asyncio.get_running_loop().run_in_executor(self.preprocess, fn, *args)
        future.add_done_callback(self._preprocessed)
        return future

    def _preprocessed(self, future: asyncio.Future) -> None:
        self.preprocessing -= 1

    def _check_preprocessing(self) -> None:
        queued = self.preprocessing - self.settings.preprocess_threads
        if queued >= self.settings.max_queue:
            raise ServeError("queue_full", f"{queued} requests are queued for the preprocessing threads "
                             f"(--max-queue {self.settings.max_queue}); retry later", self.settings.retry_after_s)

    # ------------------------------------------------------------------ one request

    @asynccontextmanager
    async def counted(self, name: str, protocol: str, request_id: str) -> AsyncIterator[Counted]:
        """One request's bookkeeping for every inference route of both protocols: the library's
        errors become ServeErrors, the server's own failures are logged with their traceback and the
        request's id, and every request is counted by front end (metrics.PROTOCOLS) and outcome with
        its time."""
        started = time.perf_counter()
        counted = Counted(request_id)
        try:
            yield counted
        except (ProtocolError, UserError) as exc:
            counted.outcome = "bad_request"
            raise ServeError("invalid", str(exc)) from None
        except ServeError as exc:
            counted.outcome = KINDS[exc.kind].outcome
            raise
        except asyncio.CancelledError:  # a gRPC client cancelled, or its deadline passed
            counted.outcome = "cancelled"
            raise
        except Exception as exc:  # the server's own failure (decoding, a model's code): logged, then a 500
            log.error("model %s: request %s failed", name, request_id, exc_info=exc)
            raise internal_error(exc, request_id) from exc
        finally:
            self.metrics.record_request(name, protocol, counted.outcome, time.perf_counter() - started)

    def refuse_early(self, name: str) -> None:
        """Refuse before parsing when the server drains or a queue is full (the model's batcher, the
        preprocessing pool): an overloaded server spends no CPU or memory on requests it would refuse anyway."""
        try:
            self.batchers[name].check_accepting()
        except (QueueFull, Draining) as exc:
            raise self._refusal(exc) from None
        self._check_preprocessing()

    def _refusal(self, exc: Exception) -> ServeError:
        kind = "queue_full" if isinstance(exc, QueueFull) else "draining"
        return ServeError(kind, f"{exc}; retry later", self.settings.retry_after_s)

    def check_request(self, model: ServedModel, request: InferRequest) -> None:
        """A parsed request's inputs, outputs and size, before anything is decoded (ProtocolError, ServeError)."""
        if len(request.inputs) != 1:
            given = ", ".join(repr(t.name) for t in request.inputs) or "none"
            raise ProtocolError(f"model {model.name!r} takes exactly one input per request (given: {given}): "
                                f"{model.accepted_inputs()}")
        unknown = [o for o in request.outputs if o not in model.outputs]
        if unknown:
            raise ProtocolError(f"model {model.name!r} has no output {unknown[0]!r}; it has {', '.join(model.outputs)}")
        try:
            self.batchers[model.name].check_size(request.inputs[0].batch)  # before decoding what would be refused
        except ValueError as exc:
            raise ServeError("invalid", str(exc)) from None

    def parse_and_prepare(self, model: ServedModel, body: bytes,
                          header_length: str | None) -> tuple[InferRequest, tuple[Any, int]]:
        """An HTTP body -> the parsed request and its model input, in one preprocessing job (a large JSON
        body, base64 images: parsing and decoding both belong in the pool, one hop there and back)."""
        request = parse_infer_request(body, header_length)
        self.check_request(model, request)
        return request, model.prepare_tensor(request.inputs[0])

    async def infer(self, model: ServedModel, request: InferRequest, counted: Counted,
                    timeout_s: float | None = None, prepared: tuple[Any, int] | None = None) -> dict[str, np.ndarray]:
        """A parsed inference request -> its outputs by name (both protocols); `prepared`: its model input,
        checked and prepared already (`parse_and_prepare`)."""
        if prepared is None:
            self.check_request(model, request)
            tensor = request.inputs[0]
            # Tensors already in the model's input form only need a shape check: a thread hop (and the GIL
            # handed over twice) would cost more than the work. Encoded images and texts go to the pool.
            prepared = model.prepare_tensor(tensor) if model.takes_as_is(tensor) \
                else await self.in_thread(model.prepare_tensor, tensor)
        item, count = prepared
        result = await self.submit(model.name, item, count, counted.request_id, timeout_s)
        counted.outcome = "success"
        outputs = {name: result[name] for name in request.outputs or model.outputs}
        for name, count in request.classification.items():  # Triton's classification extension
            outputs[name] = top_classes(outputs[name], count, model.spec.labels)
        return outputs

    async def submit(self, name: str, item: Any, count: int, request_id: str, timeout_s: float | None = None) -> Any:
        """Queue one request's item on its model's batcher; refusals and failures become ServeErrors."""
        timeout = self.settings.timeout_s if timeout_s is None else min(timeout_s, self.settings.timeout_s)
        try:
            return await self.batchers[name].submit(item, count, timeout, tag=request_id)
        except (QueueFull, Draining) as exc:
            raise self._refusal(exc) from None
        except ValueError as exc:  # bigger than --max-batch
            raise ServeError("invalid", str(exc)) from None
        except asyncio.TimeoutError:
            raise ServeError("timeout", f"no answer within {timeout:g} s (--timeout-s "
                             f"{self.settings.timeout_s:g}, or the client's deadline)") from None
        except Exception as exc:  # a failed batch (the batcher logged its traceback): a 500, the server goes on
            raise internal_error(exc, request_id, "inference failed") from exc

    def delay_ms(self, model: ServedModel) -> float:
        """--max-delay-ms as set, else the model's own (decided with its serving plan)."""
        return model.max_delay_ms if self.settings.max_delay_ms is None else self.settings.max_delay_ms

    # ------------------------------------------------------------------ the protocol's answers

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """The model's configuration in Triton's ModelConfig form (what clients read max_batch_size,
        inputs and batching from), with inceptionlab's own facts (precision, provider, the inputs it
        accepts, class labels) in `parameters`."""
        model, settings = self.model(name, version), self.settings
        meta, delay_ms = model.metadata(), self.delay_ms(model)
        return {
            "name": model.name,
            "platform": meta["platform"],
            "backend": model.backend,
            "max_batch_size": model.max_request,  # what one request may hold; the batches: preferred_batch_size
            "input": [_config_input(spec) for spec in meta["inputs"]],
            "output": [{"name": o["name"], "data_type": config_data_type(o["datatype"]), "dims": o["shape"][1:]}
                       for o in meta["outputs"]],
            "dynamic_batching": {
                "preferred_batch_size": model.buckets,
                "max_queue_delay_microseconds": int(delay_ms * 1000),
                "default_queue_policy": {"max_queue_size": settings.max_queue,
                                         "default_timeout_microseconds": int(settings.timeout_s * 1e6)},
            },
            "instance_group": [{"count": len(model.engines), "kind": _instance_kind(model.provider)}],
            "parameters": {key: {"string_value": value} for key, value in (
                ("precision", model.precision), ("provider", model.provider),
                ("accepted_inputs", model.accepted_inputs()),
                ("labels", "\n".join(model.spec.labels)),  # one per line in index order, as labels.txt
                *model.rule.parameters())},
        }

    def model_stats(self, name: str | None = None, version: str = "") -> list[dict[str, Any]]:
        """Triton's statistics extension, per model (all models without a name), read from the same
        counters /metrics shows. Compute time covers a batch's input preparation, the model and its
        outputs, all reported as compute_infer (compute_input/output count alike, 0 ns): perf_analyzer
        requires the three counts to be equal."""
        names = [self.model(name, version, loaded=False).name] if name else list(self.models)
        return [self._stats_of(n) for n in names]

    def _stats_of(self, name: str) -> dict[str, Any]:
        f = self.metrics.figures(name)
        computed = {"count": f.executed_requests, "ns": _ns(f.compute_seconds)}
        return {
            "name": name, "version": MODEL_VERSION, "last_inference": int(f.last_inference_s * 1000),
            "inference_count": f.inferences, "execution_count": f.executions,
            "inference_stats": {
                "success": {"count": f.successes, "ns": _ns(f.success_seconds)},
                "fail": {"count": f.requests - f.successes, "ns": _ns(f.request_seconds - f.success_seconds)},
                "queue": {"count": f.executed_requests, "ns": _ns(f.queue_seconds)},
                "compute_input": {"count": f.executed_requests, "ns": 0},
                "compute_infer": computed,
                "compute_output": {"count": f.executed_requests, "ns": 0},
                "cache_hit": {"count": 0, "ns": 0},
                "cache_miss": {"count": 0, "ns": 0},
            },
            "batch_stats": [],
        }

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: every served model, READY until the drain begins or it is unloaded."""
        entries = []
        for name in self.models:
            state, reason = ("READY", "") if self.accepting else ("UNAVAILABLE", "the server is shutting down")
            if name in self.unloaded:
                state, reason = "UNAVAILABLE", "unloaded"
            if not ready_only or state == "READY":
                entries.append({"name": name, "version": MODEL_VERSION, "state": state, "reason": reason})
        return entries


def internal_error(exc: BaseException, request_id: str, what: str = "the server failed") -> ServeError:
    """A 500 (gRPC INTERNAL) for the server's own failure: one line naming the request's id, under
    which the server's log holds the traceback."""
    return ServeError("internal", f"{what} ({summary_of(exc)}); request id {request_id}: the server's log has "
                      "the traceback")


def _config_input(spec: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": spec["name"], "data_type": config_data_type(spec["datatype"]),
                             "dims": spec["shape"][1:]}
    if len(entry["dims"]) == 3:
        entry["format"] = "FORMAT_NCHW"
    if spec["name"] in (IMAGE_INPUT, ENCODED_INPUT):  # a request gives exactly one of the two
        entry["optional"] = True
    return entry


def _instance_kind(provider: str) -> str:
    return "KIND_CPU" if "cpu" in provider.lower() or "openvino" in provider.lower() else "KIND_GPU"


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))
