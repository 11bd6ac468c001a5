"""POST /v1/explain (serve/explain.py): off unless asked for; a Grad-CAM overlay of the posted image when on."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from helpers.small_runs import small_run
from PIL import Image
from serve_helpers import serve_model

from inceptionlab.serve.app import create_app
from inceptionlab.serve.service import RequestSettings

pytest.importorskip("captum", reason="Captum is not installed (the trust extra)")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    run = small_run(tmp_path_factory)
    return run, serve_model(run.run_dir)


@pytest.fixture(scope="module")
def explaining(served):
    from inceptionlab.cli.serve import _explainers

    run, model = served
    service = _explainers([(model, run.run_dir)], None, "cpu")
    with TestClient(create_app([model], RequestSettings(), explain=service)) as client:
        yield client, service


def test_explanations_are_off_by_default(served):
    run, model = served
    image = sorted((run.data / "val" / "fox").glob("*.png"))[0].read_bytes()
    with TestClient(create_app([model], RequestSettings())) as client:
        answer = client.post("/v1/explain", content=image)
    assert answer.status_code == 404 and "start the server with --explain" in answer.json()["error"]


def test_an_explanation_is_the_overlay_of_the_class_the_server_answers(served, explaining):
    from inceptionlab.judge.explain import overlay

    run, model = served
    client, service = explaining
    path = sorted((run.data / "val" / "fox").glob("*.png"))[1]
    classified = client.post("/v1/classify", content=path.read_bytes()).json()["results"][0]["topk"][0]
    answer = client.post("/v1/explain?model=tiny", content=path.read_bytes())
    assert answer.status_code == 200 and answer.headers["content-type"] == "image/png"
    assert int(answer.headers["x-class-index"]) == classified["index"] and answer.headers["x-class-label"] == "fox"
    assert float(answer.headers["x-class-probability"]) == pytest.approx(classified["prob"], abs=1e-4)
    picture = np.asarray(Image.open(io.BytesIO(answer.content)))
    explainer = service.explainers["tiny"]
    pixels = explainer.load(path)[None]
    expected = np.asarray(overlay(pixels[0], explainer.maps(pixels, [classified["index"]])[0]))
    assert picture.shape == (128, 128, 3) and np.array_equal(picture, expected)


def test_a_chosen_class_is_explained_and_bad_requests_are_one_line_400s(served, explaining):
    run, _ = served
    client, _ = explaining
    image = sorted((run.data / "val" / "fox").glob("*.png"))[0].read_bytes()
    answer = client.post("/v1/explain?target=1", content=image)
    assert answer.status_code == 200 and answer.headers["x-class-index"] == "1" and answer.headers["x-class-label"] == "dog"
    assert float(answer.headers["x-class-probability"]) < 0.5  # a fox square is not a dog
    wrong_class = client.post("/v1/explain?target=3", content=image)
    assert wrong_class.status_code == 400 and "classes 0-2" in wrong_class.json()["error"]
    not_an_image = client.post("/v1/explain", content=b"hello")
    assert not_an_image.status_code == 400 and "\n" not in not_an_image.json()["error"]
    unknown = client.post("/v1/explain?model=nope", content=image)
    assert unknown.status_code == 404 and "unknown model 'nope'" in unknown.json()["error"]
    assert client.post("/v1/explain", content=image).status_code == 200  # still answering


def test_the_explainer_serves_the_run_s_own_weights(served, explaining):
    from inceptionlab.models.registry import load_run_model

    run, _ = served
    _, service = explaining
    net, _ = load_run_model(run.run_dir)
    explainer = service.explainers["tiny"]
    assert explainer.layer == "4"  # the registry's layer for the guide's CIFAR-10 network
    for name, tensor in net.state_dict().items():
        assert torch.equal(explainer.model.state_dict()[name], tensor), name
