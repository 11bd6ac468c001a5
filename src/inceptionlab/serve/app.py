"""The FastAPI app: Open Inference Protocol (KServe v2) endpoints, /v1/classify, /metrics, the page.

Event-loop discipline: parsing big bodies, decoding images and tokenizing run in a bounded
preprocessing thread pool; inference runs in each model's batcher threads. The loop only routes.
Every error is a 4xx/5xx with a one-line {"error": "..."} body (KServe's shape).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any, AsyncIterator, Callable

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from inceptionlab import __version__
from inceptionlab.errors import UserError
from inceptionlab.serve.batcher import Draining, DynamicBatcher, QueueFull
from inceptionlab.serve.metrics import ServeMetrics
from inceptionlab.serve.models import ServedModel
from inceptionlab.serve.protocol import HEADER_LENGTH, ProtocolError, encode_infer_response, parse_infer_request

API_KEY_ENV = "INCEPTIONLAB_API_KEY"
PUBLIC_PATHS = ("/", "/v2/health/live", "/v2/health/ready")  # probes and the page itself need no key
PARSE_IN_THREAD_BYTES = 64_000  # json.loads of a 1x3x299x299 FP32 JSON tensor takes ~30 ms: off the loop


@dataclass
class ServerSettings:
    max_delay_ms: float = 2.0
    max_queue: int = 256
    timeout_s: float = 30.0
    max_body_bytes: int = 20 * 1024 * 1024  # 20 MiB: a 12 Mpx JPEG is ~5 MB, a 32x299x299 FP32 batch 34 MB
    api_key: str | None = None
    topk: int = 5
    preprocess_threads: int = max(2, os.cpu_count() or 2)
    retry_after_s: int = 1


class ServeState:
    """What the routes share: the models, their batchers, the metrics, readiness."""

    def __init__(self, models: list[ServedModel], settings: ServerSettings):
        self.models = {m.name: m for m in models}
        self.settings = settings
        self.metrics = ServeMetrics()
        self.batchers: dict[str, DynamicBatcher] = {}
        self.ready = False
        self.draining = False
        self.preprocess = ThreadPoolExecutor(settings.preprocess_threads, thread_name_prefix="preprocess")

    def start(self) -> None:
        for name, model in self.models.items():
            batcher = DynamicBatcher(model.run, model.max_batch, self.settings.max_delay_ms / 1e3,
                                     self.settings.max_queue, len(model.engines), self.metrics.on_batch(name), name)
            batcher.start()
            self.batchers[name] = batcher
            self.metrics.add_model(name, lambda b=batcher: b.pending)
        self.ready = True

    async def drain(self, timeout_s: float) -> bool:
        """Readiness turns 503, nothing new is accepted, everything accepted is answered (bounded)."""
        self.draining = True
        results = await asyncio.gather(*(b.drain(timeout_s) for b in self.batchers.values()))
        return all(results)

    async def stop(self) -> None:
        await asyncio.gather(*(b.stop() for b in self.batchers.values()))
        self.preprocess.shutdown(wait=False, cancel_futures=True)

    def model(self, name: str) -> ServedModel:
        if name not in self.models:
            raise ApiError(404, f"unknown model {name!r}; this server has {', '.join(self.models)}")
        return self.models[name]

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.preprocess, fn, *args)


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None,
                 outcome: str = "bad_request"):
        super().__init__(message)
        self.status, self.headers, self.outcome = status, headers or {}, outcome


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": " ".join(message.split())}, status_code=status, headers=headers)


# --------------------------------------------------------------------------------------- middleware


class BodyLimit:
    """Reads the whole body first (bounded): 413 for too much, a quiet end when the client goes."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._too_large(scope, receive, send, int(declared))
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its request: nothing was accepted
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._too_large(scope, receive, send, size)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: waits for http.disconnect, as Starlette expects

        await self.app(scope, replay, send)

    async def _too_large(self, scope: dict, receive: Callable, send: Callable, size: int) -> None:
        response = error_response(413, f"request body of {size} bytes is above the {self.limit}-byte limit "
                                  "(--max-body-mb); send smaller images or fewer per request")
        await response(scope, receive, send)


def _key_ok(request: Request, key: str) -> bool:
    given = request.headers.get("x-api-key") or ""
    auth = request.headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    return hmac.compare_digest(given.encode(), key.encode())


# --------------------------------------------------------------------------------------- the app


def create_app(models: list[ServedModel], settings: ServerSettings | None = None) -> FastAPI:
    state = ServeState(models, settings or ServerSettings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.start()
        yield
        await state.drain(state.settings.timeout_s)
        await state.stop()

    app = FastAPI(title="inceptionlab", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    _install_errors(app)
    if state.settings.api_key:
        _install_api_key(app, state.settings.api_key)
    app.add_middleware(BodyLimit, limit=state.settings.max_body_bytes)
    _health_routes(app, state)
    _oip_routes(app, state)
    _classify_routes(app, state)
    return app


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return error_response(exc.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        return error_response(400, f"{'.'.join(map(str, first.get('loc', ())))}: {first.get('msg', 'invalid')}")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, str(exc), exc.headers)


def _install_api_key(app: FastAPI, key: str) -> None:
    @app.middleware("http")
    async def require_key(request: Request, call_next: Callable) -> Response:
        if request.url.path not in PUBLIC_PATHS and not _key_ok(request, key):
            return error_response(401, "missing or wrong API key: send it as 'Authorization: Bearer KEY' "
                                  "or 'X-API-Key: KEY'")
        return await call_next(request)


def _health_routes(app: FastAPI, state: ServeState) -> None:
    @app.get("/v2/health/live")
    async def live() -> dict:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        ok = state.ready and not state.draining
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/v2")
    async def server_metadata() -> dict:
        return {"name": "inceptionlab", "version": __version__, "extensions": ["binary_tensor_data"]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.exposition(), media_type=state.metrics.content_type)

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(resources.files("inceptionlab.serve").joinpath("page.html").read_text())


def _oip_routes(app: FastAPI, state: ServeState) -> None:
    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str = "1") -> dict:
        return state.model(name).metadata()

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str = "1") -> JSONResponse:
        state.model(name)
        ok = state.ready and not state.draining
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    @app.get("/v2/models/{name}/config")
    async def model_config(name: str) -> dict:
        return _config(state.model(name), state.settings)

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(name: str, request: Request, version: str = "1") -> Response:
        started = time.perf_counter()
        model = state.model(name)
        body = await request.body()
        async with _counted(state, name, started) as counted:
            _refuse_early(state, name)
            parse = (parse_infer_request, body, request.headers.get(HEADER_LENGTH))
            parsed = await state.in_thread(*parse) if len(body) > PARSE_IN_THREAD_BYTES else parse[0](*parse[1:])
            if len(parsed.inputs) != 1:
                raise ProtocolError(f"model {name!r} takes one input: {model.accepted_inputs()}")
            unknown = [o for o in parsed.outputs if o not in ("probabilities", "logits")]
            if unknown:
                raise ProtocolError(f"model {name!r} has no output {unknown[0]!r}; it has probabilities, logits")
            item, count = await state.in_thread(model.prepare_tensor, parsed.inputs[0])
            result, counted.outcome = await _submit(state, name, item, count)
            wanted = parsed.outputs or ["probabilities", "logits"]
            payload, headers = encode_infer_response(name, "1", parsed, {k: result[k] for k in wanted})
            return Response(payload, headers=headers)


@dataclass
class _Counted:
    outcome: str = "bad_request"  # until the batcher answers (or an ApiError says otherwise)


@asynccontextmanager
async def _counted(state: ServeState, name: str, started: float) -> AsyncIterator[_Counted]:
    """One request's bookkeeping for both inference routes: library errors become one-line 4xx, and
    every request is counted by outcome with its time, whatever happens."""
    counted = _Counted()
    try:
        yield counted
    except (ProtocolError, UserError) as exc:
        raise ApiError(getattr(exc, "status", 400), str(exc)) from None
    except ApiError as exc:
        counted.outcome = exc.outcome
        raise
    finally:
        state.metrics.requests.labels(name, counted.outcome).inc()
        state.metrics.request_time.labels(name).observe(time.perf_counter() - started)


def _refuse_early(state: ServeState, name: str) -> None:
    """503 before parsing when the queue is full or the server drains."""
    try:
        state.batchers[name].check_accepting()
    except (QueueFull, Draining) as exc:
        raise _unavailable(state, exc) from None


def _unavailable(state: ServeState, exc: Exception) -> ApiError:
    return ApiError(503, f"{exc}; retry later", {"Retry-After": str(state.settings.retry_after_s)}, "rejected")


async def _submit(state: ServeState, name: str, item: Any, count: int) -> tuple[Any, str]:
    """Queue one request; map refusals to HTTP (the outcome is recorded by the caller's finally)."""
    batcher = state.batchers[name]
    try:
        return await batcher.submit(item, count, state.settings.timeout_s), "success"
    except (QueueFull, Draining) as exc:
        raise _unavailable(state, exc) from None
    except ValueError as exc:  # bigger than --max-batch
        raise ApiError(400, str(exc)) from None
    except asyncio.TimeoutError:
        message = f"no answer within {state.settings.timeout_s:g} s (--timeout-s)"
        raise ApiError(504, message, outcome="timeout") from None
    except Exception as exc:  # noqa: BLE001 - a failed batch: a 500 for its requests, the server goes on
        raise ApiError(500, f"inference failed: {type(exc).__name__}: {exc}", outcome="error") from None


def _config(model: ServedModel, settings: ServerSettings) -> dict[str, Any]:
    """A minimal Triton-style model configuration."""
    meta = model.metadata()
    return {
        "name": model.name,
        "platform": meta["platform"],
        "backend": model.backend,
        "precision": model.precision,
        "provider": model.provider,
        "max_batch_size": model.max_batch,
        "input": meta["inputs"],
        "output": meta["outputs"],
        "accepted_inputs": model.accepted_inputs(),
        "dynamic_batching": {
            "preferred_batch_size": model.buckets,
            "max_queue_delay_microseconds": int(settings.max_delay_ms * 1000),
            "default_queue_policy": {"max_queue_size": settings.max_queue,
                                     "default_timeout_microseconds": int(settings.timeout_s * 1e6)},
        },
        "instance_group": [{"count": len(model.engines), "kind": "KIND_CPU" if "cpu" in model.provider.lower()
                            or "openvino" in model.provider.lower() else "KIND_GPU"}],
        "labels": model.spec.labels,
    }


# --------------------------------------------------------------------------------------- /v1/classify


def _classify_routes(app: FastAPI, state: ServeState) -> None:
    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"models": [{"name": m.name, "input_kind": m.spec.input_kind, "arch": m.spec.arch,
                            "classes": m.spec.num_classes, "provider": m.provider, "backend": m.backend,
                            "precision": m.precision} for m in state.models.values()]}

    @app.post("/v1/classify")
    async def classify(request: Request, model: str | None = None, topk: int | None = None) -> JSONResponse:
        started = time.perf_counter()
        served = state.model(model or next(iter(state.models)))
        k = topk or state.settings.topk
        async with _counted(state, served.name, started) as counted:
            _refuse_early(state, served.name)
            names, item, count, errors = await _classify_inputs(state, served, request)
            result, counted.outcome = await _submit(state, served.name, item, count)
            results = _classify_results(served, names, result["probabilities"], k, errors)
            return JSONResponse({"model": served.name, "results": results,
                                 "time_ms": round((time.perf_counter() - started) * 1e3, 2)})


async def _classify_inputs(state: ServeState, served: ServedModel,
                           request: Request) -> tuple[list[str], Any, int, dict[str, str]]:
    """Raw image body, multipart files, or {"text": ...}: names, model input, count, per-file errors."""
    content_type = request.headers.get("content-type", "")
    if not served.is_image:
        texts = _texts_from(await request.body(), content_type)
        item, count = await state.in_thread(served.encode_texts, texts)
        return texts, item, count, {}
    if content_type.startswith("multipart/form-data"):
        form = await request.form()
        files = [(v.filename or key, await v.read()) for key, v in form.multi_items() if hasattr(v, "read")]
        if not files:
            raise ProtocolError("the multipart form has no files; send images as file fields")
    else:
        files = [("body", await request.body())]
    return await state.in_thread(_decode_some, served, files)


def _decode_some(served: ServedModel, files: list[tuple[str, bytes]]) -> tuple[list[str], Any, int, dict[str, str]]:
    """Decode every file; bad ones become per-file errors unless none is usable (then a 400)."""
    good, names, errors = [], [], {}
    for name, data in files:
        try:
            good.append(served.preprocess_image(data, name))
            names.append(name)
        except (ProtocolError, UserError) as exc:
            errors[name] = " ".join(str(exc).split())
    if not good:
        raise ProtocolError(next(iter(errors.values())))
    if len(good) > served.max_batch:
        raise ProtocolError(f"{len(good)} images in one request exceed --max-batch {served.max_batch}; split them")
    return names, np.stack(good), len(good), errors


def _texts_from(body: bytes, content_type: str) -> list[str]:
    if not body:
        raise ProtocolError('empty request body: send {"text": "..."} (or {"texts": [...]})')
    if content_type.startswith("text/plain"):
        return [body.decode("utf-8", errors="replace")]
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f'invalid JSON ({exc}); send {{"text": "..."}}') from None
    texts = [data["text"]] if isinstance(data, dict) and isinstance(data.get("text"), str) else \
        data.get("texts") if isinstance(data, dict) else None
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ProtocolError('a text model takes {"text": "..."} or {"texts": ["...", ...]}')
    return texts


def _classify_results(served: ServedModel, names: list[str], probs: Any, k: int,
                      errors: dict[str, str]) -> list[dict[str, Any]]:
    key = "file" if served.is_image else "text"
    results = []
    for name, row in zip(names, probs):
        result: dict[str, Any] = {key: name, "topk": served.topk(row, k)}
        if not served.is_image:  # like `predict --text --json`: label and P(positive)
            top = result["topk"][0]
            result["label"] = top["label"]
            result["probability"] = round(float(row[-1] if len(row) == 2 else row[top["index"]]), 6)
        results.append(result)
    results += [{key: name, "error": message} for name, message in errors.items()]
    return results
