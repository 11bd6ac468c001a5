"""The server as Triton's own clients drive it: JSON and binary requests mixed on one HTTP client, model
versions, the classification extension, the repository's load and unload, over HTTP and gRPC.

The model is torchvision's SqueezeNet 1.1 with random weights (seed 0): ImageNet's 1000 labels and the
protocol's tensors without training anything (what is checked does not depend on the weights' values).
"""

from __future__ import annotations

import json

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from serve_helpers import uvicorn_thread
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from inceptionlab.serve.app import create_app
from inceptionlab.serve.service import RequestSettings

MODEL = "squeezy"


@pytest.fixture(scope="module")
def served():
    from inceptionlab.serve.models import ModelLoadSettings, load_served_model

    settings = ModelLoadSettings(backend="eager", precision="fp32", device="cpu", max_batch=2, instances=1,
                                 max_delay_ms=1.0, weights="random", log=lambda message: None)
    return load_served_model(settings, model="squeezenet1_1", name=MODEL)


@pytest.fixture(scope="module")
def server(served):
    """(HTTP base URL, gRPC address, the app's state)."""
    app = create_app([served], RequestSettings(), grpc_address="127.0.0.1:0")
    with uvicorn_thread(app) as base:
        yield base, f"127.0.0.1:{app.state.serve.grpc_port}", app.state.serve


@pytest.fixture(scope="module")
def pixels(served) -> np.ndarray:
    return np.random.default_rng(0).random((1, *served.input_shape), dtype=np.float32)


def http_input(pixels: np.ndarray, binary: bool) -> th.InferInput:
    tensor = th.InferInput("images", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels, binary_data=binary)
    return tensor


# --------------------------------------------------------------------------------------- JSON and binary


def test_tritonclient_http_mixes_binary_and_json_requests_on_one_client(server, pixels):
    """tritonclient.http writes `Inference-Header-Content-Length` for a binary request into the headers
    dict the caller passes (to carry an API key, say) and never takes it out: the next request on that
    dict, a JSON one, carries the old header length, and the server cut its JSON there ("invalid JSON ...
    line 1 column 150"). A body that is valid JSON as a whole with no binary tensor is taken whole."""
    client = th.InferenceServerClient(server[0].removeprefix("http://"))
    headers = {"x-client": "the same dict on every call"}
    answers = []
    for call in range(12):
        binary = call % 3 != 1  # binary, JSON, binary, binary, JSON, ...: JSON after binary and after JSON
        output = th.InferRequestedOutput("probabilities", binary_data=call % 2 == 0)
        result = client.infer(MODEL, [http_input(pixels, binary)], outputs=[output], headers=headers)
        answers.append(result.as_numpy("probabilities"))
    client.close()
    assert all(np.allclose(a, answers[0], atol=1e-6) for a in answers)
    assert headers["Inference-Header-Content-Length"]  # the client's doing, kept as it was


def test_a_header_length_that_cuts_a_request_with_binary_data_is_still_refused(server, pixels):
    header = json.dumps({"inputs": [{"name": "images", "shape": list(pixels.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": pixels.nbytes}}]}).encode()
    answer = httpx.post(f"{server[0]}/v2/models/{MODEL}/infer", content=header + pixels.tobytes(),
                        headers={"Inference-Header-Content-Length": str(len(header) - 5)})
    assert answer.status_code == 400 and "invalid JSON" in answer.json()["error"]


# --------------------------------------------------------------------------------------- versions


@pytest.mark.parametrize("method, path", [("post", "infer"), ("get", ""), ("get", "/ready"), ("get", "/config"),
                                          ("get", "/stats")])
def test_an_unknown_version_is_not_found_over_http(server, pixels, method, path):
    body = {"inputs": [{"name": "images", "shape": list(pixels.shape), "datatype": "FP32",
                        "data": pixels.ravel().tolist()}]} if method == "post" else None
    url = f"{server[0]}/v2/models/{MODEL}/versions/7" + (f"/{path}" if path == "infer" else path)
    answer = httpx.request(method, url, json=body)
    assert answer.status_code == 404
    assert answer.json()["error"] == f"Request for unknown model: '{MODEL}' version 7 is not found"
    assert httpx.request(method, url.replace("/versions/7", "/versions/1"), json=body).status_code == 200


def test_an_unknown_version_is_not_found_over_grpc(server, pixels):
    with tg.InferenceServerClient(server[1]) as client:
        tensor = tg.InferInput("images", list(pixels.shape), "FP32")
        tensor.set_data_from_numpy(pixels)
        for call in (lambda: client.infer(MODEL, [tensor], model_version="7"),
                     lambda: client.get_model_metadata(MODEL, model_version="7"),
                     lambda: client.is_model_ready(MODEL, model_version="7"),
                     lambda: client.get_model_config(MODEL, model_version="7")):
            with pytest.raises(InferenceServerException) as missing:
                call()
            assert missing.value.status() == "StatusCode.NOT_FOUND"
            assert "version 7 is not found" in missing.value.message()
        answer = client.infer(MODEL, [tensor], model_version="1")
        assert answer.get_response().model_version == "1"


# --------------------------------------------------------------------------------------- class_count


def expected_top(served, pixels: np.ndarray, count: int) -> list[tuple[int, str]]:
    probabilities = served.run(0, [pixels])[0]["probabilities"][0]
    order = np.argsort(-probabilities, kind="stable")[:count]
    return [(int(i), served.spec.labels[i]) for i in order]


def parsed(entries) -> list[tuple[float, int, str]]:
    """Triton's classification strings "score:index:label" (bytes or str)."""
    rows = []
    for entry in entries:
        text = entry.decode() if isinstance(entry, bytes) else entry
        score, index, label = text.split(":", 2)
        rows.append((float(score), int(index), label))
    return rows


@pytest.mark.parametrize("binary", [True, False])
def test_class_count_answers_the_top_classes_as_triton_does_over_http(server, served, pixels, binary):
    client = th.InferenceServerClient(server[0].removeprefix("http://"))
    output = th.InferRequestedOutput("probabilities", binary_data=binary, class_count=3)
    result = client.infer(MODEL, [http_input(pixels, binary)], outputs=[output])
    client.close()
    top = result.as_numpy("probabilities")
    assert top.shape == (1, 3) and result.get_output("probabilities")["datatype"] == "BYTES"
    rows = parsed(top[0])
    assert [(i, label) for _, i, label in rows] == expected_top(served, pixels, 3)
    assert rows[0][0] >= rows[1][0] >= rows[2][0] > 0


def test_class_count_over_grpc(server, served, pixels):
    with tg.InferenceServerClient(server[1]) as client:
        tensor = tg.InferInput("images", list(pixels.shape), "FP32")
        tensor.set_data_from_numpy(pixels)
        result = client.infer(MODEL, [tensor], outputs=[tg.InferRequestedOutput("logits", class_count=2)])
    top = result.as_numpy("logits")
    assert top.shape == (1, 2)
    assert [(i, label) for _, i, label in parsed(top[0])] == expected_top(served, pixels, 2)


def test_a_bad_class_count_is_refused(server, pixels):
    body = {"inputs": [{"name": "images", "shape": list(pixels.shape), "datatype": "FP32", "data": pixels.ravel().tolist()}],
            "outputs": [{"name": "probabilities", "parameters": {"classification": 0}}]}
    answer = httpx.post(f"{server[0]}/v2/models/{MODEL}/infer", json=body)
    assert answer.status_code == 400 and "classification" in answer.json()["error"]


# --------------------------------------------------------------------------------------- repository


def test_model_repository_is_advertised_and_load_unload_work_over_http(server, pixels):
    base = server[0]
    assert "model_repository" in httpx.get(f"{base}/v2").json()["extensions"]
    assert httpx.post(f"{base}/v2/repository/models/{MODEL}/unload").status_code == 200
    try:
        index = httpx.post(f"{base}/v2/repository/index").json()
        assert index == [{"name": MODEL, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
        assert httpx.get(f"{base}/v2/models/{MODEL}/ready").status_code == 503
        refused = httpx.post(f"{base}/v2/models/{MODEL}/infer", json={"inputs": []})
        assert refused.status_code == 404 and "unloaded" in refused.json()["error"]
    finally:
        assert httpx.post(f"{base}/v2/repository/models/{MODEL}/load").status_code == 200
    assert httpx.post(f"{base}/v2/repository/index").json()[0]["state"] == "READY"
    unknown = httpx.post(f"{base}/v2/repository/models/resnet999/load")
    assert unknown.status_code == 404 and "resnet999" in unknown.json()["error"]


def test_load_and_unload_over_grpc(server):
    with grpc.insecure_channel(server[1]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.RepositoryModelUnload(service_pb2.RepositoryModelUnloadRequest(model_name=MODEL))
        try:
            assert not stub.ModelReady(service_pb2.ModelReadyRequest(name=MODEL)).ready
        finally:
            stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name=MODEL))
        assert stub.ModelReady(service_pb2.ModelReadyRequest(name=MODEL)).ready
