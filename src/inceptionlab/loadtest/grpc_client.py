"""The load generator's gRPC transport: grpcio's asyncio client on the Open Inference Protocol's
gRPC form (`inference.GRPCInferenceService`, what Triton, KServe and `inceptionlab serve
--grpc-port` answer), with the message definitions the server itself uses (serve/proto: Triton's
.proto compiled into a descriptor set, loaded into a private pool, so this client lives beside
tritonclient.grpc in one process).

Each request is a ModelInferRequest whose one input travels in `raw_input_contents` (what Triton's
clients and perf_analyzer send), serialized once before the load; answers are counted, not decoded,
as over HTTP. The server's own figures come from the statistics extension (ModelStatistics), which
Triton and ours answer over gRPC and perf_analyzer reads too.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
from google.protobuf import json_format

from inceptionlab.errors import UserError
from inceptionlab.loadtest.payloads import ModelInfo, Prepared, tensor_requests
from inceptionlab.loadtest.server_metrics import statistics_counters
from inceptionlab.loadtest.transports import DETAIL_CHARS, Record, only_model
from inceptionlab.serve.proto import message

SERVICE = "inference.GRPCInferenceService"
# What ours answers when its queue is full (RESOURCE_EXHAUSTED) or it drains (UNAVAILABLE); Triton
# answers UNAVAILABLE for a full queue. HTTP's 503 covers both.
REJECTED = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE})
CALL_TIMEOUT_S = 10.0  # metadata and statistics calls, not timed: a server silent this long is not there
HINTS = {
    grpc.StatusCode.UNAVAILABLE: "cannot reach the server; is it running? (--protocol grpc takes the server's "
                                 "gRPC address HOST:PORT, e.g. 127.0.0.1:8001, not its HTTP port)",
    grpc.StatusCode.UNAUTHENTICATED: "the server wants a key: pass --api-key KEY (or set INCEPTIONLAB_API_KEY)",
    grpc.StatusCode.NOT_FOUND: "check --model NAME",
    grpc.StatusCode.UNIMPLEMENTED: "is this an Open Inference Protocol gRPC server?",
    grpc.StatusCode.DEADLINE_EXCEEDED: f"no answer within {CALL_TIMEOUT_S:g} s",
}


def _detail(exc: grpc.aio.AioRpcError) -> str:
    """The server's error message on one line, cut to DETAIL_CHARS."""
    return " ".join((exc.details() or "").split())[:DETAIL_CHARS]


def grpc_address(target: str) -> str:
    """HOST:PORT (a leading grpc:// is allowed); an http:// URL is refused with the fix."""
    if target.startswith(("http://", "https://")):
        raise UserError(f"{target}: --protocol grpc takes the server's gRPC address HOST:PORT (e.g. "
                        "127.0.0.1:8001), not an http:// URL")
    return target.removeprefix("grpc://")


class GrpcTransport:
    """The Open Inference Protocol over gRPC: one HTTP/2 channel, ModelInfer per request."""

    protocol = "grpc"

    def __init__(self, target: str, api_key: str | None):
        self.target = grpc_address(target)
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        self.channel = grpc.aio.insecure_channel(self.target, options=options)
        # The same key as over HTTP, as metadata (ours reads `authorization: Bearer KEY`).
        self.metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
        # No serializers: requests go out as the bytes `prepare` made, answers come back as bytes.
        self._infer = self.channel.unary_unary(f"/{SERVICE}/ModelInfer")

    async def _call(self, method: str, **fields: Any) -> Any:
        """An untimed RPC `method` (ModelMetadata, ...): its response, or a one-line UserError."""
        rpc = self.channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=message(f"{method}Response").FromString)
        try:
            return await rpc(message(f"{method}Request")(**fields), timeout=CALL_TIMEOUT_S, metadata=self.metadata)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            hint = HINTS.get(code, "see the server's log")
            raise UserError(f"{self.target}: {method} failed ({code.name}: {_detail(exc)}); {hint}") from None

    async def model_info(self, model: str | None) -> ModelInfo:
        if model is None:
            index = await self._call("RepositoryIndex", ready=True)
            model = only_model(self.target, [entry.name for entry in index.models])
        meta = await self._call("ModelMetadata", name=model)

        def tensors(entries: Any) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in entries]

        return ModelInfo(meta.name or model, tensors(meta.inputs), tensors(meta.outputs))

    def prepare(self, info: ModelInfo, payload: str, encoded: list[bytes]) -> list[Prepared]:
        requests = []
        for tensor in tensor_requests(info, payload, encoded):
            request = message("ModelInferRequest")(model_name=info.name, raw_input_contents=[tensor.data])
            request.inputs.add(name=tensor.input_name, datatype=tensor.datatype, shape=tensor.shape)
            if tensor.output:
                request.outputs.add(name=tensor.output)
            requests.append(Prepared(request.SerializeToString(), {}))
        return requests

    async def send(self, request: Prepared, scheduled: float, timeout: float) -> Record:
        sent = time.perf_counter()
        try:
            await self._infer(request.body, timeout=timeout, metadata=self.metadata)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            outcome = "timeout" if code == grpc.StatusCode.DEADLINE_EXCEEDED else \
                "rejected" if code in REJECTED else "error"
            return Record(scheduled, sent, time.perf_counter(), outcome, code.name, _detail(exc))
        return Record(scheduled, sent, time.perf_counter(), "ok", "OK")

    async def counters(self, model: str) -> dict[str, float] | None:
        """The model's statistics (Triton's extension) flattened for server_stats; None when the server
        has none."""
        try:
            reply = await self._call("ModelStatistics", name=model)
        except UserError:
            return None
        stats = json_format.MessageToDict(reply, preserving_proto_field_name=True).get("model_stats", [])
        return statistics_counters(stats[0]) if stats else None

    async def aclose(self) -> None:
        await self.channel.close()
