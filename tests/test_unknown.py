"""Calibrated scores and "unknown" from evaluate to predict, export and serve; test-time augmentation."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from helpers.calibration_run import calibration_run, evaluate_json, spec_of
from helpers.page_examples import check_example
from test_serve_browser import browser  # noqa: F401  (the fixture: a headless chromium per test)

from inceptionlab.judge.calibrate import fit_temperature, nll
from inceptionlab.models.rule import DecisionRule
from inceptionlab.models.spec import ModelSpec


@pytest.fixture
def run(tmp_path_factory, tmp_path):
    return calibration_run(tmp_path_factory).copy(tmp_path)


def test_evaluate_fits_the_temperature_on_validation_logits_and_saves_it(run, cli):
    from inceptionlab.judge.evaluate import evaluate_run

    report = evaluate_json(cli, run.run_dir)
    scores = evaluate_run(run.run_dir, None, None, device=torch.device("cpu"), batch_size=8, num_workers=0).scores
    # The saved temperature is the NLL minimum on the validation logits (not on probabilities).
    assert spec_of(run).rule.temperature == pytest.approx(fit_temperature(scores.logits, scores.targets), rel=1e-6)
    calibration = report["calibration"]
    assert calibration["fitted"] and calibration["samples"] == 18 == len(scores.targets)
    assert calibration["nll_after"] < calibration["nll_before"] == pytest.approx(nll(scores.logits, scores.targets), abs=1e-5)
    saved = json.loads((run.run_dir / "eval" / "calibration.json").read_text())
    assert sum(b["count"] for b in saved["bins_before"]) == sum(b["count"] for b in saved["bins_after"]) == 18
    png = (run.run_dir / "eval" / "plots" / "reliability.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert report["rule_saved_to"] == str(run.run_dir / "spec.json")


def test_unknown_answers_images_of_no_class_and_keeps_what_validation_promised(run, cli):
    result = cli("evaluate", run.run_dir, "--reject", "precision=0.9", "--unknown-images", run.outside)
    assert result.code == 0, result.err
    check_example("calibration-fit", result.out)
    report = json.loads((run.run_dir / "eval" / "calibration.json").read_text())
    reject = report["reject"]
    assert reject["precision"] >= 0.9 and 0 < reject["coverage"] < 1 and reject["target"] == "precision=0.9"
    spec = spec_of(run)
    assert spec.rule.threshold == pytest.approx(reject["threshold"]) and spec.rule.target == "precision=0.9"
    outside = report["outside_images"]
    assert outside["images"] == 24 and outside["unknown_share"] >= 0.9
    # predict answers by the saved rule: noise is unknown, a clean square of a class is named.
    result = cli("predict", "--run", run.run_dir, run.outside / "noise_0.png", run.data / "val" / "fox" / "fox_1.png",
                 "--json")
    noise, fox = (json.loads(line) for line in result.out.splitlines())
    check_example("calibration-predict-json", result.out.splitlines()[1])
    assert noise["answer"] == "unknown" and noise["unknown"] and noise["score"] < spec.rule.threshold
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
    result = cli("evaluate", run.run_dir, "--split", "train")
    assert result.code == 0, result.err
    check_example("calibration-other-split", result.out)
    report = json.loads((run.run_dir / "eval" / "calibration.json").read_text())
    assert not report["fitted"] and report["rule_saved_to"] is None
    assert report["reject"]["target"] == "as saved"
    assert (run.run_dir / "spec.json").read_bytes() == before
    refused = cli("evaluate", run.run_dir, "--split", "train", "--reject", "precision=0.9")
    assert refused.code == 2 and "validation split" in refused.err
    # Fitting again without --reject keeps the user's target and chooses its threshold anew.
    evaluate_json(cli, run.run_dir)
    assert spec_of(run).rule.target == "coverage=0.5"
    evaluate_json(cli, run.run_dir, "--reject", "none")
    assert spec_of(run).rule.threshold is None and spec_of(run).rule.target is None


def test_tta_gain_is_measured_in_one_pass_and_the_rule_remembers_it(run, cli):
    plain = evaluate_json(cli, run.run_dir, "--tta", "none", "--keep-rule")
    report = evaluate_json(cli, run.run_dir, "--tta", "flip-crops")
    gain = report["tta_gain"]
    assert gain["views"] == 10 and gain["images"] == 18
    assert gain["top1_without"] == pytest.approx(plain["top1"])  # view 0 is the plain evaluation
    assert gain["top1_with"] == pytest.approx(report["top1"])
    helped = gain["top1_gain"] >= 0 and gain["nll_gain"] > 2 * gain["nll_gain_se"]  # beyond these images' noise
    assert gain["nll_gain"] == pytest.approx(gain["nll_without"] - gain["nll_with"], abs=1e-6)
    assert spec_of(run).rule.tta == ("flip-crops" if helped else "none")
    assert (report["note"] is None) == helped
    from inceptionlab.infer.predict import Predictor
    from inceptionlab.models.registry import load_run_model

    net, spec = load_run_model(run.run_dir)
    assert Predictor(net, spec, torch.device("cpu")).tta == spec.rule.tta  # predict's default is the saved rule


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
    from inceptionlab.judge.calibrate import calibrate
    from inceptionlab.judge.decision import RuleReport

    report = RuleReport(calibrate(kept.logits, targets, fit=False, temperature=1.0), DecisionRule(),
                        tta_gain=tta_gain(worse), note=note)
    check_example("calibration-tta-hurt", "\n".join(x for x in report.lines() if x.startswith("test-time")))


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
    check_example("calibration-tta-noise", note)


@pytest.mark.slow  # an ONNX export with its parity check: ~25 s on 2 cores
def test_export_carries_the_rule_and_its_parity_reads_it_back(run, cli):
    pytest.importorskip("onnxruntime")
    from google.protobuf import text_format

    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from inceptionlab.infer.onnx_graph import stamped_spec
    from inceptionlab.infer.sidecar import read_sidecar

    evaluate_json(cli, run.run_dir, "--reject", "precision=0.9")
    spec = spec_of(run)
    result = cli("export", run.run_dir, "--format", "triton", "--json")
    assert result.code == 0, result.err
    decision = json.loads(result.out)["parity"]["decision"]
    assert decision["ok"] and decision["temperature"] == spec.rule.temperature
    assert decision["reject_threshold"] == spec.rule.threshold and decision["unknown_agree"] >= 9
    config = text_format.Parse(next((run.run_dir / "exports" / "triton").glob("*/config.pbtxt")).read_text(),
                               model_config_pb2.ModelConfig())
    params = {k: v.string_value for k, v in config.parameters.items()}
    # In full: a Triton client reproduces the rule's comparison to the bit.
    assert float(params["temperature"]) == spec.rule.temperature and float(params["reject_threshold"]) == spec.rule.threshold
    assert params["tta"] == spec.rule.tta and params["reject_target"] == "precision=0.9"
    assert params["rule_fitted_on"] == "18 images of val"
    onnx_file = run.run_dir / "exports" / "model.onnx"
    assert stamped_spec(onnx_file).rule == spec.rule  # the whole rule inside the graph's metadata
    assert ModelSpec.from_dict(read_sidecar(onnx_file)["spec"]).rule == spec.rule


def test_a_new_rule_makes_the_export_stale(run, cli):
    pytest.importorskip("onnxruntime")
    from inceptionlab.infer.export import current_export
    from inceptionlab.infer.source import load_source

    evaluate_json(cli, run.run_dir, "--reject", "precision=0.9")
    exported = cli("export", run.run_dir)
    assert exported.code == 0, exported.err
    check_example("calibration-export-parity", exported.out)
    assert current_export(load_source(run_dir=run.run_dir)) is not None
    evaluate_json(cli, run.run_dir, "--reject", "coverage=0.5")  # another threshold: the stamped spec is stale
    assert current_export(load_source(run_dir=run.run_dir)) is None


def test_parity_fails_when_the_file_carries_another_rule():
    from inceptionlab.infer.parity import compare_decisions

    logits = np.array([[3.0, 0.0, 0.0], [0.4, 0.3, 0.0]], np.float32)
    ours = ModelSpec("m", 3, ["a", "b", "c"], rule=DecisionRule(temperature=2.0, threshold=0.5))
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
        assert float(params["temperature"]["string_value"]) == pytest.approx(spec.rule.temperature)
        assert float(params["reject_threshold"]["string_value"]) == pytest.approx(spec.rule.threshold)
        body = {"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [2, 1],
                            "data": [{"b64": __import__("base64").b64encode(f.read_bytes()).decode()} for f in files]}]}
        outputs = {o["name"]: o for o in client.post("/v2/models/tiny/infer", json=body).json()["outputs"]}
        assert outputs["unknown"]["data"] == [True, False] and outputs["unknown"]["datatype"] == "BOOL"
        probs = np.array(outputs["probabilities"]["data"]).reshape(2, 3)
        assert probs.max(axis=1) == pytest.approx([e["score"] for e in expected], abs=1e-4)  # calibrated, as predict
        classified = client.post("/v1/classify", files=[("files", (f.name, f.read_bytes())) for f in files]).json()
        answers = [(r["answer"], r["unknown"]) for r in classified["results"]]
        assert answers == [("unknown", True), ("fox", False)]
        assert client.get("/v1/models").json()["models"][0]["reject_threshold"] == pytest.approx(spec.rule.threshold)


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
        threshold = f"{spec_of(run).rule.threshold * 100:.1f}%"
        assert text.startswith("unknown: the model's best guess scores") and threshold in text
        browser.save_screenshot(str(tmp_path / "unknown.png"))


# --------------------------------------------------------------------------------------- one rule, applied alike


def answered_files(cli, run_dir, *inputs, extra=()) -> dict[str, dict]:
    result = cli("predict", "--run", run_dir, *inputs, *extra, "--json")
    assert result.code == 0, result.err
    return {row["file"]: row for row in map(json.loads, result.out.splitlines())}


def _rounding_down(run, cli):
    """The validation scores as evaluate computes them (float64) and one image whose score float32
    arithmetic rounds down: (scores, that image's row, the results table, the fitted temperature)."""
    from inceptionlab.judge.calibrate import fit_temperature
    from inceptionlab.judge.results import read_results
    from inceptionlab.models.rule import softmax

    evaluate_json(cli, run.run_dir)
    table = read_results(run.run_dir / "eval")
    temperature = fit_temperature(table.logits, table.targets)  # what evaluate fitted (the first test's claim)
    exact = softmax(table.logits, temperature).max(axis=1)
    rounded = (torch.from_numpy(table.logits) / temperature).softmax(dim=1).max(dim=1).values.double().numpy()
    candidates = [i for i in np.flatnonzero(rounded < exact) if np.sum(exact == exact[i]) == 1]
    assert candidates, "no validation score that float32 rounds down: choose another run"
    return exact, candidates[0], table, temperature


def test_predict_answers_exactly_the_images_evaluate_promised(run, cli):
    """`evaluate --reject` promises k answered on validation; `predict` on the same images answers those k,
    in its own batches. predict once recomputed the score in float32 and compared it "strictly below" a
    float64 threshold set at a validation image's own score: 341 answered where evaluate promised 342. The
    image here is one whose score float32 arithmetic rounds down; the threshold now lies between it and
    the next lower score, where the last bits of logits computed in another batch cannot move an image."""
    exact, chosen, table, _ = _rounding_down(run, cli)
    k, n = int(np.sum(exact >= exact[chosen])), len(exact)
    report = evaluate_json(cli, run.run_dir, "--reject", f"coverage={k / n!r}")
    promised = report["calibration"]["reject"]
    below = exact[exact < exact[chosen]]
    assert promised["answered"] == k and exact[chosen] > promised["threshold"] > (below.max() if len(below) else 0)
    rows = answered_files(cli, run.run_dir, run.data / "val")  # batches of 16 and 2, where evaluate ran one of 18
    assert len(rows) == n
    answered = {file for file, row in rows.items() if not row["unknown"]}
    expected = {row["file"] for row, score in zip(table.rows, exact) if score >= exact[chosen]}
    assert answered == expected and len(answered) == k


def test_a_threshold_saved_at_a_validation_score_is_kept_by_predict(run, cli):
    """A threshold exactly at a validation image's score (as evaluate chose them before, in a spec.json of
    that time): evaluate --keep-rule promises that image answered, and predict, computing the score the
    same way (float64, one comparison) from the same logits (one batch, as evaluate's), answers it."""
    exact, chosen, table, temperature = _rounding_down(run, cli)
    spec = json.loads((run.run_dir / "spec.json").read_text())
    spec.pop("rule", None)
    spec.update(temperature=temperature, reject_threshold=float(exact[chosen]), reject_target=None, tta="none")
    (run.run_dir / "spec.json").write_text(json.dumps(spec))
    promised = evaluate_json(cli, run.run_dir, "--keep-rule")["calibration"]["reject"]
    rows = answered_files(cli, run.run_dir, run.data / "val", extra=("--batch-size", "64"))
    answered = {file for file, row in rows.items() if not row["unknown"]}
    assert table.rows[chosen]["file"] in answered and len(answered) == promised["answered"]


def test_a_tta_other_than_the_rules_is_refused_before_any_work_with_the_fix(run, cli, monkeypatch):
    """A temperature and threshold fitted on plain logits mean something else on averaged ones: on a digits
    run fitted for precision 0.995, `predict --tta flip` answered 42% of validation `unknown`, and the
    answered ones were 96.6% right. Asked for another mode than the rule's, predict, serve and evaluate
    (on a split that fits nothing) refuse in one line that says what to run instead."""
    from inceptionlab.errors import UserError
    from inceptionlab.judge import evaluate as evaluate_module
    from inceptionlab.serve.models import ModelLoadSettings, load_served_model

    evaluate_json(cli, run.run_dir, "--tta", "none", "--reject", "precision=0.9")  # the rule: fitted without TTA
    image = run.data / "val" / "fox" / "fox_1.png"
    refused = cli("predict", "--run", run.run_dir, image, "--tta", "flip")
    assert refused.code == 2 and len(refused.err.strip().splitlines()) == 1
    check_example("calibration-tta-refused", refused.err)
    assert "--tta flip" in refused.err and f"inceptionlab evaluate {run.run_dir} --tta flip" in refused.err
    assert answered_files(cli, run.run_dir, image, extra=("--tta", "none"))  # the rule's own mode is fine
    settings = ModelLoadSettings(backend="eager", precision="fp32", device="cpu", max_batch=2, log=lambda m: None,
                                 tta="flip")
    with pytest.raises(UserError, match="--tta flip"):
        load_served_model(settings, run_dir=run.run_dir, name="tiny")
    scored = []
    real = evaluate_module.run_evaluation
    monkeypatch.setattr(evaluate_module, "run_evaluation", lambda *a, **k: scored.append(1) or real(*a, **k))
    refused = cli("evaluate", run.run_dir, "--split", "train", "--tta", "flip")
    assert refused.code == 2 and "--tta flip" in refused.err and scored == []


def test_tta_measured_but_not_adopted_leaves_the_files_of_the_rule_saved(run, cli, tmp_path, monkeypatch):
    """eval.json, results.csv and logits.npy describe the rule saved in spec.json: when the views are not
    adopted, the plain logits of the same pass (and their figures), not the averaged ones."""
    from inceptionlab.judge import decision

    plain = evaluate_json(cli, run.run_dir, "--tta", "none", "--keep-rule", "--out", tmp_path / "plain")
    monkeypatch.setattr(decision, "TTA_GAIN_STANDARD_ERRORS", float("inf"))  # no gain is enough: never adopted
    report = evaluate_json(cli, run.run_dir, "--tta", "flip-crops")
    assert "not adopted" in report["note"] and report["tta"] == "none"
    assert report["tta_gain"]["nll_with"] != pytest.approx(report["tta_gain"]["nll_without"])  # the views changed the logits
    assert report["top1"] == plain["top1"] and report["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert report["per_class"] == plain["per_class"]
    written = run.run_dir / "eval"
    assert np.array_equal(np.load(written / "logits.npy"), np.load(tmp_path / "plain" / "logits.npy"))
    assert (written / "results.csv").read_text() == (tmp_path / "plain" / "results.csv").read_text()
    assert json.loads((written / "results.json").read_text())["tta"] == "none"
    assert json.loads((written / "eval.json").read_text())["top1"] == plain["top1"]


def shifted_copy(data, into):
    """The run's images with their colour channels rotated: another data set's photos of the same classes,
    which the model mostly gets wrong."""
    from PIL import Image

    for split in ("train", "val"):
        for path in sorted((data / split).rglob("*.png")):
            target = into / path.relative_to(data)
            target.parent.mkdir(parents=True, exist_ok=True)
            pixels = np.asarray(Image.open(path).convert("RGB"))
            Image.fromarray(np.ascontiguousarray(pixels[..., [1, 2, 0]])).save(target)
    return into


def test_other_data_is_scored_under_the_saved_rule_and_never_changes_it(run, cli, tmp_path):
    """`evaluate RUN --data OTHER` where OTHER has a val/ once refitted the temperature and threshold on the
    foreign photos and overwrote RUN/spec.json; with a saved reject target a shifted folder could not be
    scored at all ("no threshold reaches precision ... on validation"). Only the run's own validation
    split fits a rule: other data is scored under the saved one, and the output says so."""
    fitted = evaluate_json(cli, run.run_dir, "--reject", "precision=0.9")
    saved = (run.run_dir / "spec.json").read_bytes()
    other = shifted_copy(run.data, tmp_path / "other")
    result = cli("evaluate", run.run_dir, "--data", other)
    assert result.code == 0, result.err
    assert (run.run_dir / "spec.json").read_bytes() == saved
    assert "decision rule saved" not in result.out and f"the rule saved in {run.run_dir / 'spec.json'}" in result.out
    report = evaluate_json(cli, run.run_dir, "--data", other)
    assert not report["calibration"]["fitted"] and report["rule_saved_to"] is None
    assert report["calibration"]["reject"]["target"] == "as saved"
    assert report["calibration"]["temperature"] == fitted["calibration"]["temperature"]
    assert (run.run_dir / "spec.json").read_bytes() == saved


def test_options_that_cannot_apply_are_refused_before_scoring(run, cli, tmp_path, monkeypatch):
    """`evaluate RUN --data HOLDOUT --reject precision=0.95` scored 500 images for 6 minutes and only then
    said --reject needs the validation split: the options are checked before any image is scored."""
    from inceptionlab.judge import evaluate as evaluate_module

    scored = []
    real = evaluate_module.run_evaluation
    monkeypatch.setattr(evaluate_module, "run_evaluation", lambda *a, **k: scored.append(1) or real(*a, **k))
    refused = cli("evaluate", run.run_dir, "--split", "train", "--reject", "precision=0.9")
    assert refused.code == 2 and "validation split" in refused.err and scored == []
    other = shifted_copy(run.data, tmp_path / "other")
    refused = cli("evaluate", run.run_dir, "--data", other, "--reject", "precision=0.9")
    assert refused.code == 2 and "validation split" in refused.err and scored == []
    refused = cli("evaluate", run.run_dir, "--unknown-images", tmp_path / "missing")
    assert refused.code == 2 and "--unknown-images" in refused.err and scored == []


def test_a_fit_on_few_images_says_how_few_and_what_ece_means_there(run, cli):
    """The temperature fitted on 40 validation images made ECE worse (0.078 -> 0.092) while NLL improved,
    without a word about the sample size. At 18 images ECE over 15 bins is mostly chance: the output says
    how few images the fit rests on and the ECE a perfectly calibrated model would show there by chance."""
    result = cli("evaluate", run.run_dir, "--reject", "precision=0.9")
    assert result.code == 0, result.err
    check_example("calibration-few-images", result.out)
    saved = json.loads((run.run_dir / "eval" / "calibration.json").read_text())
    chance = saved["ece_by_chance"]
    assert 0.03 < chance["mean"] < 0.3 and chance["mean"] < chance["p90"]
    line = next(line for line in result.out.splitlines() if "by chance" in line)
    assert "18 images" in line and "15 bins" in line and f"{chance['mean']:.3f}" in line
    assert "interval" in next(line for line in result.out.splitlines() if line.startswith("unknown below"))


def test_the_calibration_page_lists_what_calibration_json_holds(run, cli):
    from pathlib import Path

    evaluate_json(cli, run.run_dir, "--tta", "flip", "--unknown-images", run.outside)
    keys = set(json.loads((run.run_dir / "eval" / "calibration.json").read_text()))
    page = (Path(__file__).parents[1] / "docs" / "calibration.md").read_text()
    files = page[page.index("## Files"):]
    assert {key for key in keys if f"`{key}`" not in files} == set()


def test_explain_answers_the_rules_class_with_its_calibrated_probability(served):
    """/v1/explain's X-Class-Probability was the raw softmax (0.8547 where /v1/classify said 0.9744 at T 0.60)
    of a top class it chose itself: it is the rule's answer, class and calibrated score, as /v1/classify's."""
    pytest.importorskip("captum", reason="Captum is not installed (the trust extra)")
    from fastapi.testclient import TestClient

    from inceptionlab.cli.serve import _explainers
    from inceptionlab.serve.app import create_app

    run, model = served
    service = _explainers([(model, run.run_dir)], None, "cpu")
    with TestClient(create_app([model], explain=service)) as client:
        for path in [run.data / "val" / "fox" / "fox_1.png", run.outside / "noise_0.png"]:
            classified = client.post("/v1/classify", content=path.read_bytes()).json()["results"][0]
            answer = client.post("/v1/explain", content=path.read_bytes())
            assert answer.status_code == 200
            assert int(answer.headers["x-class-index"]) == classified["topk"][0]["index"]
            assert float(answer.headers["x-class-probability"]) == pytest.approx(classified["score"], abs=1e-5)
            assert answer.headers["x-answer"] == classified["answer"]


@pytest.fixture
def tta_rule(run, cli, monkeypatch):
    """The calibration run with a rule fitted under flip (adopted whatever its gain: any gain is enough
    here) and a threshold answering half of validation."""
    from inceptionlab.judge import decision

    monkeypatch.setattr(decision, "TTA_GAIN_STANDARD_ERRORS", float("-inf"))
    report = evaluate_json(cli, run.run_dir, "--tta", "flip", "--reject", "coverage=0.5")
    assert report["tta"] == "flip", report["note"]
    return run, report


def test_a_rule_with_tta_is_applied_alike_by_predict_http_grpc_and_explain(tta_rule, cli):
    """One rule (flip, its temperature, its threshold) from spec.json in every consumer: predict answers the
    validation images evaluate promised, and /v1/classify, gRPC's `unknown` output and /v1/explain's
    headers give predict's answers and scores."""
    pytest.importorskip("captum", reason="Captum is not installed (the trust extra)")
    tg = pytest.importorskip("tritonclient.grpc")
    from serve_helpers import serve_model, uvicorn_thread

    from inceptionlab.cli.serve import _explainers
    from inceptionlab.serve.app import create_app
    from inceptionlab.serve.service import RequestSettings

    run, report = tta_rule
    files = sorted((run.data / "val").rglob("*.png")) + [run.outside / "noise_0.png", run.outside / "grey_3.png"]
    predicted = answered_files(cli, run.run_dir, *files)
    rows = [predicted[str(f)] for f in files]
    on_validation = rows[:-2]
    assert sum(not r["unknown"] for r in on_validation) == report["calibration"]["reject"]["answered"]
    model = serve_model(run.run_dir)
    assert model.tta == "flip"
    service = _explainers([(model, run.run_dir)], None, "cpu")
    app = create_app([model], RequestSettings(), grpc_address="127.0.0.1:0", explain=service)
    with uvicorn_thread(app) as base, tg.InferenceServerClient(f"127.0.0.1:{app.state.serve.grpc_port}") as client:
        import httpx

        for start in range(0, len(files), model.max_request):  # requests of at most --max-batch images
            chunk, expected = files[start:start + model.max_request], rows[start:start + model.max_request]
            classified = httpx.post(f"{base}/v1/classify", files=[("files", (f.name, f.read_bytes())) for f in chunk],
                                    timeout=60).json()["results"]
            assert [(r["answer"], r["unknown"]) for r in classified] == [(r["answer"], r["unknown"]) for r in expected]
            assert [r["score"] for r in classified] == pytest.approx([r["score"] for r in expected], abs=1e-5)
            tensor = tg.InferInput("image_bytes", [len(chunk), 1], "BYTES")
            tensor.set_data_from_numpy(np.array([f.read_bytes() for f in chunk], dtype=object).reshape(-1, 1))
            answer = client.infer("tiny", [tensor])
            assert answer.as_numpy("unknown").reshape(-1).tolist() == [r["unknown"] for r in expected]
            assert answer.as_numpy("probabilities").max(axis=1) == pytest.approx([r["score"] for r in expected], abs=1e-5)
        for path, row in zip(files[::5], rows[::5]):
            explained = httpx.post(f"{base}/v1/explain", content=path.read_bytes(), timeout=60)
            assert float(explained.headers["x-class-probability"]) == pytest.approx(row["score"], abs=1e-5)
            assert explained.headers["x-answer"] == row["answer"]


def _leading_words(line: str) -> str:
    """A printed line's fixed words: those before the first figure or path ("calibration on", "wrote")."""
    words = []
    for word in line.split():
        if any(c.isdigit() for c in word) or "/" in word:
            break
        words.append(word)
    return " ".join(words)


def _page_block(page: str, command: str) -> list[str]:
    """The lines of the page's first example block that runs `command`."""
    for block in re.findall(r"```\n(.*?)```", page, re.S):
        if block.startswith(f"$ {command}"):
            return block.splitlines()
    raise AssertionError(f"no example of `{command}` on the page")


def test_the_pages_show_what_evaluate_and_predict_print(run, cli):
    """first-steps.md showed evaluate's output without its calibration lines, `decision rule saved to
    .../spec.json` and reliability.png (so a newcomer never learnt that scoring rewrites spec.json), and
    predict --json rows without `answer`, `score`, `unknown` (errors-and-trust.md too): each kind of line
    evaluate prints after its table is on the page, and the pages' JSON rows have predict's keys."""
    from pathlib import Path

    docs = Path(__file__).parents[1] / "docs"
    result = cli("evaluate", run.run_dir)
    assert result.code == 0, result.err
    printed = result.out.splitlines()
    after_table = printed[printed.index(next(line for line in printed if " samples  loss " in line)) + 1:]
    kinds = {_leading_words(line) for line in after_table if line.strip()}
    shown = _page_block((docs / "first-steps.md").read_text(), "inceptionlab evaluate")
    assert {kind for kind in kinds if not any(line.startswith(kind) for line in shown)} == set()
    assert any("reliability.png" in line for line in shown) and any("spec.json" in line for line in shown)
    keys = set(next(iter(answered_files(cli, run.run_dir, run.data / "val" / "fox").values())))
    for page in ("first-steps.md", "errors-and-trust.md"):
        rows = [json.loads(line) for line in (docs / page).read_text().splitlines()
                if line.startswith('{"file"') and '"topk"' in line]
        assert rows and all(set(row) >= keys for row in rows), page
