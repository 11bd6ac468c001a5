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


@pytest.fixture(scope="module")
def ruled(imdb_root, tmp_path_factory):
    """A text run that learnt the miniature's words (20 epochs of batches of 8 at lr 0.01: validation top-1
    1.0, a few seconds), exported as `train` exports it, then given a decision rule by `evaluate`: its
    temperature and a threshold answering half of validation."""
    from inceptionlab.cli.app import main
    from inceptionlab.config import load_recipe
    from inceptionlab.engine.fit import fit
    from inceptionlab.infer.text import export_text_run

    recipe = load_recipe("imdb/text_classifier", [f"data.root={imdb_root}", "train.epochs=20", "train.batch_size=8",
                                                  "optim.lr=0.01"])
    run_dir = fit(recipe, tmp_path_factory.mktemp("ruled_text"), progress=False).run_dir
    export_text_run(run_dir)  # as `inceptionlab train` writes it at the end of a text run
    with pytest.raises(SystemExit) as done:
        main(["evaluate", str(run_dir), "--reject", "coverage=0.5", "--json"])
    assert done.value.code in (0, None)
    return run_dir, json.loads((run_dir / "eval" / "calibration.json").read_text())["reject"]["threshold"]


TEXTS = ["great wonderful superb brilliant film, loved it, the best", "awful boring dull terrible waste, the worst",
         "the film and the plot", "a"]


def test_text_predict_and_classify_answer_unknown_below_the_threshold(ruled, cli):
    """Text `predict` and text /v1/classify ignored reject_threshold although `serve` printed it: both answer
    by the rule, as image runs do (answer, score, unknown), beside P(positive)."""
    run_dir, threshold = ruled
    result = cli("predict", "--run", run_dir, *[x for t in TEXTS for x in ("--text", t)], "--json")
    assert result.code == 0, result.err
    rows = [json.loads(line) for line in result.out.splitlines()]
    for row in rows:
        assert (row["answer"] == "unknown") == row["unknown"]
        if abs(row["score"] - threshold) > 1e-6:  # the score shown has 6 decimals: nearer than that it cannot tell
            assert row["unknown"] == (row["score"] < threshold)
        assert row["score"] == pytest.approx(max(row["probability"], 1 - row["probability"]), abs=1e-6)
    assert any(row["unknown"] for row in rows) and not all(row["unknown"] for row in rows)
    with TestClient(create_app([serve_model(run_dir)], RequestSettings())) as client:
        for text, row in zip(TEXTS, rows):
            got = client.post("/v1/classify", json={"text": text}).json()["results"][0]
            assert (got["answer"], got["unknown"]) == (row["answer"], row["unknown"])
            assert got["score"] == pytest.approx(row["score"], abs=1e-5)


def test_the_text_export_carries_the_rule(ruled, tmp_path):
    """exports/text's meta.json carries the temperature and threshold, and its classify.py answers by them."""
    import subprocess
    import sys

    run_dir, threshold = ruled
    meta = json.loads((run_dir / "exports" / "text" / "meta.json").read_text())
    assert meta["rule"]["threshold"] == threshold
    proc = subprocess.run([sys.executable, "-I", str(run_dir / "exports" / "text" / "classify.py"), *TEXTS],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    exported = [json.loads(line) for line in proc.stdout.splitlines()]
    ours = list(TextPredictor.from_run(run_dir, torch.device("cpu")).predict(TEXTS))
    assert [r["answer"] for r in exported] == [r["answer"] for r in ours]
    assert [r["probability"] for r in exported] == pytest.approx([r["probability"] for r in ours], abs=1e-5)
