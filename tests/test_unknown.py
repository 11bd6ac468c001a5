"""Calibrated scores and "unknown" from evaluate to predict, export and serve; test-time augmentation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.calibration_run import calibration_run
from test_serve_browser import browser  # noqa: F401  (the fixture: a headless chromium per test)

from inceptionlab.judge.calibrate import fit_temperature, nll
from inceptionlab.models.spec import ModelSpec


@pytest.fixture
def run(tmp_path_factory, tmp_path):
    return calibration_run(tmp_path_factory).copy(tmp_path)


def evaluate_json(cli, *args):
    result = cli("evaluate", *args, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def spec_of(run) -> ModelSpec:
    return ModelSpec.load(run.run_dir / "spec.json")


def test_evaluate_fits_the_temperature_on_validation_logits_and_saves_it(run, cli):
    from inceptionlab.judge.evaluate import evaluate_run

    report = evaluate_json(cli, run.run_dir)
    scores = evaluate_run(run.run_dir, None, None, device=torch.device("cpu"), batch_size=8, num_workers=0).scores
    # The saved temperature is the NLL minimum on the validation logits (not on probabilities).
    assert spec_of(run).temperature == pytest.approx(fit_temperature(scores.logits, scores.targets), rel=1e-6)
    calibration = report["calibration"]
    assert calibration["fitted"] and calibration["samples"] == 18 == len(scores.targets)
    assert calibration["nll_after"] < calibration["nll_before"] == pytest.approx(nll(scores.logits, scores.targets), abs=1e-5)
    saved = json.loads((run.run_dir / "eval" / "calibration.json").read_text())
    assert sum(b["count"] for b in saved["bins_before"]) == sum(b["count"] for b in saved["bins_after"]) == 18
    png = (run.run_dir / "eval" / "plots" / "reliability.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert report["rule_saved_to"] == str(run.run_dir / "spec.json")


def test_unknown_answers_images_of_no_class_and_keeps_what_validation_promised(run, cli):
    report = evaluate_json(cli, run.run_dir, "--reject", "precision=0.9", "--unknown-images", run.outside)
    reject = report["calibration"]["reject"]
    assert reject["precision"] >= 0.9 and 0 < reject["coverage"] < 1 and reject["target"] == "precision=0.9"
    spec = spec_of(run)
    assert spec.reject_threshold == pytest.approx(reject["threshold"]) and spec.reject_target == "precision=0.9"
    outside = report["outside_images"]
    assert outside["images"] == 24 and outside["unknown_share"] >= 0.9
    # predict answers by the saved rule: noise is unknown, a clean square of a class is named.
    result = cli("predict", "--run", run.run_dir, run.outside / "noise_0.png", run.data / "val" / "fox" / "fox_1.png",
                 "--json")
    noise, fox = (json.loads(line) for line in result.out.splitlines())
    assert noise["answer"] == "unknown" and noise["unknown"] and noise["score"] < spec.reject_threshold
    assert fox["answer"] == "fox" and not fox["unknown"] and fox["score"] == fox["topk"][0]["prob"]


def test_another_datasets_photos_are_answered_unknown(run, cli):
    from conftest import shared_data

    photos = shared_data("cifar-10")  # real photographs of none of the coloured-square classes
    report = evaluate_json(cli, run.run_dir, "--reject", "precision=0.9", "--unknown-images", photos)
    assert report["outside_images"]["images"] >= 50 and report["outside_images"]["unknown_share"] >= 0.5


@pytest.mark.slow  # four evaluations: ~30 s on 2 cores
def test_other_splits_apply_the_saved_rule_and_change_nothing(run, cli):
    evaluate_json(cli, run.run_dir, "--reject", "coverage=0.5")
    before = (run.run_dir / "spec.json").read_bytes()
    report = evaluate_json(cli, run.run_dir, "--split", "train")
    assert not report["calibration"]["fitted"] and report["rule_saved_to"] is None
    assert report["calibration"]["reject"]["target"] == "as saved"
    assert (run.run_dir / "spec.json").read_bytes() == before
    refused = cli("evaluate", run.run_dir, "--split", "train", "--reject", "precision=0.9")
    assert refused.code == 2 and "validation split" in refused.err
    # Fitting again without --reject keeps the user's target and chooses its threshold anew.
    evaluate_json(cli, run.run_dir)
    assert spec_of(run).reject_target == "coverage=0.5"
    evaluate_json(cli, run.run_dir, "--reject", "none")
    assert spec_of(run).reject_threshold is None and spec_of(run).reject_target is None


def test_tta_gain_is_measured_in_one_pass_and_the_rule_remembers_it(run, cli):
    plain = evaluate_json(cli, run.run_dir, "--tta", "none", "--keep-rule")
    report = evaluate_json(cli, run.run_dir, "--tta", "flip-crops")
    gain = report["tta_gain"]
    assert gain["views"] == 10 and gain["images"] == 18
    assert gain["top1_without"] == pytest.approx(plain["top1"])  # view 0 is the plain evaluation
    assert gain["top1_with"] == pytest.approx(report["top1"])
    helped = gain["top1_gain"] >= 0 and gain["nll_gain"] > 2 * gain["nll_gain_se"]  # beyond these images' noise
    assert gain["nll_gain"] == pytest.approx(gain["nll_without"] - gain["nll_with"], abs=1e-6)
    assert spec_of(run).tta == ("flip-crops" if helped else "none")
    assert (report["note"] is None) == helped
    from inceptionlab.infer.predict import Predictor
    from inceptionlab.models.registry import load_run_model

    net, spec = load_run_model(run.run_dir)
    assert Predictor(net, spec, torch.device("cpu")).tta == spec.tta  # predict's default is the saved rule


def test_tta_is_adopted_only_where_it_helped():
    from inceptionlab.judge.decision import adopted, tta_gain
    from inceptionlab.judge.evaluate import Scores

    rng = np.random.default_rng(0)
    targets = np.arange(40) % 2
    plain = np.zeros((40, 2), np.float32)
    plain[np.arange(40), targets] = rng.uniform(0.5, 1.5, 40)  # right, unsure
    plain[:6, :] = plain[:6, ::-1]  # 6 of 40 wrong
    better = plain.copy()
    better[np.arange(40), targets] += 1.0  # every image surer of its class: 3 of the wrong ones turn right
    scores = Scores(better, targets, "flip", plain)
    assert adopted(scores, tta_gain(scores)) == (scores, None)
    worse = Scores(plain, targets, "flip", better)
    kept, note = adopted(worse, tta_gain(worse))
    assert kept.tta == "none" and kept.logits is better and "not adopted" in note


def test_tta_gains_within_the_noise_of_a_few_images_are_not_adopted():
    """Same top-1 and a lower NLL from one image in four is what chance gives: it would double every later
    forward pass for nothing (a 23-image validation split adopted flip on NLL 1.5169 -> 1.4894)."""
    from inceptionlab.judge.decision import adopted, tta_gain
    from inceptionlab.judge.evaluate import Scores

    targets = np.array([0, 1, 1, 0])
    plain = np.array([[2.0, 0.0], [0.0, 2.0], [0.0, 1.0], [2.0, 0.0]], np.float32)
    surer = np.array([[2.0, 0.0], [0.0, 2.0], [0.0, 1.5], [2.0, 0.0]], np.float32)  # one image, same answers
    noisy = Scores(surer, targets, "flip", plain)
    gain = tta_gain(noisy)
    assert gain["top1_gain"] == 0 and gain["nll_with"] < gain["nll_without"]
    kept, note = adopted(noisy, gain)
    assert kept.tta == "none" and kept.logits is plain and "within the noise of these 4 images" in note


@pytest.mark.slow  # an ONNX export with its parity check: ~25 s on 2 cores
def test_export_carries_the_rule_and_its_parity_reads_it_back(run, cli):
    pytest.importorskip("onnxruntime")
    from google.protobuf import text_format

    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    evaluate_json(cli, run.run_dir, "--reject", "precision=0.9")
    spec = spec_of(run)
    result = cli("export", run.run_dir, "--format", "triton", "--json")
    assert result.code == 0, result.err
    decision = json.loads(result.out)["parity"]["decision"]
    assert decision["ok"] and decision["temperature"] == spec.temperature
    assert decision["reject_threshold"] == spec.reject_threshold and decision["unknown_agree"] >= 9
    config = text_format.Parse(next((run.run_dir / "exports" / "triton").glob("*/config.pbtxt")).read_text(),
                               model_config_pb2.ModelConfig())
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert float(params["temperature"]) == pytest.approx(spec.temperature)
    assert float(params["reject_threshold"]) == pytest.approx(spec.reject_threshold)


def test_a_new_rule_makes_the_export_stale(run, cli):
    pytest.importorskip("onnxruntime")
    from inceptionlab.infer.export import current_export
    from inceptionlab.infer.source import load_source

    assert cli("export", run.run_dir).code == 0
    assert current_export(load_source(run_dir=run.run_dir)) is not None
    evaluate_json(cli, run.run_dir)  # fits a temperature: the stamped spec no longer says it
    assert current_export(load_source(run_dir=run.run_dir)) is None


def test_parity_fails_when_the_file_carries_another_rule():
    from inceptionlab.infer.parity import compare_decisions

    logits = np.array([[3.0, 0.0, 0.0], [0.4, 0.3, 0.0]], np.float32)
    ours = ModelSpec("m", 3, ["a", "b", "c"], temperature=2.0, reject_threshold=0.5)
    assert compare_decisions(logits, logits + 1e-6, ours, ours)["ok"]
    stale = ModelSpec("m", 3, ["a", "b", "c"])
    verdict = compare_decisions(logits, logits, ours, stale)
    assert not verdict["ok"] and "temperature" in verdict["problem"]
    assert not compare_decisions(logits, logits, ours, None)["ok"]


# --------------------------------------------------------------------------------------- serve


@pytest.fixture
def served(run, cli):
    from serve_helpers import serve_model

    evaluate_json(cli, run.run_dir, "--reject", "precision=0.9")
    return run, serve_model(run.run_dir)


def test_serve_declares_unknown_and_answers_like_predict(served):
    from fastapi.testclient import TestClient

    from inceptionlab.infer.predict import Predictor
    from inceptionlab.models.registry import load_run_model
    from inceptionlab.serve.app import create_app

    run, model = served
    spec = spec_of(run)
    files = [run.outside / "noise_0.png", run.data / "val" / "fox" / "fox_1.png"]
    net, _ = load_run_model(run.run_dir)
    expected = list(Predictor(net, spec, torch.device("cpu")).predict_files(files, topk=3))
    with TestClient(create_app([model])) as client:
        meta = client.get("/v2/models/tiny").json()
        assert {"name": "unknown", "datatype": "BOOL", "shape": [-1, 1]} in meta["outputs"]
        params = client.get("/v2/models/tiny/config").json()["parameters"]
        assert float(params["temperature"]["string_value"]) == pytest.approx(spec.temperature)
        assert float(params["reject_threshold"]["string_value"]) == pytest.approx(spec.reject_threshold)
        body = {"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [2, 1],
                            "data": [{"b64": __import__("base64").b64encode(f.read_bytes()).decode()} for f in files]}]}
        outputs = {o["name"]: o for o in client.post("/v2/models/tiny/infer", json=body).json()["outputs"]}
        assert outputs["unknown"]["data"] == [True, False] and outputs["unknown"]["datatype"] == "BOOL"
        probs = np.array(outputs["probabilities"]["data"]).reshape(2, 3)
        assert probs.max(axis=1) == pytest.approx([e["score"] for e in expected], abs=1e-4)  # calibrated, as predict
        classified = client.post("/v1/classify", files=[("files", (f.name, f.read_bytes())) for f in files]).json()
        answers = [(r["answer"], r["unknown"]) for r in classified["results"]]
        assert answers == [("unknown", True), ("fox", False)]
        assert client.get("/v1/models").json()["models"][0]["reject_threshold"] == pytest.approx(spec.reject_threshold)


def test_grpc_encodes_the_unknown_output_as_bool_contents():
    pytest.importorskip("grpc")
    from inceptionlab.serve.grpc_server import encode_response

    response = encode_response("m", "1", {"unknown": np.array([[True], [False]])}, raw=False)
    assert response.outputs[0].datatype == "BOOL" and list(response.outputs[0].contents.bool_contents) == [True, False]


def test_serve_with_tta_answers_like_predict_with_tta(run):
    from inceptionlab.infer.predict import Predictor
    from inceptionlab.models.registry import load_run_model
    from inceptionlab.serve.models import ModelLoadSettings, load_served_model

    settings = ModelLoadSettings(backend="eager", precision="fp32", device="cpu", max_batch=4, log=lambda m: None,
                                 tta="flip-crops")
    model = load_served_model(settings, run_dir=run.run_dir, name="tiny")
    files = sorted((run.data / "val").rglob("*.png"))[:3]
    items, count = model.decode_images([f.read_bytes() for f in files])
    served = model.run(0, [items])[0]["probabilities"]
    net, spec = load_run_model(run.run_dir)
    expected = list(Predictor(net, spec, torch.device("cpu"), tta="flip-crops").predict_files(files, topk=3))
    for row, want in zip(served, expected):
        assert row.max() == pytest.approx(want["score"], abs=1e-4)


def test_bench_times_tta_as_serve_runs_it(run, cli, monkeypatch):
    from inceptionlab.infer.bench import AugmentedSession
    from inceptionlab.infer.runtimes import TorchSession
    from inceptionlab.infer.tta import with_tta
    from inceptionlab.models.registry import load_run_model

    net, _ = load_run_model(run.run_dir)
    inputs = np.random.default_rng(0).normal(size=(2, 3, 32, 32)).astype(np.float32)
    session = AugmentedSession(TorchSession(net, "fp32", "nchw", "cpu", 2), "flip-crops")
    with torch.inference_mode():
        expected = with_tta(net.eval(), "flip-crops")(torch.from_numpy(inputs)).numpy()
    assert np.allclose(session.predict(inputs), expected, atol=1e-5)
    # What bench times: each timed call of the TTA row runs the model once per view (10 for flip-crops),
    # counted rather than timed (a timing comparison fails beside a busy neighbour).
    calls = {"tta": 0, "model": 0}
    tta_run, model_run = AugmentedSession.run, TorchSession.run
    monkeypatch.setattr(AugmentedSession, "run", lambda self, placed: calls.__setitem__("tta", calls["tta"] + 1)
                        or tta_run(self, placed))
    monkeypatch.setattr(TorchSession, "run", lambda self, placed: calls.__setitem__("model", calls["model"] + 1)
                        or model_run(self, placed))
    result = cli("bench", run.run_dir, "--backend", "eager", "--precision", "fp32", "--layout", "nchw",
                 "--tta", "flip-crops", "--batch", "2", "--iters", "5", "--warmup", "1", "--no-plot", "--json")
    assert result.code == 0, result.err
    assert calls["tta"] >= 6 and calls["model"] == 10 * calls["tta"]
    result = cli("bench", run.run_dir, "--backend", "eager", "--precision", "fp32", "--layout", "nchw",
                 "--tta", "none,flip-crops", "--batch", "2", "--iters", "5", "--warmup", "1", "--no-plot", "--json")
    assert result.code == 0, result.err
    rows = {row["tta"]: row for row in map(json.loads, result.out.splitlines())}
    assert set(rows) == {"none", "flip-crops"} and rows["none"]["speedup"] == 1.0


def test_the_page_shows_unknown_with_the_score_and_threshold(served, browser, tmp_path):  # noqa: F811
    """The server's page in headless chromium: an image of no class is shown as unknown, with its score."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait
    from serve_helpers import uvicorn_thread

    from inceptionlab.serve.app import create_app

    run, model = served
    with uvicorn_thread(create_app([model])) as base:
        browser.get(base + "/")
        wait = WebDriverWait(browser, 30)
        wait.until(ready.text_to_be_present_in_element((By.ID, "info"), "unknown"))
        assert "calibrated (T = " in browser.find_element(By.ID, "info").text
        browser.find_element(By.ID, "files").send_keys(str(run.outside / "noise_0.png"))
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "#results .unknown")))
        text = browser.find_element(By.CSS_SELECTOR, "#results .unknown").text
        threshold = f"{spec_of(run).reject_threshold * 100:.1f}%"
        assert text.startswith("unknown: the model's best guess scores") and threshold in text
        browser.save_screenshot(str(tmp_path / "unknown.png"))
