"""`inceptionlab serve` on a network: what a server refuses, and that it refuses it before doing the work.

A client without the API key is answered 401 before its body is read; each stage (HTTP requests in
flight, gRPC calls in flight, the preprocessing pool's queue, the batcher's queue) is bounded and
answers 503 / RESOURCE_EXHAUSTED when full; a multipart upload is counted, and every upload's pixels
summed, before anything is decoded; client-given tensor shapes are checked with Python integers.
"""

from __future__ import annotations

import asyncio
import copy
import io
import json
import socket
import struct
import sys
import threading
import zlib
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as tg_aio
from PIL import Image
from serve_helpers import serve_model, train_tiny_run, uvicorn_thread
from tritonclient.utils import InferenceServerException

from inceptionlab import hardware
from inceptionlab.serve import models as served_models
from inceptionlab.serve.app import create_app
from inceptionlab.serve.grpc_server import decode_request
from inceptionlab.serve.models import ServedModel
from inceptionlab.serve.proto import message
from inceptionlab.serve.protocol import ProtocolError, encode_bytes_elements, parse_infer_request
from inceptionlab.serve.service import RequestSettings, ServeError, ServeState

WAIT_S = 60  # the most any step below may take on a loaded 2-core machine before it counts as hung


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    run_dir, data = train_tiny_run(tmp_path_factory)
    return run_dir, data, serve_model(run_dir)


def a_png(tiny) -> bytes:
    return sorted((tiny[1] / "val").rglob("*.png"))[0].read_bytes()


def png_header(width: int, height: int) -> bytes:
    """A valid 8x8 PNG whose header claims width x height pixels: PIL reads the size, decoding fails."""
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    struct.pack_into(">II", data, 16, width, height)  # after the signature (8) and IHDR's length and type (8)
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))
    return bytes(data)


class Gate:
    """A served model whose every batch waits until the test opens the gate: requests stay in flight
    for as long as the test needs, with no timing involved."""

    def __init__(self, served: ServedModel):
        self.opened = threading.Event()
        self.model = copy.copy(served)
        self.model.run = self._run  # the batcher takes `model.run` when the server starts

        self._served = served

    def _run(self, instance, items):
        assert self.opened.wait(WAIT_S), "the test never opened the gate"
        return ServedModel.run(self._served, instance, items)


# --------------------------------------------------------------------------------------- the API key


def _answer_to_headers_alone(base: str, head: bytes) -> bytes:
    """Send a request's headers and no body; what the server answers (b"" if it waits for the body)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(head)
        sock.settimeout(10)  # a server that reads the body first waits for ever: 10 s says it did
        try:
            return sock.recv(4096)
        except socket.timeout:
            return b""


def test_a_request_without_the_key_is_refused_before_its_body_is_read(tiny):
    app = create_app([tiny[2]], RequestSettings(api_key="s3cret", max_body_bytes=2_000_000))
    with uvicorn_thread(app) as base:
        for length in (1_000_000, 50_000_000):  # under --max-body-mb, and over it
            head = (b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % length)
            answer = _answer_to_headers_alone(base, head)
            assert answer.startswith(b"HTTP/1.1 401"), f"{length}-byte body: {answer[:60]!r}"
            assert b"API key" in answer
        keyed = httpx.post(f"{base}/v1/classify", content=a_png(tiny), headers={"X-API-Key": "s3cret"}, timeout=WAIT_S)
        assert keyed.status_code == 200


# --------------------------------------------------------------------------------------- concurrency


async def _first_answers(tasks: list[asyncio.Task], count: int) -> list:
    """The first `count` tasks to finish (bounded by WAIT_S), in the order they finished."""
    done = []
    for next_done in asyncio.as_completed(tasks, timeout=WAIT_S):
        done.append(await next_done)
        if len(done) == count:
            break
    return done


async def refused_then_the_rest(tasks: list[asyncio.Task], gate: Gate, while_held=None) -> tuple[list, list]:
    """The 3 answers that came while the gate held 2 requests in flight (then `while_held()`, still
    held), and every answer once the gate opened; the gate opens whatever happens."""
    try:
        refused = await _first_answers(tasks, 3)
        if while_held is not None:
            await while_held()
    finally:
        gate.opened.set()
    return refused, await asyncio.gather(*tasks)


def test_http_requests_beyond_max_concurrency_are_refused_with_503(tiny):
    gate = Gate(tiny[2])
    app = create_app([gate.model], RequestSettings(max_concurrency=2, max_delay_ms=0))
    image = a_png(tiny)

    async def load(base: str) -> tuple[list, list]:
        async with httpx.AsyncClient(base_url=base, timeout=WAIT_S) as http:
            tasks = [asyncio.create_task(http.post("/v1/classify", content=image)) for _ in range(5)]

            async def probe_while_two_are_held():
                assert sum(t.done() for t in tasks) == 3
                probe = await http.get("/v2/health/ready")  # probes are never refused
                assert probe.status_code == 200

            return await refused_then_the_rest(tasks, gate, probe_while_two_are_held)

    with uvicorn_thread(app) as base:
        try:
            refused, everything = asyncio.run(load(base))
        finally:
            gate.opened.set()
    assert [r.status_code for r in refused] == [503] * 3
    assert all("--max-concurrency 2" in r.json()["error"] and r.headers["retry-after"] == "1" for r in refused)
    assert sorted(r.status_code for r in everything) == [200, 200, 503, 503, 503]


def test_grpc_calls_beyond_max_concurrency_are_resource_exhausted(tiny):
    gate = Gate(tiny[2])
    app = create_app([gate.model], RequestSettings(max_concurrency=2, max_delay_ms=0), grpc_address="127.0.0.1:0")
    blob = a_png(tiny)

    async def load(address: str) -> tuple[list, list]:
        async with tg_aio.InferenceServerClient(address) as client:
            async def one():
                tensor = tg_aio.InferInput("image_bytes", [1, 1], "BYTES")
                tensor.set_data_from_numpy(np.array([[blob]], dtype=object))
                try:
                    return await client.infer("tiny", [tensor])
                except InferenceServerException as exc:
                    return exc

            return await refused_then_the_rest([asyncio.create_task(one()) for _ in range(5)], gate)

    with uvicorn_thread(app) as _base:
        try:
            refused, everything = asyncio.run(load(f"127.0.0.1:{app.state.serve.grpc_port}"))
        finally:
            gate.opened.set()
    assert all(isinstance(r, InferenceServerException) and r.status() == "StatusCode.RESOURCE_EXHAUSTED"
               for r in refused)
    assert sum(not isinstance(r, Exception) for r in everything) == 2


def test_the_preprocessing_queue_is_bounded_and_checked_before_parsing(tiny):
    """One preprocessing thread and a queue of 2: a fourth job is refused at once, not queued."""
    state = ServeState([tiny[2]], RequestSettings(preprocess_threads=1, max_queue=2))
    release = threading.Event()

    async def scenario() -> tuple[list, str]:
        state.start()
        # Each call hands its job to the pool before it returns: no loop turn is needed in between.
        jobs = [asyncio.ensure_future(state.in_thread(release.wait, WAIT_S)) for _ in range(3)]
        try:
            with pytest.raises(ServeError) as full:
                state.in_thread(release.wait, WAIT_S)
            with pytest.raises(ServeError) as early:
                state.refuse_early("tiny")  # what every inference route asks before it parses a body
        finally:
            release.set()
        done = await asyncio.gather(*jobs)
        state.refuse_early("tiny")  # room again
        await state.stop()
        return done, full.value, early.value

    done, full, early = asyncio.run(scenario())
    assert done == [True, True, True]
    assert full.status == early.status == 503 and full.kind == "queue_full"
    assert "preprocessing" in str(full) and "--max-queue 2" in str(full)


def test_uvicorn_is_started_with_a_connection_bound(monkeypatch):
    import uvicorn

    from inceptionlab.serve.server import uvicorn_config

    # Not the process's logging: see serve_helpers.quiet_uvicorn_config.
    monkeypatch.setattr(uvicorn.Config, "configure_logging", lambda self: None)

    app = create_app([], RequestSettings(max_concurrency=64))
    config = uvicorn_config(app, "127.0.0.1", 0, drain_s=5)
    assert config.limit_concurrency is not None and config.limit_concurrency >= 64


# --------------------------------------------------------------------------------------- uploads


class CountingDecodes:
    """The served model with its image decoding counted."""

    def __init__(self, served: ServedModel):
        self.calls = 0
        self.model = copy.copy(served)
        original = self.model.preprocess_image

        def counted(data, name):
            self.calls += 1
            return original(data, name)

        self.model.preprocess_image = counted


def test_a_multipart_upload_is_counted_before_any_file_is_decoded(tiny):
    counting = CountingDecodes(tiny[2])  # max batch 8
    files = [("file", (f"{i}.png", a_png(tiny), "image/png")) for i in range(9)]
    app = create_app([counting.model], RequestSettings())
    with uvicorn_thread(app) as base:
        refused = httpx.post(f"{base}/v1/classify", files=files, timeout=WAIT_S)
        assert counting.calls == 0
        answered = httpx.post(f"{base}/v1/classify", files=files[:8], timeout=WAIT_S)
    assert refused.status_code == 400 and "more than 8 images in one request (--max-batch 8)" in refused.json()["error"]
    assert answered.status_code == 200 and len(answered.json()["results"]) == 8 and counting.calls == 8


def test_the_planned_batch_size_does_not_limit_the_images_one_request_holds(tiny):
    """`--max-batch auto` may plan batches of 1 (it does for Inception v3 at 299 px on a 2-core AMD EPYC,
    and INCEPTIONLAB_AUTO=safe does here): a request of several images, as files or as one tensor, is
    still answered, each image as the model answers it alone, up to 32 (hardware.AUTO_MAX_BATCH)
    whatever the plan; 33 are refused naming that limit, not the plan's batch size."""
    served = serve_model(tiny[0], max_batch=None)
    assert served.max_batch == 1 and served.buckets == [1]
    pngs = sorted((tiny[1] / "val").rglob("*.png"))[:3]
    files = [("file", (path.name, path.read_bytes(), "image/png")) for path in pngs]
    pixels = np.stack([served.preprocess_image(path.read_bytes(), path.name) for path in pngs])
    tensor = {"inputs": [{"name": "images", "datatype": "UINT8", "shape": list(pixels.shape),
                          "data": pixels.ravel().tolist()}]}
    app = create_app([served], RequestSettings())
    with uvicorn_thread(app) as base:
        together = httpx.post(f"{base}/v1/classify", files=files, timeout=WAIT_S)
        alone = [httpx.post(f"{base}/v1/classify", files=[file], timeout=WAIT_S) for file in files]
        as_tensor = httpx.post(f"{base}/v2/models/tiny/infer", json=tensor, timeout=WAIT_S)
        too_many = httpx.post(f"{base}/v1/classify", files=[files[0]] * 33, timeout=WAIT_S)
        config = httpx.get(f"{base}/v2/models/tiny/config", timeout=WAIT_S).json()
    assert together.status_code == 200, together.text
    assert [r.status_code for r in alone] == [200] * 3
    for joint, single in zip(together.json()["results"], alone):
        assert joint["topk"][0]["label"] == single.json()["results"][0]["topk"][0]["label"]
        assert joint["score"] == pytest.approx(single.json()["results"][0]["score"], abs=1e-5)
    assert as_tensor.status_code == 200, as_tensor.text
    (probabilities,) = [o for o in as_tensor.json()["outputs"] if o["name"] == "probabilities"]
    assert probabilities["shape"][0] == 3
    assert np.reshape(probabilities["data"], probabilities["shape"]).max(axis=1) == \
        pytest.approx([r["score"] for r in together.json()["results"]], abs=1e-5)
    error = too_many.json()["error"]
    assert too_many.status_code == 400 and "more than 32 images in one request" in error and "--max-batch 1" not in error
    # Clients (Triton's, perf_analyzer) size their requests by max_batch_size; the plan shows as the batch sizes.
    assert config["max_batch_size"] == 32 and config["dynamic_batching"]["preferred_batch_size"] == [1]


def test_a_request_limit_auto_set_is_named_as_auto_whatever_batch_the_plan_chose(tiny, monkeypatch):
    """Under `--max-batch auto` a request may hold 32 images (hardware.AUTO_MAX_BATCH) whatever the plan;
    when the plan chose batches of 32 too, a request of 33 was refused as "more than 32 images in one
    request (--max-batch 32)", an option the user never set. The refusal names auto's limit instead."""
    plan = hardware.ServeDecision(hardware.ServePlan(1, 32), 1.0, source="measured")  # what timing picks where batching pays
    monkeypatch.setattr(served_models, "decide_plan", lambda opener, settings: plan)
    served = serve_model(tiny[0], max_batch=None)
    assert served.max_batch == served.max_request == 32
    png = a_png(tiny)
    blobs = encode_bytes_elements([png] * 33)
    header = json.dumps({"inputs": [{"name": "image_bytes", "shape": [33, 1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(blobs)}}]}).encode()
    app = create_app([served], RequestSettings())
    with uvicorn_thread(app) as base:
        as_files = httpx.post(f"{base}/v1/classify", files=[("file", ("a.png", png, "image/png"))] * 33,
                              timeout=WAIT_S)
        as_tensor = httpx.post(f"{base}/v2/models/tiny/infer", content=header + blobs, timeout=WAIT_S,
                               headers={"Inference-Header-Content-Length": str(len(header))})
    for refused in (as_files, as_tensor):
        error = refused.json()["error"]
        assert refused.status_code == 400 and "--max-batch 32" not in error, error
        assert "32, the most one request holds with --max-batch auto" in error, error


def test_a_request_larger_than_the_plan_counts_as_the_batches_it_ran(tiny):
    """A request of 3 images under a plan of batch 1 runs as three batch-1 executions (Engine.run): the
    metrics say so (3 executions of 1 item, each with its share of the compute time), not one batch of 3,
    which a plan of batch 1 never runs and which would show dynamic batching at work where there is none."""
    served = serve_model(tiny[0], max_batch=None)
    assert served.max_batch == 1
    png = a_png(tiny)
    files = [("file", (f"{i}.png", png, "image/png")) for i in range(3)]
    app = create_app([served], RequestSettings())
    with uvicorn_thread(app) as base:
        answered = httpx.post(f"{base}/v1/classify", files=files, timeout=WAIT_S)
        metrics = httpx.get(f"{base}/metrics", timeout=WAIT_S).text
        statistics = httpx.get(f"{base}/v2/models/tiny/stats", timeout=WAIT_S).json()
    assert answered.status_code == 200 and len(answered.json()["results"]) == 3

    def sample(name: str) -> float:
        (line,) = [line for line in metrics.splitlines() if line.startswith(name + "{")]
        return float(line.rsplit(" ", 1)[1])

    assert sample("inceptionlab_inferences_total") == 3
    assert sample("inceptionlab_executions_total") == 3
    assert sample("inceptionlab_batch_size_count") == 3 and sample("inceptionlab_batch_size_sum") == 3
    assert sample("inceptionlab_compute_seconds_count") == 3
    (model_stats,) = statistics["model_stats"]
    assert model_stats["execution_count"] == 3 and model_stats["inference_count"] == 3


@pytest.mark.parametrize("route", ["multipart", "oip"])
def test_a_request_over_the_pixel_budget_is_refused_before_decoding(tiny, route):
    counting = CountingDecodes(tiny[2])
    blobs = [png_header(6000, 6000)] * 3  # 36 Mpx each: under the per-image limit, 108 Mpx together
    app = create_app([counting.model], RequestSettings())
    with uvicorn_thread(app) as base:
        if route == "multipart":
            files = [("file", (f"{i}.png", blob, "image/png")) for i, blob in enumerate(blobs)]
            refused = httpx.post(f"{base}/v1/classify", files=files, timeout=WAIT_S)
        else:
            data = encode_bytes_elements(blobs)
            header = json.dumps({"inputs": [{"name": "image_bytes", "shape": [3, 1], "datatype": "BYTES",
                                             "parameters": {"binary_data_size": len(data)}}]}).encode()
            refused = httpx.post(f"{base}/v2/models/tiny/infer", content=header + data, timeout=WAIT_S,
                                 headers={"Inference-Header-Content-Length": str(len(header))})
    assert counting.calls == 0
    assert refused.status_code == 400 and "108,000,000 pixels" in refused.json()["error"]
    assert 36_000_000 <= served_models.MAX_UPLOAD_PIXELS and f"{served_models.MAX_REQUEST_PIXELS:,}-pixel budget" \
        in refused.json()["error"]


# --------------------------------------------------------------------------------------- shapes


# (shape, data): products that overflow int64 to 0 (and so "match" no data), more dimensions than
# numpy has, and a zero that hides dimensions no tensor can have.
HUGE_SHAPES = {"2^64": ([2**32, 2**32], []), "2^126": ([2**62, 2**62, 4], []), "70 dims": ([1] * 70, [0.0]),
               "zero among huge": ([2**40, 0, 2**40], [])}


@pytest.mark.parametrize("case", list(HUGE_SHAPES))
def test_a_huge_client_shape_is_a_400_not_an_overflow(tiny, case):
    shape, data = HUGE_SHAPES[case]
    body = json.dumps({"inputs": [{"name": "images", "shape": shape, "datatype": "FP32", "data": data}]}).encode()
    with pytest.raises(ProtocolError) as parsed:
        parse_infer_request(body, None)
    assert "shape" in str(parsed.value)
    request = message("ModelInferRequest")(model_name="tiny")
    request.inputs.add(name="images", datatype="FP32", shape=shape)
    request.raw_input_contents.append(np.asarray(data, np.float32).tobytes())
    with pytest.raises(ProtocolError):
        decode_request(request)
    app = create_app([tiny[2]], RequestSettings())
    with uvicorn_thread(app) as base:
        answer = httpx.post(f"{base}/v2/models/tiny/infer", content=body, timeout=WAIT_S)
    assert answer.status_code == 400 and "shape" in answer.json()["error"]


def test_the_grpc_front_end_refuses_a_huge_shape_as_invalid_argument(tiny):
    app = create_app([tiny[2]], RequestSettings(), grpc_address="127.0.0.1:0")
    with uvicorn_thread(app):
        with grpc.insecure_channel(f"127.0.0.1:{app.state.serve.grpc_port}") as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                       request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=message("ModelInferResponse").FromString)
            request = message("ModelInferRequest")(model_name="tiny")
            request.inputs.add(name="images", datatype="FP32", shape=[2**32, 2**32])
            request.raw_input_contents.append(b"")
            with pytest.raises(grpc.RpcError) as refused:
                call(request, timeout=WAIT_S)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "shape" in refused.value.details()


# --------------------------------------------------------------------------------------- per-request work


def test_tensors_in_the_models_input_form_skip_the_preprocessing_threads(tiny):
    """A UINT8 tensor needs only a shape check: it is answered while every preprocessing thread is busy
    (it used to hop to that pool and wait behind image decoding)."""
    app = create_app([tiny[2]], RequestSettings(preprocess_threads=1))
    state, release = app.state.serve, threading.Event()
    pixels = np.zeros((1, 3, 75, 75), np.uint8).tobytes()
    header = json.dumps({"inputs": [{"name": "images", "shape": [1, 3, 75, 75], "datatype": "UINT8",
                                     "parameters": {"binary_data_size": len(pixels)}}]}).encode()

    async def occupy() -> None:
        await state.in_thread(release.wait, WAIT_S)

    with uvicorn_thread(app) as base:
        busy = asyncio.run_coroutine_threadsafe(occupy(), app.state.event_loop)
        try:
            answer = httpx.post(f"{base}/v2/models/tiny/infer", content=header + pixels, timeout=20,
                                headers={"Inference-Header-Content-Length": str(len(header))})
        finally:
            release.set()
        busy.result(WAIT_S)
    assert answer.status_code == 200 and json.loads(answer.content)["outputs"][0]["shape"][0] == 1


def test_one_image_over_the_pixel_limit_is_refused_from_its_header(tiny):
    counting = CountingDecodes(tiny[2])
    app = create_app([counting.model], RequestSettings())
    with uvicorn_thread(app) as base:
        refused = httpx.post(f"{base}/v1/classify", content=png_header(7000, 7000), timeout=WAIT_S)
        both = httpx.post(f"{base}/v1/classify", timeout=WAIT_S, files=[
            ("file", ("big.png", png_header(7000, 7000), "image/png")), ("file", ("ok.png", a_png(tiny), "image/png"))])
    assert refused.status_code == 400
    assert "7000 x 7000 pixels is above the 40,000,000-pixel limit; downscale it first" in refused.json()["error"]
    [good, bad] = both.json()["results"]  # one bad file of two: answered per file
    assert both.status_code == 200 and len(good["topk"]) == 3 and "40,000,000-pixel limit" in bad["error"]


# --------------------------------------------------------------------------------------- threads


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OS thread names are read from Linux's /proc")
def test_the_servers_threads_carry_their_names_to_the_os(tiny):
    """`top -H`, py-spy and benchmarks/serve_cpu.py's CPU by thread tell the pools apart by these names."""
    from fastapi.testclient import TestClient

    def os_names() -> set[str]:
        return {(task / "comm").read_text().strip() for task in Path("/proc/self/task").iterdir()}

    with TestClient(create_app([tiny[2]], RequestSettings())) as client:
        answer = client.post("/v1/classify", files={"file": ("a.png", a_png(tiny), "image/png")})
        assert answer.status_code == 200
        names = os_names()
    assert "preprocess_0" in names and "infer-tiny_0" in names


def test_a_long_thread_name_keeps_its_pool_index_within_the_kernels_15_bytes():
    from inceptionlab.host import os_thread_name

    assert os_thread_name("preprocess_3") == b"preprocess_3"
    assert os_thread_name("infer-inception_v3_12") == b"infer-incept_12"
    assert os_thread_name("a-very-long-name-without-index") == b"a-very-long-nam"
