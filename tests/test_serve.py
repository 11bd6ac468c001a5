"""`inceptionlab serve`: KServe v2 endpoints, /v1/classify, bad input, overload, disconnects, metrics."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import struct
import zlib

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image
from serve_helpers import serve_model, train_tiny_run, uvicorn_thread

from inceptionlab.infer.predict import Predictor, load_run_model
from inceptionlab.serve.app import ServerSettings, create_app
from inceptionlab.serve.protocol import HEADER_LENGTH, encode_bytes_elements


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    run_dir, data = train_tiny_run(tmp_path_factory)
    return run_dir, data, serve_model(run_dir)


@pytest.fixture(scope="module")
def client(tiny):
    with TestClient(create_app([tiny[2]], ServerSettings(max_body_bytes=2_000_000))) as c:
        yield c


def png_bytes(path) -> bytes:
    return path.read_bytes()


def reference_probs(run_dir, files) -> list[list[dict]]:
    """What `predict` says for these files (the same model, its own preprocessing)."""
    net, spec = load_run_model(run_dir)
    predictor = Predictor(net, spec, torch.device("cpu"))
    return [r["topk"] for r in predictor.predict_files(files, topk=3)]


def by_label(topk: list[dict]) -> dict[str, float]:
    return {t["label"]: t["prob"] for t in topk}


def test_health_metadata_and_config(client):
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").status_code == 200
    meta = client.get("/v2/models/tiny").json()
    assert meta["inputs"] == [{"name": "images", "datatype": "FP32", "shape": [-1, 3, 75, 75]}]
    assert meta["outputs"][0] == {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]}
    assert client.get("/v2/models/tiny/ready").json() == {"name": "tiny", "ready": True}
    config = client.get("/v2/models/tiny/config").json()
    assert config["max_batch_size"] == 8 and config["dynamic_batching"]["preferred_batch_size"] == [1, 2, 4, 8]
    assert config["labels"] == ["cat", "dog", "fox"]


def test_classify_matches_predict_for_raw_and_multipart_uploads(tiny, client):
    run_dir, data, _ = tiny
    files = sorted((data / "val").rglob("*.png"))[:4]
    expected = reference_probs(run_dir, files)
    raw = client.post("/v1/classify?topk=3", content=png_bytes(files[0])).json()
    assert by_label(raw["results"][0]["topk"]) == pytest.approx(by_label(expected[0]), abs=1e-4)
    form = client.post("/v1/classify?topk=3", files=[("files", (f.name, png_bytes(f))) for f in files]).json()
    assert [r["file"] for r in form["results"]] == [f.name for f in files]
    for result, want in zip(form["results"], expected):
        assert result["topk"][0]["prob"] == pytest.approx(want[0]["prob"], abs=1e-4)
        assert by_label(result["topk"]) == pytest.approx(by_label(want), abs=1e-4)


def _infer(client, body, headers=None):
    return client.post("/v2/models/tiny/infer", content=body, headers=headers or {})


def test_fp32_uint8_and_encoded_inputs_give_the_same_answer(tiny, client):
    model = tiny[2]
    image = Image.open(sorted((tiny[1] / "val" / "fox").glob("*.png"))[0]).convert("RGB")
    pixels = np.asarray(torch.as_tensor(model.transform(image)))[None]  # uint8 1x3x75x75
    normalised = model.normalize(torch.from_numpy(pixels)).numpy()
    as_json = {"inputs": [{"name": "images", "shape": [1, 3, 75, 75], "datatype": "FP32",
                           "data": normalised.ravel().tolist()}], "outputs": [{"name": "probabilities"}]}
    from_fp32 = np.array(_infer(client, json.dumps(as_json)).json()["outputs"][0]["data"])
    uint8_json = {"inputs": [{"name": "images", "shape": [1, 3, 75, 75], "datatype": "UINT8",
                              "data": pixels.ravel().tolist()}], "outputs": [{"name": "probabilities"}]}
    from_uint8 = np.array(_infer(client, json.dumps(uint8_json)).json()["outputs"][0]["data"])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    blob = encode_bytes_elements([buffer.getvalue()])
    header = json.dumps({"inputs": [{"name": "images", "shape": [1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(blob)}}],
                         "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]}).encode()
    response = _infer(client, header + blob, {HEADER_LENGTH: str(len(header))})
    length = int(response.headers[HEADER_LENGTH])
    meta = json.loads(response.content[:length])
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == 12
    from_bytes = np.frombuffer(response.content[length:], "<f4")
    np.testing.assert_allclose(from_fp32, from_uint8, atol=1e-5)
    np.testing.assert_allclose(from_fp32, from_bytes, atol=1e-5)
    assert from_fp32.sum() == pytest.approx(1.0, abs=1e-5)


def _bomb_png(width=30_000, height=30_000) -> bytes:
    """A valid tiny PNG whose header claims 900 Mpx (PIL refuses it before decoding)."""
    buffer = io.BytesIO()
    Image.new("L", (8, 8)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    ihdr = 8  # signature, then the IHDR chunk: length(4) type(4) width(4) height(4) ...
    struct.pack_into(">II", data, ihdr + 8, width, height)
    crc = zlib.crc32(bytes(data[ihdr + 4:ihdr + 8 + 13]))
    struct.pack_into(">I", data, ihdr + 8 + 13, crc)
    return bytes(data)


def _truncated_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buffer, format="JPEG")
    return buffer.getvalue()[:300]


def _tensor_request(name="images", shape=(1, 3, 75, 75), datatype="FP32") -> str:
    count = int(np.prod(shape))
    return json.dumps({"inputs": [{"name": name, "shape": list(shape), "datatype": datatype, "data": [0] * count}]})


BAD_REQUESTS = {
    "non-image bytes": ("/v1/classify", b"this is not an image", 400, "not an image"),
    "truncated jpeg": ("/v1/classify", _truncated_jpeg(), 400, "truncated"),
    "empty body": ("/v1/classify", b"", 400, "empty"),
    "decompression bomb": ("/v1/classify", _bomb_png(), 400, "too large"),
    "huge body": ("/v1/classify", b"\xff" * 2_500_000, 413, "limit"),
    "invalid json": ("/v2/models/tiny/infer", b'{"inputs": [', 400, "invalid JSON"),
    "wrong tensor name": ("/v2/models/tiny/infer", _tensor_request(name="pixels").encode(), 400, "no input 'pixels'"),
    "wrong shape": ("/v2/models/tiny/infer", _tensor_request(shape=(1, 3, 32, 32)).encode(), 400, "[1, 3, 32, 32]"),
    "wrong dtype": ("/v2/models/tiny/infer", _tensor_request(datatype="INT64").encode(), 400, "INT64"),
    "data/shape mismatch": ("/v2/models/tiny/infer", json.dumps({"inputs": [{"name": "images", "shape": [1, 3, 75, 75],
                            "datatype": "FP32", "data": [0.0]}]}).encode(), 400, "needs 16875 elements"),
    "unknown model": ("/v2/models/resnet999/infer", _tensor_request().encode(), 404, "unknown model"),
    "unknown route": ("/v2/nothing", b"{}", 404, "no route"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_input_is_a_one_line_4xx_and_the_next_request_is_answered(tiny, client, case):
    path, body, status, words = BAD_REQUESTS[case]
    response = client.post(path, content=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert words in error and "\n" not in error
    good = client.post("/v1/classify", content=png_bytes(sorted((tiny[1] / "val").rglob("*.png"))[0]))
    assert good.status_code == 200 and len(good.json()["results"][0]["topk"]) == 3


def test_api_key_is_required_when_set(tiny):
    app = create_app([tiny[2]], ServerSettings(api_key="s3cret"))
    with TestClient(app) as c:
        assert c.get("/v2/health/ready").status_code == 200  # probes stay open
        refused = c.get("/v2/models/tiny")
        assert refused.status_code == 401 and "API key" in refused.json()["error"]
        assert c.get("/v2/models/tiny", headers={"X-API-Key": "wrong"}).status_code == 401
        assert c.get("/v2/models/tiny", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def _burst(base: str, body: bytes, count: int, concurrency: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:
        return await asyncio.gather(*(http.post("/v1/classify", content=body) for _ in range(count)))


def test_concurrent_requests_are_batched_and_counted(tiny):
    app = create_app([tiny[2]], ServerSettings(max_delay_ms=20))
    body = png_bytes(sorted((tiny[1] / "val").rglob("*.png"))[0])
    with uvicorn_thread(app) as base:
        responses = asyncio.run(_burst(base, body, 32, 16))
        metrics = httpx.get(f"{base}/metrics").text
    assert all(r.status_code == 200 for r in responses)
    inferences = _metric(metrics, 'inceptionlab_inferences_total{model="tiny"}')
    executions = _metric(metrics, 'inceptionlab_executions_total{model="tiny"}')
    assert inferences == 32 and executions < 32  # several requests shared a batch
    assert _metric(metrics, 'inceptionlab_requests_total{model="tiny",outcome="success"}') == 32
    assert _metric(metrics, 'inceptionlab_queue_seconds_count{model="tiny"}') == 32
    assert _metric(metrics, 'inceptionlab_pending_requests{model="tiny"}') == 0


def test_overload_rejects_with_503_and_answers_every_accepted_request(tiny):
    # Queue of 4 requests, one batch of 1 at a time: 48 concurrent requests are well over 3x what it holds.
    app = create_app([tiny[2]], ServerSettings(max_queue=4, max_delay_ms=0))
    state = app.state.serve
    body = png_bytes(sorted((tiny[1] / "val").rglob("*.png"))[0])
    with uvicorn_thread(app) as base:
        state.batchers["tiny"].max_batch = 1  # capacity: one image per execution
        responses = asyncio.run(_burst(base, body, 48, 48))
        metrics = httpx.get(f"{base}/metrics").text
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 503} and codes.count(503) > 0 and codes.count(200) >= 4
    rejected = [r for r in responses if r.status_code == 503]
    assert all(r.headers["retry-after"] == "1" and "queued" in r.json()["error"] for r in rejected)
    assert all(len(r.json()["results"][0]["topk"]) == 3 for r in responses if r.status_code == 200)
    assert _metric(metrics, 'inceptionlab_requests_total{model="tiny",outcome="rejected"}') == codes.count(503)
    assert _metric(metrics, 'inceptionlab_inferences_total{model="tiny"}') == codes.count(200)


def _raw_request(port: int, head: bytes, body: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)


def test_client_disconnects_leak_nothing(tiny):
    app = create_app([tiny[2]], ServerSettings())
    state = app.state.serve
    image = png_bytes(sorted((tiny[1] / "val").rglob("*.png"))[0])
    with uvicorn_thread(app) as base:
        port = int(base.rsplit(":", 1)[1])
        head = b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
        _raw_request(port, head % len(image), image[:50])  # gone mid-body
        for _ in range(5):
            _raw_request(port, head % len(image), image)  # gone before the answer
        with httpx.Client(base_url=base, timeout=30) as http:
            assert http.post("/v1/classify", content=image).status_code == 200
            for _ in range(100):  # bounded: the abandoned requests finish or are dropped within seconds
                if state.batchers["tiny"].pending == 0:
                    break
                asyncio.run(asyncio.sleep(0.05))
            assert state.batchers["tiny"].pending == 0
            assert _metric(http.get("/metrics").text, 'inceptionlab_pending_requests{model="tiny"}') == 0


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_exported_runtimes_answer_like_predict_at_every_batch_size(tiny, backend):
    from inceptionlab.infer.runtimes import get_runtime

    if get_runtime(backend).missing():
        pytest.skip(f"{backend}: {get_runtime(backend).missing()}")
    run_dir, data, _ = tiny
    served = serve_model(run_dir, backend=backend, max_batch=4)
    assert served.backend == backend and served.precision == "fp32" and served.buckets == [1, 2, 4]
    files = sorted((data / "val").rglob("*.png"))[:3]  # 3 images: padded to the bucket of 4
    expected = reference_probs(run_dir, files)
    with TestClient(create_app([served], ServerSettings())) as c:
        got = c.post("/v1/classify?topk=3", files=[("files", (f.name, png_bytes(f))) for f in files]).json()
    for result, want in zip(got["results"], expected):
        assert by_label(result["topk"]) == pytest.approx(by_label(want), abs=1e-3)


def test_auto_backend_is_the_fastest_cpu_runtime_installed():
    from inceptionlab.infer.runtimes import get_runtime
    from inceptionlab.serve.models import auto_backend

    installed = [name for name in ("openvino", "onnxruntime") if get_runtime(name).missing() is None]
    assert auto_backend("cpu", "image") == (installed[0] if installed else "eager")
    assert auto_backend("cpu", "tokens") == "eager" and auto_backend("cuda", "image") == "eager"
