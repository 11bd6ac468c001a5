"""The error report (judge/error_report.py) and likely label errors (judge/label_errors.py): its numbers on
constructed tables with known answers, planted label errors found with no false positives, and
`inceptionlab report` on a trained run. The page in a real browser: tests/test_report_browser.py."""

from __future__ import annotations

import importlib.util

import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers.page_examples import check_example
from helpers.small_runs import small_run

from inceptionlab.judge.error_report import (ReportSettings, _cells, _matrix, _matrix_classes, confusion_matrix,
                                             most_confused, per_class, render, summarize, write_report)
from inceptionlab.judge.results import read_results, write_results


def _table(tmp_path: Path, true: list[int], pred: list[int], labels: list[str], split: str = "val",
           confidence: float = 4.0) -> "object":
    """A results table whose model answers `pred` (logit `confidence` above the rest)."""
    logits = np.zeros((len(true), len(labels)), np.float32)
    logits[np.arange(len(true)), pred] = confidence
    write_results(tmp_path, logits, np.array(true), files=[""] * len(true), samples=list(range(len(true))),
                  labels=labels, meta={"split": split, "train_split": "train", "model": "m", "run_dir": None})
    return read_results(tmp_path)


def test_per_class_precision_recall_and_confused_pairs_on_a_known_table(tmp_path):
    # a: 4 images, 3 right, 1 called b; b: 2 images, both right; c: 3 images, 1 right, 2 called b
    true = [0, 0, 0, 0, 1, 1, 2, 2, 2]
    pred = [0, 0, 0, 1, 1, 1, 2, 1, 1]
    results = _table(tmp_path, true, pred, ["a", "b", "c"])
    matrix = confusion_matrix(results)
    assert matrix.tolist() == [[3, 1, 0], [0, 2, 0], [0, 2, 1]]
    rows = {r["label"]: r for r in per_class(results, matrix)}
    assert rows["a"] == {"index": 0, "label": "a", "support": 4, "predicted": 3, "precision": 1.0, "recall": 0.75,
                         "f1": pytest.approx(0.8571, abs=1e-4)}
    assert rows["b"]["precision"] == 0.4 and rows["b"]["recall"] == 1.0
    assert rows["c"]["precision"] == 1.0 and rows["c"]["recall"] == pytest.approx(0.3333)
    assert [r["label"] for r in per_class(results, matrix)] == ["c", "a", "b"]  # worst recall first
    pairs = most_confused(results, matrix, limit=5)
    assert [(p["true"], p["pred"], p["count"]) for p in pairs] == [("c", "b", 2), ("a", "b", 1)]
    summary = summarize(results, ReportSettings(top_losses=3), issues=None)
    assert summary["samples"] == 9 and summary["misclassified"] == 3 and summary["top1"] == pytest.approx(6 / 9)
    assert len(summary["top_losses"]) == 3 and {r["row"] for r in summary["top_losses"]} == {3, 7, 8}


def test_a_class_never_predicted_has_no_precision_and_one_never_present_no_recall(tmp_path):
    results = _table(tmp_path, [0, 0, 1], [2, 0, 2], ["a", "b", "c"])
    rows = {r["label"]: r for r in per_class(results, confusion_matrix(results))}
    assert rows["b"]["precision"] is None and rows["b"]["recall"] == 0.0 and rows["b"]["f1"] is None
    assert rows["c"]["recall"] is None and rows["c"]["precision"] == 0.0 and rows["c"]["support"] == 0


def test_a_big_matrix_keeps_the_classes_with_most_errors_and_an_other_column(tmp_path):
    labels = [f"k{i}" for i in range(40)]
    true = [i for i in range(40) for _ in range(3)]
    pred = list(true)
    pred[0] = 39  # k0 -> k39
    pred[3] = 39  # k1 -> k39
    results = _table(tmp_path, true, pred, labels)
    matrix = confusion_matrix(results)
    shown = _matrix_classes(matrix, limit=2)
    assert shown == [0, 39]  # the two with most errors (k39: 2 predicted wrongly, k0: 1; k1 ties k0, later)
    table = _matrix(results, matrix, shown)
    assert table["counts"] == [[2, 1, 0], [0, 3, 0]] and not table["other"] and table["omitted"] == 38
    shown = [1, 2]
    table = _matrix(results, matrix, shown)
    assert table["counts"] == [[2, 0, 1], [0, 3, 0]] and table["other"]  # k1's miss went to k39, outside
    cells = _cells(results, shown, ReportSettings())
    assert cells["1,-1"] == [3] and sorted(cells["1,1"]) == [4, 5] and sorted(cells["2,2"]) == [6, 7, 8]


def test_the_page_cannot_be_broken_out_of_by_a_file_name(tmp_path):
    hostile = '</script><script>document.title="owned"</script>'
    page = render({"title": "t " + hostile, "items": {"0": {"file": hostile}}})
    assert hostile not in page and "<script>document.title" not in page
    payload = re.search(r'<script id="report-data" type="application/json">(.*?)</script>', page, re.S).group(1)
    assert json.loads(payload)["items"]["0"]["file"] == hostile  # \u003c decodes back to <


def _planted_probabilities(n_per_class: int, classes: int, planted: int, seed: int = 0):
    """Held-out probabilities of a good model (p(true) ~ 0.75-0.95), and labels with `planted` flipped."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(classes), n_per_class)
    probs = rng.dirichlet(np.ones(classes), size=len(truth)) * 0.2
    probs[np.arange(len(truth)), truth] += rng.uniform(0.55, 0.75, len(truth))
    probs /= probs.sum(axis=1, keepdims=True)
    given = truth.copy()
    flipped = rng.choice(len(truth), size=planted, replace=False)
    given[flipped] = (truth[flipped] + rng.integers(1, classes, planted)) % classes
    return probs, given, set(flipped.tolist())


def test_planted_label_errors_are_found_and_no_clean_image_is_flagged(tmp_path):
    pytest.importorskip("cleanlab", reason="cleanlab is not installed (the trust extra)")
    from inceptionlab.judge.label_errors import likely_label_errors

    probs, given, flipped = _planted_probabilities(n_per_class=60, classes=5, planted=15)
    write_results(tmp_path, np.log(probs).astype(np.float32), given, files=[""] * len(given),
                  samples=list(range(len(given))), labels=list("abcde"), meta={"split": "val", "train_split": "train"})
    issues = likely_label_errors(read_results(tmp_path))
    found = {issue.row for issue in issues}
    # Confident learning counts an image as mislabelled only where the model's probability for another class
    # clears that class's average confidence: it errs towards missing a planted error (here 12 of 15, the
    # same for any seed tried: 12-15), never towards accusing a clean image.
    assert found <= flipped and len(found) >= 12
    assert all(issue.suggested != issue.given for issue in issues)
    confidences = [issue.self_confidence for issue in issues]
    assert confidences == sorted(confidences)  # most likely first


def test_label_errors_of_a_model_scored_on_some_of_its_classes(tmp_path):
    """A 1000-way model scored on 3 classes: the ranking runs over the classes present."""
    pytest.importorskip("cleanlab", reason="cleanlab is not installed (the trust extra)")
    from inceptionlab.judge.label_errors import likely_label_errors

    probs, given, flipped = _planted_probabilities(n_per_class=40, classes=3, planted=6, seed=1)
    wide = np.full((len(given), 10), 1e-4)
    wide[:, [2, 5, 7]] = probs
    write_results(tmp_path, np.log(wide).astype(np.float32), np.array([2, 5, 7])[given], files=[""] * len(given),
                  samples=list(range(len(given))), labels=[f"c{i}" for i in range(10)],
                  meta={"split": "val", "train_split": "train"})
    issues = likely_label_errors(read_results(tmp_path))
    found = {issue.row for issue in issues}
    assert found <= flipped and len(found) >= 5 and {issue.suggested for issue in issues} <= {2, 5, 7}


def test_a_model_no_better_than_chance_gets_no_label_error_ranking(tmp_path, cli):
    """An early or broken model that answers one class for everything: confident learning would blame the
    labels of nearly every image (cleanlab flagged 17 of 23 such images of a 2-epoch from-scratch run) for
    the model's own errors, so the report says why it ranks none instead."""
    pytest.importorskip("cleanlab", reason="cleanlab is not installed (the trust extra)")
    from inceptionlab.errors import UserError
    from inceptionlab.judge.label_errors import likely_label_errors

    true = [0] * 12 + [1] * 6 + [2] * 3 + [3] * 2
    results = _table(tmp_path, true, [2] * len(true), ["cat", "dog", "fox", "owl"], confidence=30.0)
    with pytest.raises(UserError, match=r"mean per-class recall 0\.250 .*chance \(0\.250 for 4 classes"):
        likely_label_errors(results)
    summary = write_report(results, tmp_path / "r.html", ReportSettings(cam=0))
    assert summary["label_issues"] is None
    assert any(note.startswith("no label-error ranking: ") and "train further" in note for note in summary["notes"])
    printed = cli("report", tmp_path, "--cam", "0")
    assert printed.code == 0, printed.err
    assert "likely label error" not in printed.out and "note: no label-error ranking: " in printed.out
    assert (printed.out + printed.err).count("no label-error ranking") == 1  # said once, not logged as well
    check_example("errors-no-label-errors", printed.out, labels=["cat", "dog", "fox", "owl"])


def test_label_errors_need_recall_clearly_above_chance_on_the_images_there_are(tmp_path):
    """Above chance by less than two standard errors of chance on these counts (0.475 on 12/6/3/2 images
    of 4 classes) is still refused; the planted-error tables above, from good models, pass."""
    pytest.importorskip("cleanlab", reason="cleanlab is not installed (the trust extra)")
    from inceptionlab.errors import UserError
    from inceptionlab.judge.label_errors import likely_label_errors

    true = [0] * 12 + [1] * 6 + [2] * 3 + [3] * 2
    pred = [0] * 6 + [2] * 6 + [1] * 3 + [2] * 3 + [0, 0, 2] + [0, 0]  # recalls 0.5, 0.5, 0.333, 0.0
    with pytest.raises(UserError, match=r"mean per-class recall 0\.333 .*needs more than 0\.475"):
        likely_label_errors(_table(tmp_path, true, pred, ["cat", "dog", "fox", "owl"]))


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """The small run (2 planted label errors in val/), copied and evaluated."""
    from inceptionlab.cli.app import main

    run = small_run(tmp_path_factory).copy(tmp_path_factory.mktemp("report"))
    with pytest.raises(SystemExit) as done:
        main(["evaluate", str(run.run_dir), "--json"])
    assert done.value.code in (0, None)
    return run


def test_report_json_lists_the_planted_label_errors_and_writes_a_self_contained_page(evaluated_run, cli):
    pytest.importorskip("cleanlab", reason="cleanlab is not installed (the trust extra)")
    result = cli("report", evaluated_run.run_dir, "--json", "--cam", "0")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["samples"] == 18 and summary["misclassified"] == 2 and summary["held_out"]
    assert {Path(i["file"]) for i in summary["label_issues"]} == {p.absolute() for p in evaluated_run.planted}
    assert {(i["given"], i["suggested"]) for i in summary["label_issues"]} == {("dog", "cat"), ("cat", "fox")}
    assert {(p["true"], p["pred"], p["count"]) for p in summary["most_confused"]} == {("cat", "fox", 1), ("dog", "cat", 1)}
    page = Path(summary["report"])
    assert page == evaluated_run.run_dir / "eval" / "report.html"
    text = page.read_text()
    sources = re.findall(r'src="([^"]*)"', text)
    assert not sources and "http://" not in text and "https://" not in text  # nothing to fetch: images are inline
    assert text.count("data:image/jpeg;base64,") == 18  # every image once (all 18 are in some gallery)
    assert page.stat().st_size < 200_000
    if importlib.util.find_spec("captum") is not None:  # the overlays: the trust extra
        printed = cli("report", evaluated_run.run_dir, "--cam", "1", "--gallery", "1")
        assert printed.code == 0, printed.err
        check_example("errors-report", printed.out, labels=["cat", "dog", "fox"])


def test_report_on_a_run_never_evaluated_says_what_to_run(tmp_path, cli):
    result = cli("report", tmp_path)
    assert result.code == 2 and "run `inceptionlab evaluate" in result.err  # a UserError's exit status


def test_a_table_of_the_training_split_is_flagged(tmp_path):
    results = _table(tmp_path, [0, 1], [0, 1], ["a", "b"], split="train")
    summary = write_report(results, tmp_path / "r.html", ReportSettings(cam=0, label_issues=0))
    assert not summary["held_out"] and any("training split" in note for note in summary["notes"])
    assert summary["label_issues"] is None


def test_an_in_memory_split_gets_thumbnails_and_overlays_from_its_pixels(cifar_root, tmp_path, cli):
    """CIFAR-10's test batch has no files: the page shows the split's own pixels, and Grad-CAM runs on them."""
    pytest.importorskip("captum", reason="Captum is not installed (the trust extra)")
    trained = cli("train", "cifar10/small_cnn", "--data", cifar_root, "--out", tmp_path / "runs", "--no-progress",
                  "--json", "--set", "train.epochs=1")
    assert trained.code == 0, trained.err
    run = Path(json.loads(trained.out.strip().splitlines()[-1])["run_dir"])
    assert cli("evaluate", run).code == 0
    result = cli("report", run, "--json", "--cam", "3", "--label-issues", "0", "--device", "cpu")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    # evaluate scores the run's validation split: 10% of the 150 training images, held out in memory
    assert summary["samples"] == 15 and summary["top_losses"][0]["file"] == ""
    text = Path(summary["report"]).read_text()
    data = json.loads(re.search(r'<script id="report-data" type="application/json">(.*?)</script>', text, re.S).group(1))
    items = data["items"].values()
    assert items and all(item["thumb"].startswith("data:image/jpeg;base64,") for item in items)
    assert sum(item["cam"] is not None for item in items) == min(3, data["misclassified_total"])
    assert all(item["name"].startswith("sample ") for item in items)


def one_folder_run(run, into: Path) -> Path:
    """The small run as if trained on one folder of class folders (no train/ or val/): every image in
    ONE/<class>/, and the split training made recorded in the run's splits.csv."""
    import shutil

    import yaml

    one = into / "one_folder"
    lines = ["file,label,split"]
    for path in sorted(run.data.rglob("*.png")):
        split, label = path.relative_to(run.data).parts[:2]
        target = one / label / f"{split}_{path.name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
        lines.append(f"{target.relative_to(one)},{label},{split}")
    (run.run_dir / "splits.csv").write_text("\n".join(lines) + "\n")
    recipe = yaml.safe_load((run.run_dir / "recipe.resolved.yaml").read_text())
    recipe["data"]["root"] = str(one)
    (run.run_dir / "recipe.resolved.yaml").write_text(yaml.safe_dump(recipe))
    return one


def test_every_image_of_one_folder_data_is_not_held_out(tmp_path, tmp_path_factory, cli):
    """`evaluate RUN --split all` on a run's own one-folder data scores its training images too: the table
    is not held out, and the report says so instead of ranking training images as held-out label errors."""
    run = small_run(tmp_path_factory).copy(tmp_path)
    one_folder_run(run, tmp_path)
    assert cli("evaluate", run.run_dir, "--json").code == 0  # its recorded validation split: held out
    summary = json.loads(cli("report", run.run_dir, "--json", "--cam", "0", "--label-issues", "0").out)
    assert summary["samples"] == 18 and summary["held_out"] is True
    result = cli("evaluate", run.run_dir, "--split", "all", "--keep-rule", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["samples"] == 48
    summary = json.loads(cli("report", run.run_dir, "--json", "--cam", "0", "--label-issues", "0").out)
    assert summary["held_out"] is False and any("trained on" in note for note in summary["notes"])
    assert json.loads((run.run_dir / "eval" / "results.json").read_text())["held_out"] is False


def test_other_data_holding_training_images_is_not_held_out(tmp_path, tmp_path_factory, cli):
    """--data of a folder that holds the run's training files (here its train/ itself, read whole as other
    data) scores images the model trained on: not held out, whatever the folder is called."""
    run = small_run(tmp_path_factory).copy(tmp_path)
    result = cli("evaluate", run.run_dir, "--data", run.data / "train", "--out", tmp_path / "eval", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["samples"] == 30
    assert json.loads((tmp_path / "eval" / "results.json").read_text())["held_out"] is False
    result = cli("evaluate", run.run_dir, "--data", run.data / "val", "--out", tmp_path / "val", "--json")
    assert result.code == 0, result.err
    assert json.loads((tmp_path / "val" / "results.json").read_text())["held_out"] is True
