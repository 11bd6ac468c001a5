"""Serving the IMDB text model: raw strings in (JSON or OIP BYTES), the run's own tokenizer."""

from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient
from serve_helpers import serve_model

from inceptionlab.infer.text import TextPredictor
from inceptionlab.serve.app import create_app
from inceptionlab.serve.service import RequestSettings

REVIEWS = ["The movie was great! Wonderful acting and a moving story.", "Dull, boring and far too long. Awful."]


@pytest.fixture(scope="module")
def imdb(imdb_root, tmp_path_factory):
    from inceptionlab.config import load_recipe
    from inceptionlab.engine.fit import fit

    data = imdb_root  # reviews in aclImdb's layout, written by the tests (conftest.py)
    recipe = load_recipe("imdb/text_classifier", [f"data.root={data}", "train.epochs=1"])
    run_dir = fit(recipe, tmp_path_factory.mktemp("imdb"), progress=False).run_dir
    served = serve_model(run_dir)
    with TestClient(create_app([served], RequestSettings())) as client:
        yield run_dir, client


def test_text_classify_matches_predict_text(imdb):
    run_dir, client = imdb
    expected = list(TextPredictor.from_run(run_dir, torch.device("cpu")).predict(REVIEWS))
    meta = client.get("/v2/models/tiny").json()
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}]
    for review, want in zip(REVIEWS, expected):
        got = client.post("/v1/classify", json={"text": review}).json()["results"][0]
        assert got["label"] == want["label"] and got["probability"] == pytest.approx(want["probability"], abs=1e-5)
        assert got["text"] == review and len(got["topk"]) == 2
    oip = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": REVIEWS}],
           "outputs": [{"name": "probabilities"}]}
    probs = client.post("/v2/models/tiny/infer", content=json.dumps(oip)).json()["outputs"][0]
    assert probs["shape"] == [2, 2]
    assert probs["data"][1::2] == pytest.approx([w["probability"] for w in expected], abs=1e-5)


@pytest.mark.parametrize("body, words", [
    (b'{"review": "no text key"}', '{"text": "..."}'),
    (b"\x89PNG\r\n\x1a\n", "invalid JSON"),
    (b"", "empty request body"),
])
def test_text_model_bad_input_is_a_one_line_400(imdb, body, words):
    _, client = imdb
    response = client.post("/v1/classify", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and words in response.json()["error"]
    assert client.post("/v1/classify", json={"text": "fine"}).status_code == 200
