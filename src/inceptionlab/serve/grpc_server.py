"""The gRPC front end: the Open Inference Protocol's `inference.GRPCInferenceService` (what
tritonclient.grpc and `perf_analyzer -i grpc` call) and the standard health service
(grpc.health.v1, for Kubernetes gRPC probes), on grpc.aio in the HTTP app's event loop, on the same
models, batchers, metrics and drain (service.ServeState).

Messages come from the descriptor set compiled from Triton's .proto files, loaded into a private
descriptor pool (serve/proto says why), the same definitions the load generator's gRPC client uses.

Inference answers in the form it was asked: raw_input_contents in, raw_output_contents out (what
Triton's clients send and read); typed contents in (`contents.fp32_contents`, ...), typed out.
Errors are gRPC statuses with a one-line message naming the field or the setting (service.KINDS):
INVALID_ARGUMENT, NOT_FOUND (unknown model), RESOURCE_EXHAUSTED (queue full; a message over
--max-body-mb; more than --max-concurrency calls in progress), UNAVAILABLE (draining),
DEADLINE_EXCEEDED (--timeout-s or the client's deadline, whichever comes first), UNAUTHENTICATED
(with --api-key: the same key as over HTTP, as metadata), INTERNAL (the server's own failure: the
message names the request's id, which every ModelInfer answer also carries as `x-request-id`
trailing metadata, and the server's log has the traceback under it).

Health services: "" and "inference.GRPCInferenceService" are SERVING while the server is ready and
not draining (readiness probes), each model's name likewise, and "live" is SERVING until the
process stops (liveness probes: a draining server is alive).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import grpc
import numpy as np
from google.protobuf import json_format, message_factory
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from inceptionlab.errors import UserError
from inceptionlab.host import port_in_use
from inceptionlab.serve.proto import message, pool
from inceptionlab.serve.protocol import (
    CONTENTS_FIELDS,
    InferRequest,
    InputTensor,
    ProtocolError,
    check_header,
    class_count,
    datatype_of,
    raw_bytes,
    tensor_from_raw,
    tensor_from_values,
)
from inceptionlab.serve.service import (
    API_KEY_HELP,
    KINDS,
    MODEL_VERSION,
    REQUEST_ID_HEADER,
    ServeError,
    ServeState,
    key_matches,
    request_id_from,
)

SERVICE = "inference.GRPCInferenceService"
LIVENESS = "live"
PUBLIC_METHODS = {f"/{SERVICE}/ServerLive", f"/{SERVICE}/ServerReady",
                  "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"}
# After the drain every accepted request has its answer; calls still open are only sending it.
STOP_GRACE_S = 5.0


def _from_dict(name: str, data: dict[str, Any]) -> Any:
    return json_format.ParseDict(data, message(name)())


# --------------------------------------------------------------------------------------- tensors


def decode_request(request: Any) -> InferRequest:
    """A ModelInferRequest -> the protocol's InferRequest (the same checks as HTTP's)."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise ProtocolError(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: give "
                            "one per input, in the inputs' order")
    inputs = [_input(i, tensor, raw[i] if raw else None) for i, tensor in enumerate(request.inputs)]
    classification = {output.name: class_count(output.name, _parameter(output.parameters["classification"]))
                      for output in request.outputs if "classification" in output.parameters}
    return InferRequest(inputs, request.id or None, [output.name for output in request.outputs],
                        classification=classification)


def _parameter(value: Any) -> Any:
    """An InferParameter's value, whichever of its fields is set."""
    which = value.WhichOneof("parameter_choice")
    return getattr(value, which) if which else None


def _input(index: int, tensor: Any, raw: bytes | None) -> InputTensor:
    where = f"inputs[{index}]"
    shape = list(tensor.shape)
    try:
        if not tensor.name:
            raise ProtocolError("the input has no name")
        check_header(tensor.name, tensor.datatype, shape)
        if raw is not None:
            if tensor.HasField("contents"):
                raise ProtocolError("has contents although the request sends raw_input_contents: use one of them")
            where = f"raw_input_contents[{index}]"
            return tensor_from_raw(tensor.name, tensor.datatype, shape, raw)
        field = CONTENTS_FIELDS.get(tensor.datatype)
        if field is None:
            raise ProtocolError(f"{tensor.datatype} has no typed contents field: send it in raw_input_contents")
        where = f"inputs[{index}].contents.{field}"
        return tensor_from_values(tensor.name, tensor.datatype, shape, getattr(tensor.contents, field))
    except ProtocolError as exc:
        raise ProtocolError(f"{where}: {exc}") from None


def encode_response(model: str, request_id: str, outputs: dict[str, np.ndarray], raw: bool) -> Any:
    response = message("ModelInferResponse")(model_name=model, model_version=MODEL_VERSION, id=request_id)
    for name, array in outputs.items():
        datatype = datatype_of(array)
        tensor = response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if raw:
            response.raw_output_contents.append(raw_bytes(array))
        else:
            getattr(tensor.contents, CONTENTS_FIELDS[datatype]).extend(array.ravel().tolist())
    return response


# --------------------------------------------------------------------------------------- the service


class InferenceServicer:
    """GRPCInferenceService's RPCs that this server implements; the others answer UNIMPLEMENTED."""

    def __init__(self, state: ServeState):
        self.state = state

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return message("ServerLiveResponse")(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return message("ServerReadyResponse")(ready=self.state.accepting)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return message("ModelReadyResponse")(ready=self.state.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return _from_dict("ServerMetadataResponse", self.state.server_metadata())

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        return _from_dict("ModelMetadataResponse", self.state.model(request.name, request.version).metadata())

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        config = self.state.model_config(request.name, request.version)
        return message("ModelConfigResponse")(config=_from_dict("ModelConfig", config))

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        stats = self.state.model_stats(request.name or None, request.version)
        return _from_dict("ModelStatisticsResponse", {"model_stats": stats})

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        return _from_dict("RepositoryIndexResponse", {"models": self.state.repository_index(request.ready)})

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        if request.parameters:
            raise ProtocolError("load takes no parameters here (no config override or model files): it serves "
                                "again a model given at start-up and unloaded since")
        self.state.load_model(request.model_name)
        return message("RepositoryModelLoadResponse")()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        self.state.unload_model(request.model_name)
        return message("RepositoryModelUnloadResponse")()

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        state = self.state
        model = state.model(request.model_name, request.model_version)
        request_id = request_id_from(dict(context.invocation_metadata() or ()))
        context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id),))  # also sent with an error status
        async with state.counted(model.name, "grpc", request_id) as counted:
            state.refuse_early(model.name)
            raw = len(request.raw_input_contents) > 0
            # Raw tensors are views of the message (np.frombuffer); typed ones are copied element by
            # element (~10 ms for a 3x299x299 FP32 image), off the event loop.
            parsed = decode_request(request) if raw else await state.in_thread(decode_request, request)
            outputs = await state.infer(model, parsed, counted, context.time_remaining())
            return encode_response(model.name, request.id, outputs, raw)


def _answering_errors(rpc: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    """ServeErrors (and the protocol's own) -> the gRPC status of their kind, with their message."""
    @functools.wraps(rpc)
    async def call(request: Any, context: Any) -> Any:
        try:
            return await rpc(request, context)
        except (ProtocolError, UserError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, " ".join(str(exc).split()))
        except ServeError as exc:
            await context.abort(getattr(grpc.StatusCode, KINDS[exc.kind].grpc), str(exc))

    return call


def _inference_handler(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    service = pool().FindServiceByName(SERVICE)
    handlers = {}
    for method in service.methods:
        rpc = getattr(servicer, method.name, None)
        if rpc is None:  # ModelStreamInfer, shared memory, trace and log settings
            continue
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _answering_errors(rpc),
            request_deserializer=message_factory.GetMessageClass(method.input_type).FromString,
            response_serializer=message_factory.GetMessageClass(method.output_type).SerializeToString)
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


class _ApiKey(grpc.aio.ServerInterceptor):
    """--api-key over gRPC: the same key as over HTTP, as 'authorization: Bearer KEY' or 'x-api-key'
    metadata; liveness, readiness and the health service stay open, as HTTP's probes do."""

    def __init__(self, key: str):
        self.key = key
        self.deny = grpc.unary_unary_rpc_method_handler(self._deny)

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        metadata = {key: value for key, value in details.invocation_metadata or ()}
        if details.method in PUBLIC_METHODS or key_matches(metadata, self.key):
            return await continuation(details)
        return self.deny

    @staticmethod
    async def _deny(request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, API_KEY_HELP)


# --------------------------------------------------------------------------------------- lifecycle


@dataclass
class GrpcFront:
    server: grpc.aio.Server
    port: int

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(STOP_GRACE_S)


async def bind_grpc(state: ServeState, address: str) -> GrpcFront:
    """The gRPC server on `address` (HOST:PORT; port 0: any free one), its port bound and nothing served
    until `start`: `serve` binds it before the app starts, so a port taken since the check before the
    models loaded is a one-line error, not a failure inside uvicorn's start-up."""
    options = [
        ("grpc.so_reuseport", 0),  # a port in use is an error, not a second server sharing it
        ("grpc.max_receive_message_length", state.settings.max_body_bytes),  # HTTP's --max-body-mb
        ("grpc.max_send_message_length", -1),
    ]
    interceptors = [_ApiKey(state.settings.api_key)] if state.settings.api_key else []
    # One call past --max-concurrency is answered RESOURCE_EXHAUSTED by grpcio itself, before any handler runs.
    server = grpc.aio.server(interceptors=interceptors, options=options,
                             maximum_concurrent_rpcs=state.settings.max_concurrency)
    server.add_generic_rpc_handlers((_inference_handler(InferenceServicer(state)),))
    health_pb2_grpc.add_HealthServicer_to_server(await _health(state), server)
    host, asked = address.rsplit(":", 1)
    # The same check as the command's before the models loaded (which the port may have been taken since):
    # the OS's reason in one line, where grpcio would log its own error and raise a RuntimeError without it.
    reason = port_in_use(host.strip("[]"), int(asked)) if int(asked) else None
    try:
        if reason:
            raise RuntimeError(reason)
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise UserError(f"--grpc-port {asked}: cannot listen on {address} ({exc}); pick another port or "
                        "--grpc-port off") from None
    state.grpc_port = port
    return GrpcFront(server, port)


async def _health(state: ServeState) -> Any:
    servicer = health.aio.HealthServicer()
    readiness = ["", SERVICE, *state.models]
    for name in readiness:
        await servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    await servicer.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)

    async def not_serving() -> None:
        for name in readiness:
            await servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    state.on_drain.append(not_serving)
    return servicer
