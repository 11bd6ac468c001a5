"""The kNN unknown detector (models/knn.py): its distance, its fit in evaluate, and the rule's answers with it
in predict, serve and the results table; a run without a bank answers as before."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.calibration_run import calibration_run, evaluate_json, spec_of

from inceptionlab.judge.unknown import UnknownTarget, auroc, energy_score, fpr_at
from inceptionlab.models.knn import FAR, KnnRule, kth_distance, normalised
from inceptionlab.models.rule import UNSURE, DecisionRule


@pytest.fixture
def run(tmp_path_factory, tmp_path):
    return calibration_run(tmp_path_factory).copy(tmp_path)


# --------------------------------------------------------------------------- the score


def brute_force_kth(queries: np.ndarray, bank: np.ndarray, k: int) -> np.ndarray:
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    b = bank / np.linalg.norm(bank, axis=1, keepdims=True)
    distances = np.sqrt(((q[:, None, :] - b[None, :, :]) ** 2).sum(-1))
    return np.sort(distances, axis=1)[:, k - 1]


@pytest.mark.parametrize("k", [1, 5, 40])
def test_kth_distance_matches_brute_force(k, monkeypatch):
    rng = np.random.default_rng(k)
    bank, queries = rng.normal(size=(40, 16)), rng.normal(size=(7, 16)) * 3
    monkeypatch.setattr("inceptionlab.models.knn.QUERY_CHUNK", 3)  # several chunks of queries
    got = kth_distance(queries, normalised(bank), k)
    np.testing.assert_allclose(got, brute_force_kth(queries, bank, k), atol=1e-5)


def test_auroc_and_fpr_match_sklearn():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    inside, outside = rng.normal(1, 1, 200), rng.normal(0, 1, 150)
    inside[:10] = outside[:10]  # ties count half
    truth = np.r_[np.ones(200), np.zeros(150)]
    assert auroc(inside, outside) == pytest.approx(metrics.roc_auc_score(truth, np.r_[inside, outside]), abs=1e-12)
    # FPR95: the ROC curve's false-positive rate at the first threshold reaching 95% true positives
    fpr, tpr, _ = metrics.roc_curve(truth, np.r_[inside, outside], drop_intermediate=False)
    assert fpr_at(inside, outside) == pytest.approx(fpr[np.flatnonzero(tpr >= 0.95)[0]], abs=1e-12)


def test_energy_is_logsumexp_of_the_logits():
    logits = np.array([[1.0, 2.0, 3.0], [100.0, 0.0, 0.0]])
    np.testing.assert_allclose(energy_score(logits), np.log(np.exp(logits).sum(1)))


def test_unknown_target_is_a_coverage():
    assert UnknownTarget.parse("coverage=95%").coverage == 0.95
    with pytest.raises(Exception, match="coverage=C"):
        UnknownTarget.parse("precision=0.9")


def test_the_rule_says_far_before_unsure_and_keeps_its_bank_beside_spec_json(tmp_path):
    from inceptionlab.models.knn import save_bank

    bank = np.eye(4, 8)  # four training features, unit axes
    knn = save_bank(bank, tmp_path, images=4, sampled="all", layer="fc", k=1, threshold=0.5, target="coverage=0.95")
    rule = DecisionRule(threshold=0.9, knn=knn)
    logits = np.array([[5.0, 0.0], [0.1, 0.0], [5.0, 0.0]])
    features = np.array([np.eye(8)[0] * 3, np.eye(8)[1], np.eye(8)[7]])  # near, near (unsure), far
    answers = rule.decide(logits, features)
    assert answers.unknown.tolist() == [False, True, True]
    assert answers.reason == (None, UNSURE, FAR)
    assert answers.distance[0] == pytest.approx(0.0, abs=1e-6) and answers.distance[2] == pytest.approx(np.sqrt(2))
    assert rule.softmax_only().decide(logits).unknown.tolist() == [False, True, False]
    with pytest.raises(ValueError, match="features"):
        rule.decide(logits)
    # spec.json round trip: the bank's description is saved, its home is where spec.json lies
    back = DecisionRule.from_dict(json.loads(json.dumps(rule.to_dict())))
    assert "home" not in rule.to_dict()["knn"] and back.knn.home is None
    assert back.located(tmp_path).decide(logits, features).reason == answers.reason
    assert isinstance(back.knn, KnnRule) and back.knn.bytes == 4 * 4 * 8
    # what an export's runtime gets is said in its configuration parameters (Triton's config, serve's)
    params = dict(rule.parameters())
    assert float(params["knn_threshold"]) == 0.5 and "softmax rule only" in params["knn_without_bank"]
    assert "knn_without_bank" not in dict(rule.softmax_only().parameters())


def test_a_feature_far_longer_or_shorter_than_any_seen_is_far_whatever_its_direction(tmp_path):
    """L2 normalisation keeps only a feature's direction: the demo digits model maps noise to features ~200x
    longer than a digit's, pointing where the 6s do, and every noise image was answered (FPR95 1.00). A
    feature whose length lies well outside the training and validation features' lengths is as far as a
    unit vector can be (distance 2); one within keeps its distance. A rule saved before the bound answers as
    it did."""
    from inceptionlab.judge.unknown import Bank, fit_knn

    rng = np.random.default_rng(0)
    train = rng.normal(size=(60, 8)) ** 2 + 0.1  # post-ReLU-like: positive, lengths ~2-5
    val = rng.normal(size=(20, 8)) ** 2 + 0.1
    knn = fit_knn(Bank(torch.from_numpy(train).float(), 60, "all", None, False), val, UnknownTarget.parse("coverage=0.95"),
                  "fc", tmp_path, classes=3)
    queries = np.stack([train[0] * 100, train[0] / 100, train[0] * 1.1])
    distance = knn.distances(queries)
    assert distance[:2].tolist() == [2.0, 2.0] and distance[2] == pytest.approx(0.0, abs=1e-3)
    assert knn.far(distance).tolist() == [True, True, False]
    assert not knn.far(knn.distances(np.concatenate([train, val]))).all()
    back = KnnRule(**json.loads(json.dumps(knn.to_dict()))).located(tmp_path)
    assert back.distances(queries).tolist() == distance.tolist()
    saved_before = {key: value for key, value in knn.to_dict().items() if key != "norm_range"}
    assert KnnRule(**saved_before).located(tmp_path).distances(queries)[0] == pytest.approx(0.0, abs=1e-3)


# --------------------------------------------------------------------------- evaluate, predict


def test_evaluate_fits_the_knn_rule_and_compares_the_scores(run, cli):
    report = evaluate_json(cli, run.run_dir, "--unknown", "coverage=0.9", "--unknown-images", run.outside)
    spec = spec_of(run)
    knn = spec.rule.knn
    assert knn is not None and knn.target == "coverage=0.9" and (run.run_dir / knn.file).is_file()
    assert knn.rows == 30 and knn.images == 30 and knn.sampled == "all"  # 3 classes x 10 training squares
    saved = json.loads((run.run_dir / "spec.json").read_text())["rule"]["knn"]
    assert saved["threshold"] == pytest.approx(knn.threshold) and "home" not in saved
    outside = report["outside_images"]
    assert set(outside["scores"]) == {"knn", "energy", "max_softmax"}
    for row in outside["scores"].values():
        assert 0 <= row["fpr95"] <= 1 and 0 <= row["auroc"] <= 1
    assert outside["scores"]["knn"]["auroc"] > 0.9
    # the table says which rows the rule answers unknown and why
    table = (run.run_dir / "eval" / "results.csv").read_text().splitlines()
    assert table[0].endswith("unknown,reason,knn_distance")
    eval_json = json.loads((run.run_dir / "eval" / "eval.json").read_text())
    assert "knn" in eval_json["outside_images"]["scores"]


def test_predict_answers_far_images_unknown_with_the_reason(run, cli):
    evaluate_json(cli, run.run_dir, "--unknown", "coverage=0.9")
    result = cli("predict", "--run", run.run_dir, run.outside, "--json")
    assert result.code == 0, result.err
    rows = [json.loads(line) for line in result.out.splitlines() if line.startswith("{")]
    assert rows and all("knn_distance" in r for r in rows)
    far = [r for r in rows if r.get("reason") == FAR]
    assert len(far) >= len(rows) // 2 and all(r["answer"] == "unknown" for r in far)


def test_a_run_without_a_bank_answers_as_before(run, cli):
    before = cli("predict", "--run", run.run_dir, run.outside, "--json")
    report = evaluate_json(cli, run.run_dir, "--unknown-images", run.outside)
    assert spec_of(run).rule.knn is None and "knn" not in report["outside_images"]["scores"]
    assert not (run.run_dir / "feature_bank.npy").exists() and "unknown_detector" not in report
    after = cli("predict", "--run", run.run_dir, run.outside, "--json")
    rows_before = [json.loads(x) for x in before.out.splitlines()]
    rows_after = [json.loads(x) for x in after.out.splitlines()]
    # a temperature changes no top class; without a threshold nothing is unknown; rows keep their keys
    assert [r["answer"] for r in rows_before] == [r["answer"] for r in rows_after]
    assert [set(r) for r in rows_before] == [set(r) for r in rows_after] == [{"file", "answer", "score", "unknown",
                                                                             "topk"}] * len(rows_after)
    table = (run.run_dir / "eval" / "results.csv").read_text().splitlines()[0]
    assert "knn_distance" not in table and "reason" not in table


# --------------------------------------------------------------------------- combinations


@pytest.fixture(scope="module")
def knn_run(tmp_path_factory):
    """The run with a softmax threshold and a kNN detector fitted together, once for the tests that only
    read it (serve, gRPC, explain, the report)."""
    from inceptionlab.cli.app import main

    run = calibration_run(tmp_path_factory).copy(tmp_path_factory.mktemp("knn_run"))
    try:
        main(["evaluate", str(run.run_dir), "--reject", "precision=0.9", "--unknown", "coverage=0.9", "--json"])
    except SystemExit as exc:
        assert not exc.code, f"evaluate failed: {exc.code}"
    assert spec_of(run).rule.knn is not None
    return run


def test_serve_http_answers_like_predict_with_the_reason_and_distance(knn_run):
    from fastapi.testclient import TestClient
    from serve_helpers import serve_model

    from inceptionlab.infer.predict import Predictor
    from inceptionlab.models.registry import load_run_model
    from inceptionlab.serve.app import create_app

    run = knn_run
    spec = spec_of(run)
    files = [run.outside / "noise_0.png", run.outside / "grey_3.png", run.data / "val" / "fox" / "fox_1.png"]
    net, _ = load_run_model(run.run_dir)
    expected = list(Predictor(net, spec, torch.device("cpu")).predict_files(files, topk=3))
    model = serve_model(run.run_dir)
    with TestClient(create_app([model])) as client:
        meta = client.get("/v2/models/tiny").json()
        assert {"name": "knn_distance", "datatype": "FP32", "shape": [-1, 1]} in meta["outputs"]
        params = client.get("/v2/models/tiny/config").json()["parameters"]
        assert float(params["knn_threshold"]["string_value"]) == spec.rule.knn.threshold
        classified = client.post("/v1/classify", files=[("files", (f.name, f.read_bytes())) for f in files]).json()
        got = [(r["answer"], r["reason"], r["knn_distance"]) for r in classified["results"]]
        assert got == [(e["answer"], e["reason"], pytest.approx(e["knn_distance"], abs=1e-4)) for e in expected]
        body = {"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [3, 1],
                            "data": [{"b64": __import__("base64").b64encode(f.read_bytes()).decode()} for f in files]}]}
        outputs = {o["name"]: o for o in client.post("/v2/models/tiny/infer", json=body).json()["outputs"]}
        assert outputs["unknown"]["data"] == [e["unknown"] for e in expected]
        assert outputs["knn_distance"]["data"] == pytest.approx([e["knn_distance"] for e in expected], abs=1e-4)
    assert any(e["reason"] == FAR for e in expected)


@pytest.mark.slow  # an ONNX export with its parity check: ~17 s on 2 busy cores
def test_serve_on_an_exported_graph_answers_by_the_softmax_rule(knn_run):
    pytest.importorskip("onnxruntime")
    from serve_helpers import serve_model

    model = serve_model(knn_run.run_dir, backend="onnxruntime")
    assert model.feature_dim == 0 and model.rule.knn is None and model.rule.threshold == spec_of(knn_run).rule.threshold
    assert "knn_distance" not in model.outputs
    sidecar = json.loads((knn_run.run_dir / "exports" / "model.onnx.json").read_text())
    assert "softmax rule only" in sidecar["decision_rule"]["knn_detector"]
    assert "kNN" not in sidecar["decision_rule"]["applied_by_the_export"]


def test_knn_rule_under_tta_averages_the_views_features(run, cli):
    from inceptionlab.infer.predict import Predictor
    from inceptionlab.models.registry import load_run_model
    from inceptionlab.models.tta import iter_views

    report = evaluate_json(cli, run.run_dir, "--tta", "flip", "--unknown", "coverage=0.9")
    spec = spec_of(run)
    assert spec.rule.knn is not None and spec.rule.tta == report["rule"]["tta"]
    net, _ = load_run_model(run.run_dir)
    predictor = Predictor(net, spec, torch.device("cpu"), tta=spec.rule.tta)
    files = [run.outside / "noise_1.png", run.data / "val" / "dog" / "dog_1.png"]
    rows = list(predictor.predict_files(files))
    # by hand: the features of each view, averaged, against the bank
    batch = torch.stack([predictor._load(f) for f in files])
    from inceptionlab.models.penultimate import captured, head_name

    with torch.no_grad(), captured(net.get_submodule(head_name(net, 3))) as taken:
        for view in iter_views(predictor.normalize(batch), spec.rule.tta):
            net(view)
    want = spec.rule.knn.distances(torch.stack(taken).mean(0))
    assert [r["knn_distance"] for r in rows] == pytest.approx(want.tolist(), abs=1e-5)
    if spec.rule.tta != "none":  # the fitted rule refuses another mode, the kNN rule with it
        with pytest.raises(Exception, match="--tta"):
            Predictor(net, spec, torch.device("cpu"), tta="none")


def test_knn_combines_with_temperature_and_reject_threshold(run, cli):
    evaluate_json(cli, run.run_dir, "--reject", "precision=0.9", "--unknown", "coverage=0.9")
    knn_run = run
    spec = spec_of(knn_run)
    rule = spec.rule
    assert rule.threshold is not None and rule.temperature != 1.0 and rule.knn is not None
    # refitting without options keeps both targets; --unknown none drops the detector alone
    evaluate_json(cli, knn_run.run_dir)
    again = spec_of(knn_run).rule
    assert again.target == rule.target and again.knn.target == rule.knn.target
    evaluate_json(cli, knn_run.run_dir, "--unknown", "none")
    dropped = spec_of(knn_run).rule
    assert dropped.knn is None and dropped.target == rule.target
    # each reason comes from its own score: unsure images are within the distance, far ones beyond it
    table = [line.split(",") for line in (knn_run.run_dir / "eval" / "results.csv").read_text().splitlines()]
    assert "knn_distance" not in table[0]


def test_unknown_is_refused_where_nothing_is_fitted(run, cli):
    result = cli("evaluate", run.run_dir, "--split", "train", "--unknown", "coverage=0.9")
    assert result.code != 0 and "--unknown" in result.err and "validation" in result.err


def test_the_error_report_lists_the_images_answered_unknown_with_the_reason(knn_run, cli):
    from inceptionlab.judge.error_report import ReportSettings, summarize
    from inceptionlab.judge.results import read_results

    results = read_results(knn_run.run_dir)
    summary = summarize(results, ReportSettings(), None)
    unknown = summary["unknown"]
    flagged = [r for r in results.rows if r["unknown"]]
    assert unknown["total"] == len(flagged) and sum(unknown["reasons"].values()) == len(flagged)
    assert set(unknown["reasons"]) <= {FAR, UNSURE}
    result = cli("report", knn_run.run_dir)
    assert result.code == 0, result.err
    page = (knn_run.run_dir / "eval" / "report.html").read_text()
    assert 'id="unknown"' in page and '"unknown": {"total"' in page.replace('"unknown":{"total"', '"unknown": {"total"')


def test_explain_answers_by_the_knn_rule_with_the_reason(knn_run):
    pytest.importorskip("captum", reason="Captum is not installed (the trust extra)")
    from fastapi.testclient import TestClient
    from serve_helpers import serve_model

    from inceptionlab.cli.serve import _explainers
    from inceptionlab.serve.app import create_app

    model = serve_model(knn_run.run_dir)
    service = _explainers([(model, knn_run.run_dir)], None, "cpu")
    with TestClient(create_app([model], explain=service)) as client:
        for path in [knn_run.data / "val" / "fox" / "fox_1.png", knn_run.outside / "noise_0.png"]:
            classified = client.post("/v1/classify", content=path.read_bytes()).json()["results"][0]
            answer = client.post("/v1/explain", content=path.read_bytes())
            assert answer.status_code == 200 and answer.headers["x-answer"] == classified["answer"]
            assert answer.headers["x-unknown-reason"] == (classified["reason"] or "")
            assert float(answer.headers["x-knn-distance"]) == pytest.approx(classified["knn_distance"], abs=1e-5)


def test_grpc_answers_unknown_and_the_distance_like_http(knn_run):
    tg = pytest.importorskip("tritonclient.grpc")
    from serve_helpers import serve_model
    from test_serve_grpc import bytes_input, grpc_server

    files = [knn_run.outside / "noise_0.png", knn_run.data / "val" / "fox" / "fox_1.png"]
    model = serve_model(knn_run.run_dir)
    with grpc_server([model]) as (base, address, _state), tg.InferenceServerClient(address) as client:
        meta = client.get_model_metadata("tiny", as_json=True)
        assert {"name": "knn_distance", "datatype": "FP32", "shape": ["-1", "1"]} in meta["outputs"]
        result = client.infer("tiny", [bytes_input("image_bytes", [f.read_bytes() for f in files], [2, 1])])
        import httpx

        classified = httpx.post(f"{base}/v1/classify", files=[("files", (f.name, f.read_bytes())) for f in files],
                                timeout=30).json()["results"]
    assert result.as_numpy("unknown").reshape(-1).tolist() == [r["unknown"] for r in classified]
    assert result.as_numpy("knn_distance").reshape(-1) == pytest.approx([r["knn_distance"] for r in classified], abs=1e-5)
