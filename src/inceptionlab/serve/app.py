"""The HTTP front end (FastAPI): Open Inference Protocol (KServe v2) endpoints with Triton's
statistics, model configuration and repository index, /v1/classify, /metrics, the page and its
live figures (/v1/live, live.py).

Event-loop discipline: parsing big bodies, decoding images and tokenizing run in a bounded
preprocessing thread pool; inference runs in each model's batcher threads. The loop only routes.
Every error is a 4xx/5xx with a one-line {"error": "..."} body (KServe's shape), also while the
server drains; every answer carries the request's id in `X-Request-ID` (service.request_id_from); then every answer also says `Connection: close`, so no client sends another request
on a connection the server is about to close (which a client sees as an answer with no body).
The gRPC front end (grpc_server.py), when asked for, runs in the same event loop on the same state.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, AsyncIterator, Awaitable, Callable

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from inceptionlab.errors import UserError
from inceptionlab.serve.batcher import request_limit
from inceptionlab.serve.explain import ExplainService, install_explain_route
from inceptionlab.serve.live import LiveStats
from inceptionlab.serve.metrics import PROTOCOLS
from inceptionlab.serve.models import ServedModel
from inceptionlab.serve.protocol import HEADER_LENGTH, ProtocolError, encode_infer_response, parse_infer_request
from inceptionlab.serve.service import (
    API_KEY_HELP,
    MODEL_VERSION,
    REQUEST_ID_HEADER,
    RequestSettings,
    ServeError,
    ServeState,
    key_matches,
    request_id_from,
)

API_KEY_ENV = "INCEPTIONLAB_API_KEY"
PUBLIC_PATHS = ("/", "/v2/health/live", "/v2/health/ready")  # probes and the page itself need no key
PARSE_IN_THREAD_BYTES = 64_000  # json.loads of a 1x3x299x299 FP32 JSON tensor takes ~30 ms: off the loop
MAX_FORM_FIELDS = 16  # /v1/classify reads only a form's files; other fields are ignored, and bounded


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


class ApiKey:
    """--api-key: a request without the key is answered 401 from its headers alone, before its body is
    read (the body limit runs inside this); probes and the page stay open (PUBLIC_PATHS)."""

    def __init__(self, app: Any, key: str):
        self.app, self.key = app, key

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS or key_matches(_headers(scope), self.key):
            return await self.app(scope, receive, send)
        await error_response(401, API_KEY_HELP)(scope, receive, send)


class ConcurrencyLimit:
    """At most `limit` HTTP requests in progress (--max-concurrency); one more is answered 503 with
    Retry-After from its headers alone. Probes and /metrics are never refused: an overloaded server is
    alive, and its metrics say why."""

    EXEMPT = (*PUBLIC_PATHS, "/metrics")

    def __init__(self, app: Any, limit: int, retry_after_s: int):
        self.app, self.limit, self.retry_after_s = app, limit, retry_after_s
        self.in_progress = 0

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] in self.EXEMPT:
            return await self.app(scope, receive, send)
        if self.in_progress >= self.limit:
            refusal = error_response(503, f"{self.in_progress} requests are in progress (--max-concurrency "
                                     f"{self.limit}); retry later", {"Retry-After": str(self.retry_after_s)})
            return await refusal(scope, receive, send)
        self.in_progress += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_progress -= 1


def _headers(scope: dict) -> dict[str, str]:
    """The request's headers, names in lower case (ASGI gives them so; later duplicates win)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


class CloseWhileDraining:
    """While the server drains, every answer carries `Connection: close`: the client opens a new
    connection for its next request (and gets a 503 with a body) instead of reusing one that the
    server closes when it exits, which clients report as an empty answer."""

    def __init__(self, app: Any, state: ServeState):
        self.app, self.state = app, state

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_closing(message: dict) -> None:
            if message["type"] == "http.response.start" and self.state.draining:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing)


class RequestIds:
    """Every HTTP request gets its id before anything else runs (the client's X-Request-ID, else a new
    one): routes read it from `request.state.request_id`, and every answer, refusals included, carries
    it back in X-Request-ID."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = request_id_from(_headers(scope))
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (REQUEST_ID_HEADER.encode(), request_id.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_id)


# --------------------------------------------------------------------------------------- the app


def create_app(models: list[ServedModel], settings: RequestSettings | None = None,
               grpc_address: str | None = None, explain: ExplainService | None = None) -> FastAPI:
    """The HTTP app; with `grpc_address` (HOST:PORT, port 0 for any free one) it also serves gRPC,
    started and drained with the app (the bound port is `app.state.serve.grpc_port`); with `explain`
    (explain.py), POST /v1/explain answers Grad-CAM overlays (else it says how to turn them on)."""
    state = ServeState(models, settings or RequestSettings())
    live = LiveStats(state.metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await bind_grpc_port(app)  # `serve` bound it already (server.py); an app served otherwise binds it here
        state.start()
        grpc_front = app.state.grpc_front
        if grpc_front is not None:
            await grpc_front.start()
        sampler = asyncio.create_task(live.run())
        yield
        if not state.abandoned:
            await state.drain(state.settings.timeout_s)
        sampler.cancel()
        if grpc_front is not None:
            await grpc_front.stop()
        await state.stop()

    app = FastAPI(title="inceptionlab", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    app.state.live = live
    app.state.grpc_address, app.state.grpc_front = grpc_address, None
    _install_errors(app)
    # The last one added runs first: ids, then the key and the concurrency bound (both answer from the
    # headers alone), then the body limit, which reads the body.
    app.add_middleware(BodyLimit, limit=state.settings.max_body_bytes)
    app.add_middleware(ConcurrencyLimit, limit=state.settings.max_concurrency,
                       retry_after_s=state.settings.retry_after_s)
    if state.settings.api_key:
        app.add_middleware(ApiKey, key=state.settings.api_key)
    app.add_middleware(CloseWhileDraining, state=state)
    app.add_middleware(RequestIds)  # outermost: a 401, 413 or 503 carries its id too
    _health_routes(app, state)
    _oip_routes(app, state)
    _classify_routes(app, state)
    _live_routes(app, state, live)
    install_explain_route(app, state, explain)
    return app


async def bind_grpc_port(app: FastAPI) -> None:
    """Bind the gRPC front end's port (when the app serves gRPC and has not bound it yet); it serves once the
    app starts. A port in use is a UserError."""
    if app.state.grpc_address is not None and app.state.grpc_front is None:
        from inceptionlab.serve.grpc_server import bind_grpc  # grpcio: only when gRPC is asked for

        app.state.grpc_front = await bind_grpc(app.state.serve, app.state.grpc_address)


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return error_response(exc.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        return error_response(400, f"{'.'.join(map(str, first.get('loc', ())))}: {first.get('msg', 'invalid')}")

    @app.exception_handler(ServeError)
    async def serve_error(request: Request, exc: ServeError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
        return error_response(exc.status, str(exc), headers)


def _health_routes(app: FastAPI, state: ServeState) -> None:
    @app.get("/v2/health/live")
    async def live() -> dict:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        return JSONResponse({"ready": state.accepting}, status_code=200 if state.accepting else 503)

    @app.get("/v2")
    async def server_metadata() -> dict:
        return state.server_metadata()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.exposition(), media_type=state.metrics.content_type)

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(resources.files("inceptionlab.serve").joinpath("page.html").read_text())


def _oip_routes(app: FastAPI, state: ServeState) -> None:
    @app.get("/v2/models/stats")  # before /v2/models/{name}, which would take "stats" for a name
    async def all_stats() -> dict:
        return {"model_stats": state.model_stats()}

    @app.get("/v2/models/{name}/stats")
    @app.get("/v2/models/{name}/versions/{version}/stats")
    async def model_stats(name: str, version: str = "") -> dict:
        return {"model_stats": state.model_stats(name, version)}

    @app.post("/v2/repository/index")
    async def repository_index(request: Request) -> list:
        return state.repository_index(_ready_only(await request.body()))

    @app.post("/v2/repository/models/{name}/load")
    async def repository_load(name: str, request: Request) -> dict:
        _no_load_parameters(await request.body())
        state.load_model(name)
        return {}

    @app.post("/v2/repository/models/{name}/unload")
    async def repository_unload(name: str) -> dict:
        state.unload_model(name)
        return {}

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str = "") -> dict:
        return state.model(name, version).metadata()

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str = "") -> JSONResponse:
        ready = state.model_ready(name, version)
        return JSONResponse({"name": name, "ready": ready}, status_code=200 if ready else 503)

    @app.get("/v2/models/{name}/config")
    @app.get("/v2/models/{name}/versions/{version}/config")
    async def model_config(name: str, version: str = "") -> dict:
        return state.model_config(name, version)

    async def infer(request: Request) -> Response:
        name, version = request.path_params["name"], request.path_params.get("version", "")
        model = state.model(name, version)
        body = await request.body()
        async with state.counted(name, "http", request.state.request_id) as counted:
            state.refuse_early(name)
            header_length = request.headers.get(HEADER_LENGTH)
            if _json_bytes(body, header_length) > PARSE_IN_THREAD_BYTES:  # parsed and decoded in one job
                parsed, prepared = await state.in_thread(state.parse_and_prepare, model, body, header_length)
            else:
                parsed, prepared = parse_infer_request(body, header_length), None
            outputs = await state.infer(model, parsed, counted, prepared=prepared)
            payload, headers = encode_infer_response(name, MODEL_VERSION, parsed, outputs)
            return Response(payload, headers=headers)

    hot_route(app, "/v2/models/{name}/infer", infer)
    hot_route(app, "/v2/models/{name}/versions/{version}/infer", infer)


def hot_route(app: FastAPI, path: str, endpoint: Callable[[Request], Awaitable[Response]]) -> None:
    """An inference route as a plain Starlette route, first in the router's list: FastAPI's parameter
    injection and a scan past the other routes cost the event loop ~30% of its Python calls per request
    (the demo model's /v1/classify, counted with sys.setprofile). Path and query values are read by hand."""
    app.router.routes.insert(0, Route(path, endpoint, methods=["POST"]))


def _no_load_parameters(body: bytes) -> None:
    """The repository's load takes no config override or files here: its models are the ones given at start-up."""
    if not body.strip():
        return
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ServeError("invalid", f"invalid JSON in the load request ({exc}); send nothing or {{}}") from None
    if data not in ({}, {"parameters": {}}):
        raise ServeError("invalid", "load takes no parameters here (no config override or model files): it serves "
                         "again a model given at start-up and unloaded since")


def _json_bytes(body: bytes, header_length: str | None) -> int:
    """How much of the body is JSON to parse: the binary extension's tensors are views of the body, parsed
    at no cost whatever their size."""
    return int(header_length) if header_length and header_length.isdigit() else len(body)


def _ready_only(body: bytes) -> bool:
    """The repository index request's optional {"ready": true}."""
    if not body.strip():
        return False
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ServeError("invalid", f'invalid JSON in the repository index request ({exc}); send {{"ready": true}} '
                         "or nothing") from None
    if not isinstance(data, dict) or not isinstance(data.get("ready", False), bool):
        raise ServeError("invalid", 'the repository index request takes {"ready": true|false}')
    return data.get("ready", False)


# --------------------------------------------------------------------------------------- /v1/live


def _live_routes(app: FastAPI, state: ServeState, live: LiveStats) -> None:
    @app.get("/v1/live")
    async def live_figures() -> dict:
        """What the page draws: per model and front end, the last minutes of the server's own metrics."""
        return live.view(PROTOCOLS if state.grpc_port is not None else ["http"])


# --------------------------------------------------------------------------------------- /v1/classify


def _classify_routes(app: FastAPI, state: ServeState) -> None:
    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"models": [{"name": m.name, "input_kind": m.spec.input_kind, "arch": m.spec.arch,
                            "classes": m.spec.num_classes, "provider": m.provider, "backend": m.backend,
                            "precision": m.precision, "temperature": m.rule.temperature,
                            "reject_threshold": m.rule.threshold, "tta": m.tta, "rule": m.rule.to_dict()}
                           for m in state.models.values()]}

    async def classify(request: Request) -> JSONResponse:
        started = time.perf_counter()
        served = state.model(request.query_params.get("model") or next(iter(state.models)))
        k = _topk(request.query_params.get("topk")) or state.settings.topk
        async with state.counted(served.name, "http", request.state.request_id) as counted:
            state.refuse_early(served.name)
            names, item, count, errors = await _classify_inputs(state, served, request)
            result = await state.submit(served.name, item, count, counted.request_id)
            counted.outcome = "success"
            results = _classify_results(served, names, result, k, errors)
            return JSONResponse({"model": served.name, "results": results,
                                 "time_ms": round((time.perf_counter() - started) * 1e3, 2)})

    hot_route(app, "/v1/classify", classify)


def _topk(value: str | None) -> int | None:
    """?topk=K: a positive whole number, or absent."""
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ServeError("invalid", f"topk {value!r}: give a positive whole number of classes")
    return int(value)


async def _classify_inputs(state: ServeState, served: ServedModel,
                           request: Request) -> tuple[list[str], Any, int, dict[str, str]]:
    """Raw image body, multipart files, or {"text": ...}: names, model input, count, per-file errors."""
    content_type = request.headers.get("content-type", "")
    if not served.is_image:
        texts = _texts_from(await request.body(), content_type)
        item, count = await state.in_thread(served.encode_texts, texts)
        return texts, item, count, {}
    if content_type.startswith("multipart/form-data"):
        files = await _uploaded_files(request, served)
    else:
        files = [("body", await request.body())]
    return await state.in_thread(_decode_some, served, files)


async def _uploaded_files(request: Request, served: ServedModel) -> list[tuple[str, bytes]]:
    """The form's files, counted as they are parsed: one past the most a request may hold ends the
    parse, before anything is decoded."""
    limit = served.max_request
    try:
        form = await request.form(max_files=limit, max_fields=MAX_FORM_FIELDS)
    except StarletteHTTPException as exc:
        if "Too many files" not in str(exc.detail):
            raise
        raise ProtocolError(f"more than {limit} images in one request "
                            f"({request_limit(served.max_batch, limit, served.auto_limit)}); "
                            "split them") from None
    files = [(v.filename or key, await v.read()) for key, v in form.multi_items() if hasattr(v, "read")]
    if not files:
        raise ProtocolError("the multipart form has no files; send images as file fields")
    return files


def _decode_some(served: ServedModel, files: list[tuple[str, bytes]]) -> tuple[list[str], Any, int, dict[str, str]]:
    """Decode every file; bad ones become per-file errors unless none is usable (then a 400). The
    request's pixel budget is checked first, from the files' headers."""
    served.check_pixel_budget([data for _, data in files])
    good, names, errors = [], [], {}
    for name, data in files:
        try:
            good.append(served.preprocess_image(data, name))
            names.append(name)
        except (ProtocolError, UserError) as exc:
            errors[name] = " ".join(str(exc).split())
    if not good:
        raise ProtocolError(next(iter(errors.values())))
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


def _classify_results(served: ServedModel, names: list[str], result: dict[str, Any], k: int,
                      errors: dict[str, str]) -> list[dict[str, Any]]:
    """Per input, like `predict --json`: the rule's answer, score and unknown, and the top k; a text model's
    also its top label and P(positive), like `predict --text --json`."""
    key = "file" if served.is_image else "text"
    results = []
    for name, row, answer in zip(names, result["probabilities"], result["answers"]):
        item: dict[str, Any] = {key: name, **answer, "topk": served.topk(row, k)}
        if not served.is_image:
            top = item["topk"][0]
            item["label"] = top["label"]
            item["probability"] = round(float(row[-1] if len(row) == 2 else row[top["index"]]), 6)
        results.append(item)
    results += [{key: name, "error": message} for name, message in errors.items()]
    return results
