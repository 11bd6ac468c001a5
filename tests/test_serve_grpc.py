"""`inceptionlab serve`'s gRPC front end, driven by tritonclient.grpc as Triton users drive it: health
and metadata, inference with raw and typed contents, BYTES images and texts, FP32/UINT8 tensors,
every bad input with its status code, overload, deadlines, the API key, the health service, the
statistics and repository index; and the descriptor set the server loads is what protoc makes of
Triton's .proto files. (SIGTERM under gRPC load: test_serve_sigterm.py.)"""

from __future__ import annotations

import asyncio
import io
import logging
import socket
import threading
from contextlib import contextmanager
from typing import Iterator

import grpc
import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tg_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from PIL import Image
from serve_helpers import broken_model, serve_model, train_tiny_run, train_tiny_text_run, uvicorn_thread
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from inceptionlab.serve.app import create_app
from inceptionlab.serve.service import RequestSettings, ServeState

LABELS = ["cat", "dog", "fox"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    run_dir, data = train_tiny_run(tmp_path_factory)
    return run_dir, data, serve_model(run_dir)


@contextmanager
def grpc_server(models, settings: RequestSettings | None = None) -> Iterator[tuple[str, str, ServeState]]:
    """HTTP and gRPC on 127.0.0.1 (free ports) in a thread: (HTTP base URL, gRPC address, state)."""
    app = create_app(models, settings or RequestSettings(), grpc_address="127.0.0.1:0")
    with uvicorn_thread(app) as base:
        state = app.state.serve
        yield base, f"127.0.0.1:{state.grpc_port}", state


@pytest.fixture(scope="module")
def server(tiny):
    with grpc_server([tiny[2]]) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with tg.InferenceServerClient(server[1]) as c:
        yield c


@pytest.fixture(scope="module")
def stub(server):
    """Triton's own generated stub, for requests tritonclient's helpers never send (typed contents,
    malformed messages)."""
    with grpc.insecure_channel(server[1]) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def images(tiny, count: int = 2) -> list[bytes]:
    return [f.read_bytes() for f in sorted((tiny[1] / "val").rglob("*.png"))[:count]]


def pixels_of(tiny) -> tuple[np.ndarray, np.ndarray]:
    """One val image as the model's UINT8 input and as its normalised FP32 input (1x3x75x75)."""
    model = tiny[2]
    image = Image.open(sorted((tiny[1] / "val" / "fox").glob("*.png"))[0]).convert("RGB")
    pixels = np.asarray(torch.as_tensor(model.transform(image)))[None]
    return pixels, model.normalize(torch.from_numpy(pixels.copy())).numpy()


def bytes_input(name: str, blobs: list[bytes], shape: list[int]) -> tg.InferInput:
    tensor = tg.InferInput(name, shape, "BYTES")
    tensor.set_data_from_numpy(np.array(blobs, dtype=object).reshape(shape))
    return tensor


def tensor_input(array: np.ndarray, name: str = "images") -> tg.InferInput:
    tensor = tg.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32 else "UINT8")
    tensor.set_data_from_numpy(array)
    return tensor


def http_probabilities(base: str, blob: bytes) -> dict[str, float]:
    topk = httpx.post(f"{base}/v1/classify?topk=3", content=blob, timeout=30).json()["results"][0]["topk"]
    return {t["label"]: t["prob"] for t in topk}


# --------------------------------------------------------------------------------------- metadata


def test_health_metadata_and_config_match_http(server, client):
    base = server[0]
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("tiny")
    metadata = client.get_server_metadata()
    assert metadata.name == "inceptionlab" and {"statistics", "binary_tensor_data"} <= set(metadata.extensions)
    model = client.get_model_metadata("tiny")
    http = httpx.get(f"{base}/v2/models/tiny").json()
    assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == \
        [(t["name"], t["datatype"], t["shape"]) for t in http["inputs"]] == \
        [("images", "FP32", [-1, 3, 75, 75]), ("image_bytes", "BYTES", [-1, 1])]
    assert [(t.name, list(t.shape)) for t in model.outputs] == [("probabilities", [-1, 3]), ("logits", [-1, -1])]
    config = client.get_model_config("tiny").config
    assert config.max_batch_size == 8 and list(config.dynamic_batching.preferred_batch_size) == [1, 2, 4, 8]
    encoded = config.input[1]
    assert (encoded.name, encoded.data_type, list(encoded.dims), encoded.optional) == \
        ("image_bytes", model_config_pb2.TYPE_STRING, [1], True)
    assert config.input[0].format == model_config_pb2.ModelInput.FORMAT_NCHW
    assert config.parameters["labels"].string_value.split("\n") == LABELS
    with pytest.raises(InferenceServerException) as missing:
        client.get_model_metadata("resnet999")
    assert missing.value.status() == "StatusCode.NOT_FOUND" and "unknown model" in missing.value.message()


def test_statistics_and_repository_index_match_http(server, client, tiny):
    client.infer("tiny", [bytes_input("image_bytes", images(tiny, 1), [1, 1])])
    stats = client.get_inference_statistics("tiny").model_stats[0]
    http = httpx.get(f"{server[0]}/v2/models/tiny/stats").json()["model_stats"][0]
    assert stats.inference_count == http["inference_count"] >= 1
    assert stats.inference_stats.success.count == http["inference_stats"]["success"]["count"] >= 1
    assert stats.inference_stats.queue.ns == http["inference_stats"]["queue"]["ns"] > 0
    assert stats.inference_stats.compute_infer.count == stats.inference_stats.compute_output.count
    index = client.get_model_repository_index()
    assert [(m.name, m.version, m.state) for m in index.models] == [("tiny", "1", "READY")]


# --------------------------------------------------------------------------------------- inference


@pytest.mark.parametrize("name, shape", [("image_bytes", [2, 1]), ("image_bytes", [2]), ("images", [2, 1])])
def test_encoded_images_as_raw_bytes_answer_like_http(server, client, tiny, name, shape):
    blobs = images(tiny)
    result = client.infer("tiny", [bytes_input(name, blobs, shape)])
    probs = result.as_numpy("probabilities")
    assert probs.shape == (2, 3) and result.as_numpy("logits").shape == (2, 3)
    for row, blob in zip(probs, blobs):
        assert dict(zip(LABELS, row.tolist())) == pytest.approx(http_probabilities(server[0], blob), abs=1e-4)


def test_fp32_uint8_and_encoded_inputs_agree_raw_and_typed(server, client, stub, tiny):
    pixels, normalised = pixels_of(tiny)
    raw_fp32 = client.infer("tiny", [tensor_input(normalised)], outputs=[tg.InferRequestedOutput("probabilities")])
    assert raw_fp32.get_response().outputs[0].name == "probabilities" and len(raw_fp32.get_response().outputs) == 1
    raw_uint8 = client.infer("tiny", [tensor_input(pixels)]).as_numpy("probabilities")
    np.testing.assert_allclose(raw_fp32.as_numpy("probabilities"), raw_uint8, atol=1e-5)

    def typed(datatype: str, field: str, values, shape) -> np.ndarray:
        request = service_pb2.ModelInferRequest(model_name="tiny", id=f"typed-{datatype}")
        tensor = request.inputs.add(name="images" if datatype != "BYTES" else "image_bytes", datatype=datatype,
                                    shape=shape)
        getattr(tensor.contents, field).extend(values)
        response = stub.ModelInfer(request)
        assert response.id == f"typed-{datatype}" and not response.raw_output_contents  # answered typed, as asked
        [probs] = [o for o in response.outputs if o.name == "probabilities"]
        assert probs.datatype == "FP32" and list(probs.shape) == [1, 3]
        return np.array(probs.contents.fp32_contents, dtype=np.float32).reshape(1, 3)

    buffer = io.BytesIO()
    Image.open(sorted((tiny[1] / "val" / "fox").glob("*.png"))[0]).convert("RGB").save(buffer, format="PNG")
    answers = [typed("FP32", "fp32_contents", normalised.ravel().tolist(), [1, 3, 75, 75]),
               typed("UINT8", "uint_contents", pixels.ravel().tolist(), [1, 3, 75, 75]),
               typed("BYTES", "bytes_contents", [buffer.getvalue()], [1, 1])]
    for answer in answers:
        np.testing.assert_allclose(answer, raw_uint8, atol=1e-5)


def test_text_model_over_grpc_answers_like_predict_text(tmp_path_factory):
    from inceptionlab.infer.text import TextPredictor

    run_dir = train_tiny_text_run(tmp_path_factory)
    reviews = ["a great and wonderful film", "awful, boring and dull"]
    expected = [p["probability"] for p in TextPredictor.from_run(run_dir, torch.device("cpu")).predict(reviews)]
    with grpc_server([serve_model(run_dir)]) as (_, address, _state), tg.InferenceServerClient(address) as c:
        assert [(t.name, t.datatype, list(t.shape)) for t in c.get_model_metadata("tiny").inputs] == \
            [("text", "BYTES", [-1, 1])]
        for shape in ([2, 1], [2]):
            probs = c.infer("tiny", [bytes_input("text", [r.encode() for r in reviews], shape)]).as_numpy("probabilities")
            assert probs[:, 1].tolist() == pytest.approx(expected, abs=1e-5)


# --------------------------------------------------------------------------------------- bad input


def _request(*tensors, raw=(), outputs=(), model="tiny") -> service_pb2.ModelInferRequest:
    """tensors: (name, datatype, shape, contents field or None, values)."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype, shape, field, values in tensors:
        tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
        if field:
            getattr(tensor.contents, field).extend(values)
    request.raw_input_contents.extend(raw)
    for output in outputs:
        request.outputs.add(name=output)
    return request


FP32_IMAGE = ("images", "FP32", [1, 3, 75, 75], None, ())
ZEROS = bytes(4 * 3 * 75 * 75)
BYTES_OF = b"".join  # raw BYTES: each element a 4-byte little-endian length, then its bytes
BAD_REQUESTS = {
    "unknown model": (_request(FP32_IMAGE, raw=[ZEROS], model="resnet999"), "NOT_FOUND", "unknown model 'resnet999'"),
    "wrong input name": (_request(("pixels", "FP32", [1, 3, 75, 75], None, ()), raw=[ZEROS]), "INVALID_ARGUMENT",
                         "no input 'pixels'"),
    "wrong shape": (_request(("images", "FP32", [1, 3, 32, 32], None, ()), raw=[bytes(4 * 3 * 32 * 32)]),
                    "INVALID_ARGUMENT", "[1, 3, 32, 32]"),
    "wrong datatype": (_request(("images", "INT64", [1, 3, 75, 75], None, ()), raw=[bytes(8 * 3 * 75 * 75)]),
                       "INVALID_ARGUMENT", "INT64"),
    "unknown datatype": (_request(("images", "FP8", [1], None, ()), raw=[b"\0"]), "INVALID_ARGUMENT",
                         "inputs[0]: input 'images': datatype 'FP8' is not an OIP datatype"),
    "negative dimension": (_request(("images", "FP32", [-1, 3, 75, 75], None, ()), raw=[ZEROS]), "INVALID_ARGUMENT",
                           "non-negative integers"),
    "raw bytes short of the shape": (_request(FP32_IMAGE, raw=[bytes(12)]), "INVALID_ARGUMENT",
                                     "raw_input_contents[0]: input 'images': shape [1, 3, 75, 75] needs 16875 "
                                     "elements, got 3"),
    "typed values short of the shape": (_request(("images", "FP32", [1, 3, 75, 75], "fp32_contents", [0.0] * 3)),
                                        "INVALID_ARGUMENT", "inputs[0].contents.fp32_contents: input 'images': "
                                        "shape [1, 3, 75, 75] needs 16875 elements, got 3"),
    "raw entries for no input": (_request(FP32_IMAGE, raw=[ZEROS, ZEROS]), "INVALID_ARGUMENT",
                                 "raw_input_contents has 2 entries for 1 inputs"),
    "contents and raw both": (_request(("images", "FP32", [1, 3, 75, 75], "fp32_contents", [0.0] * 16875), raw=[ZEROS]),
                              "INVALID_ARGUMENT", "inputs[0]: has contents although the request sends raw"),
    "no input": (_request(), "INVALID_ARGUMENT", "exactly one input per request (given: none)"),
    "two inputs": (_request(FP32_IMAGE, ("image_bytes", "BYTES", [1, 1], None, ()),
                            raw=[ZEROS, BYTES_OF([b"\x01\0\0\0", b"x"])]), "INVALID_ARGUMENT",
                   "given: 'images', 'image_bytes'"),
    "BYTES of shape [1, 2]": (_request(("image_bytes", "BYTES", [1, 2], "bytes_contents", [b"a", b"b"])),
                              "INVALID_ARGUMENT", "'image_bytes': takes BYTES of shape [N] or [N, 1], got BYTES [1, 2]"),
    "not an image": (_request(("image_bytes", "BYTES", [1, 1], "bytes_contents", [b"this is not an image"])),
                     "INVALID_ARGUMENT", "not an image"),
    "UINT8 value out of range": (_request(("images", "UINT8", [1, 3, 75, 75], "uint_contents", [300] * 16875)),
                                 "INVALID_ARGUMENT", "not a UINT8 array"),
    "FP16 typed": (_request(("images", "FP16", [1], "fp32_contents", [0.0])), "INVALID_ARGUMENT",
                   "FP16 has no typed contents field: send it in raw_input_contents"),
    "more images than --max-batch": (_request(("image_bytes", "BYTES", [9, 1], "bytes_contents", [b"x"] * 9)),
                                     "INVALID_ARGUMENT", "exceeds --max-batch 8"),
    "unknown output": (_request(FP32_IMAGE, raw=[ZEROS], outputs=["scores"]), "INVALID_ARGUMENT",
                       "no output 'scores'"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_input_gets_its_status_code_and_the_next_request_is_answered(stub, client, tiny, case):
    request, code, words = BAD_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request)
    assert refused.value.code() == getattr(grpc.StatusCode, code)
    assert words in refused.value.details() and "\n" not in refused.value.details()
    good = client.infer("tiny", [bytes_input("image_bytes", images(tiny, 1), [1, 1])])
    assert good.as_numpy("probabilities").shape == (1, 3)


def test_an_answer_carries_its_request_id_in_the_trailing_metadata(stub, tiny):
    request = _request(("image_bytes", "BYTES", [1, 1], "bytes_contents", images(tiny, 1)))
    _, call = stub.ModelInfer.with_call(request, metadata=[("x-request-id", "grpc-ok")])
    assert dict(call.trailing_metadata())["x-request-id"] == "grpc-ok"
    _, call = stub.ModelInfer.with_call(request)
    assert len(dict(call.trailing_metadata())["x-request-id"]) == 32  # a new id when the client gives none


def test_a_failing_model_is_internal_naming_the_request_id_the_log_has(tiny, caplog):
    request = _request(("image_bytes", "BYTES", [1, 1], "bytes_contents", images(tiny, 1)))
    with grpc_server([broken_model(tiny[0])]) as (_, address, _state), grpc.insecure_channel(address) as channel, \
            caplog.at_level(logging.ERROR, logger="inceptionlab"):
        with pytest.raises(grpc.RpcError) as failed:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=[("x-request-id", "grpc-7")])
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert "mat1 and mat2 shapes cannot be multiplied" in failed.value.details()
    assert "request id grpc-7: the server's log has the traceback" in failed.value.details()
    assert dict(failed.value.trailing_metadata())["x-request-id"] == "grpc-7"
    [logged] = [r for r in caplog.records if r.name == "inceptionlab.serve.batcher"]
    assert "(request ids: grpc-7)" in logged.getMessage() and "mat1 and mat2" in str(logged.exc_info[1])


def test_a_message_over_the_body_limit_is_resource_exhausted(tiny):
    with grpc_server([tiny[2]], RequestSettings(max_body_bytes=100_000)) as (_, address, _state):
        with tg.InferenceServerClient(address) as c, pytest.raises(InferenceServerException) as refused:
            c.infer("tiny", [bytes_input("image_bytes", [bytes(200_000)], [1, 1])])
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


# --------------------------------------------------------------------------------------- load, time, keys


async def _burst(address: str, blob: bytes, count: int) -> list:
    async with tg_aio.InferenceServerClient(address) as c:
        async def one():
            return await c.infer("tiny", [bytes_input("image_bytes", [blob], [1, 1])])
        return await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)


def test_overload_is_resource_exhausted_and_every_accepted_request_is_answered(tiny):
    # Queue of 4 requests, one image per execution: 48 concurrent requests are well over what it holds.
    with grpc_server([tiny[2]], RequestSettings(max_queue=4, max_delay_ms=0)) as (base, address, state):
        state.batchers["tiny"].max_batch = 1
        results = asyncio.run(_burst(address, images(tiny, 1)[0], 48))
        stats = httpx.get(f"{base}/v2/models/tiny/stats").json()["model_stats"][0]
        metrics = httpx.get(f"{base}/metrics").text
    answered = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, InferenceServerException)]
    assert len(answered) + len(refused) == 48 and len(refused) > 0 and len(answered) >= 4
    assert all(r.status() == "StatusCode.RESOURCE_EXHAUSTED" and "--max-queue 4" in r.message() for r in refused)
    assert all(r.as_numpy("probabilities").shape == (1, 3) for r in answered)
    rejected = sum(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith('inceptionlab_requests_total{model="tiny",outcome="rejected",protocol="grpc"}'))
    assert rejected == len(refused) and stats["inference_count"] == len(answered)
    assert 1 <= state.batchers["tiny"].peak_queue <= 4


def test_deadlines_the_servers_and_the_clients_are_deadline_exceeded(tiny):
    gate = threading.Event()
    with grpc_server([tiny[2]], RequestSettings(timeout_s=0.5)) as (base, address, state):
        batcher = state.batchers["tiny"]
        run = batcher.run

        def held(instance, items):  # the model stalls until the test lets it go (bounded)
            gate.wait(30)
            return run(instance, items)

        batcher.run = held
        blob = images(tiny, 1)[0]
        with tg.InferenceServerClient(address) as c:
            try:
                with pytest.raises(InferenceServerException) as server_timeout:
                    c.infer("tiny", [bytes_input("image_bytes", [blob], [1, 1])])
                with pytest.raises(InferenceServerException) as client_deadline:
                    c.infer("tiny", [bytes_input("image_bytes", [blob], [1, 1])], client_timeout=0.2)
            finally:
                gate.set()
            assert c.infer("tiny", [bytes_input("image_bytes", [blob], [1, 1])]).as_numpy("probabilities").shape == (1, 3)
        metrics = httpx.get(f"{base}/metrics").text
    assert server_timeout.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert "--timeout-s 0.5" in server_timeout.value.message()
    assert client_deadline.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    series = 'inceptionlab_requests_total{{model="tiny",outcome="{}",protocol="grpc"}}'
    counts = {outcome: sum(float(line.split()[-1]) for line in metrics.splitlines()
                           if line.startswith(series.format(outcome)))
              for outcome in ("timeout", "cancelled")}
    # The client's deadline: our own timer (set to the time it has left) or its cancellation, whichever fires first.
    assert counts["timeout"] >= 1 and counts["timeout"] + counts["cancelled"] == 2


def test_api_key_guards_grpc_as_it_guards_http(tiny):
    with grpc_server([tiny[2]], RequestSettings(api_key="s3cret")) as (_, address, _state):
        with tg.InferenceServerClient(address) as c, grpc.insecure_channel(address) as channel:
            assert c.is_server_live() and c.is_server_ready()  # probes stay open
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            for headers in (None, {"x-api-key": "wrong"}):
                with pytest.raises(InferenceServerException) as refused:
                    c.get_model_metadata("tiny", headers=headers)
                assert refused.value.status() == "StatusCode.UNAUTHENTICATED" and "API key" in refused.value.message()
            assert c.get_model_metadata("tiny", headers={"authorization": "Bearer s3cret"}).name == "tiny"
            blob = images(tiny, 1)[0]
            answer = c.infer("tiny", [bytes_input("image_bytes", [blob], [1, 1])], headers={"x-api-key": "s3cret"})
            assert answer.as_numpy("probabilities").shape == (1, 3)


def test_health_service_answers_readiness_per_server_model_and_liveness(server):
    with grpc.insecure_channel(server[1]) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService", "tiny", "live"):
            status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
            assert status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="resnet999"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_unimplemented_rpcs_say_so(stub):
    with pytest.raises(grpc.RpcError) as missing:
        stub.SystemSharedMemoryStatus(service_pb2.SystemSharedMemoryStatusRequest())
    assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED


# --------------------------------------------------------------------------------------- the proto


def test_descriptor_set_is_what_protoc_makes_of_the_protos():
    from inceptionlab.serve.proto import DESCRIPTOR_SET, descriptor_set_bytes, here

    assert descriptor_set_bytes() == (here() / DESCRIPTOR_SET).read_bytes(), "run `make proto`"


def test_every_rpc_tritonclient_calls_has_the_same_messages_on_the_wire():
    """Triton's client and our server compile the same service: each method's request and response
    messages have the same fields (numbers, types, names) on both sides."""
    from inceptionlab.serve.grpc_server import SERVICE
    from inceptionlab.serve.proto import pool as _pool

    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    ours = _pool().FindServiceByName(SERVICE)
    used = ["ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer", "ModelConfig",
            "ModelStatistics", "RepositoryIndex"]

    def fields(message) -> list[tuple]:
        return [(f.number, f.type, f.is_repeated, f.name, f.message_type.full_name if f.message_type else "")
                for f in message.fields]

    for name in used:
        mine, triton = ours.methods_by_name[name], theirs.methods_by_name[name]
        for side in ("input_type", "output_type"):
            assert getattr(mine, side).full_name == getattr(triton, side).full_name
            assert fields(getattr(mine, side)) == fields(getattr(triton, side)), f"{name}.{side}"
    for message in ("ModelInferRequest.InferInputTensor", "InferTensorContents", "ModelInferResponse.InferOutputTensor",
                    "ModelMetadataResponse.TensorMetadata", "InferStatistics", "StatisticDuration"):
        mine = _pool().FindMessageTypeByName(f"inference.{message}")
        triton = service_pb2.DESCRIPTOR.pool.FindMessageTypeByName(f"inference.{message}")
        assert fields(mine) == fields(triton), message


# --------------------------------------------------------------------------------------- the command


def test_grpc_port_is_checked_before_any_model_loads(cli):
    wrong = cli("serve", "--model", "inception_v3", "--grpc-port", "nope")
    assert wrong.code == 2 and "--grpc-port 'nope': give a port number (0-65535) or off" in wrong.err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = cli("serve", "--model", "inception_v3", "--port", "0", "--grpc-port", str(port))
    assert taken.code == 2 and f"--grpc-port {port}: cannot listen on 127.0.0.1:{port}" in taken.err
    assert "--grpc-port off" in taken.err and "serving" not in taken.out  # refused before loading the model


# Another program takes the gRPC port while the models load (after the check above): a model measured
# at start-up takes seconds to minutes, and two servers started at once both pass the check.
TAKE_PORT_WHILE_LOADING = """
import socket, sys
from inceptionlab.cli.app import main
from inceptionlab.serve import models

load, held = models.load_served_model, []

def loading(*args, **kwargs):
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    other.bind(("127.0.0.1", int(sys.argv[1])))
    other.listen()
    held.append(other)
    return load(*args, **kwargs)

models.load_served_model = loading
main(sys.argv[2:])
"""


def test_a_grpc_port_taken_while_the_models_load_is_a_one_line_error_before_serving(tiny):
    """The port was free when checked and taken when gRPC bound it, inside the app's start-up: uvicorn
    printed the right message inside `ERROR: Traceback ...` and `Application startup failed`, and the
    command exited 0. Both front ends bind before anything serves, and a failure is one line, exit 2."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    done = subprocess.run(
        [sys.executable, "-c", TAKE_PORT_WHILE_LOADING, str(port), "serve", f"tiny={tiny[0]}", "--backend", "eager",
         "--precision", "fp32", "--device", "cpu", "--max-batch", "1", "--instances", "1", "--port", "0",
         "--grpc-port", str(port)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "startup failed" not in done.stderr, done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert f"127.0.0.1:{port}" in error and "--grpc-port off" in error, done.stderr
    assert "ready:" not in done.stdout
