"""The guide's smaller case studies on the same engine: CIFAR-10, Fashion-MNIST, IMDB.

Each runs on small data in the original formats written by the tests (conftest.py); Fashion-MNIST's
accuracy is checked on the real files too, where ../shared/data has them.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import ONE_THREAD, shared_data
from PIL import Image

from inceptionlab.cli.app import main
from inceptionlab.config import load_recipe
from inceptionlab.engine.fit import fit


def run_summary(cli, *args):
    result = cli("train", *args, "--no-progress", "--json")
    assert result.code == 0, result.err
    summary = json.loads(result.out.strip().splitlines()[-1])
    return summary, Path(summary["run_dir"])


# --- CIFAR-10 -------------------------------------------------------------------------------------


def test_cifar10_recipe_reports_per_class_accuracy_and_round_trips(cifar_root, tmp_path, cli):
    summary, run = run_summary(cli, "cifar10/small_cnn", "--data", cifar_root, "--out", tmp_path / "runs",
                               "--set", "train.epochs=1")
    assert len(summary["last"]["per_class"]) == 10 and "airplane" in summary["last"]["per_class"]
    assert (run / "plots" / "samples.png").is_file()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # 150 training images: 15 held out for validation, 135 trained on in full batches of 4 (132)
    assert rows[0]["samples"] == 132 and rows[0]["val_samples"] == 15 and summary["test"]["samples"] == 50
    # Saved, loaded, same predictions: evaluating model.pt reproduces the training run's numbers.
    evaluated = cli("evaluate", run, "--json")
    assert evaluated.code == 0, evaluated.err
    report = json.loads(evaluated.out)
    assert report["top1"] == pytest.approx(summary["last"]["top1"])
    assert report["loss"] == pytest.approx(summary["last"]["loss"], rel=1e-5)
    png = tmp_path / "one.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(png)
    predicted = cli("predict", "--run", run, png, "--json")
    assert predicted.code == 0 and json.loads(predicted.out)["topk"][0]["label"] in summary["test"]["per_class"]


def test_cifar10_guide_values():
    r = load_recipe("cifar10/small_cnn")
    assert (r.optim.name, r.optim.lr, r.optim.momentum, r.train.batch_size, r.train.epochs) == ("sgd", 0.001, 0.9, 4, 2)
    assert r.data.mean == [0.5] * 3 and r.data.std == [0.5] * 3  # to [-1, 1]
    model = __import__("inceptionlab.models.registry", fromlist=["x"]).build_model("cifar10_cnn", 10).model
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes == [(6, 3, 5, 5), (6,), (16, 6, 5, 5), (16,), (120, 400), (120,), (84, 120), (84,), (10, 84), (10,)]


# --- Fashion-MNIST ---------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["written", "real"])
def test_fashion_mnist_recipe_learns_and_predicts_a_single_image(source, fashion_root, tmp_path, cli):
    data = fashion_root if source == "written" else shared_data("fashion-mnist")
    summary, run = run_summary(cli, "fashion_mnist/mlp", "--data", data, "--out", tmp_path / "runs",
                               "--set", "train.epochs=1", "--set", "data.max_train_samples=6000",
                               "--set", "data.max_val_samples=2000")
    assert summary["last"]["top1"] > 0.7  # chance is 0.1
    assert (run / "plots" / "predictions.png").is_file() and (run / "plots" / "samples.png").is_file()
    with gzip.open(data / "t10k-images-idx3-ubyte.gz") as f:
        first = np.frombuffer(f.read(), np.uint8, offset=16)[: 28 * 28].reshape(28, 28)
    png = tmp_path / "boot.png"
    Image.fromarray(first).save(png)
    predicted = cli("predict", "--run", run, png, "--json")
    assert predicted.code == 0, predicted.err
    row = json.loads(predicted.out)
    assert len(row["topk"]) == 5 and row["topk"][0]["label"] == "Ankle boot"  # test image 0 is an ankle boot


def test_resident_and_worker_loaders_train_identically(fashion_root, tmp_path):
    data = fashion_root
    outcomes = []
    for mode in ("resident", "workers"):
        recipe = load_recipe("fashion_mnist/mlp", [f"data.root={data}", f"data.loader={mode}", "data.num_workers=0",
                                                   "train.epochs=1", "data.max_train_samples=640",
                                                   "data.max_val_samples=100",
                                                   ONE_THREAD])
        outcomes.append(fit(recipe, tmp_path / mode, progress=False))
    a, b = (torch.load(o.run_dir / "model.pt", weights_only=True) for o in outcomes)
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- IMDB ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def imdb_run(imdb_root, tmp_path_factory):
    """An IMDB run made by the `train` command, which also writes the text export after training."""
    data = imdb_root
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main(["train", "imdb/text_classifier", "--data", str(data), "--set", "train.epochs=3",
              "--out", str(tmp_path_factory.mktemp("imdb")), "--no-progress", "--json"])
    assert exit_info.value.code in (0, None)
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    return SimpleNamespace(run_dir=Path(summary["run_dir"]), summary=summary, data=data)


def test_imdb_run_has_vocabulary_test_score_and_curves(imdb_run):
    run = imdb_run.run_dir
    spec = json.loads((run / "spec.json").read_text())
    assert spec["input_kind"] == "tokens" and spec["tokenizer"] == "tokenizer.json" and spec["task"] == "binary"
    assert (run / "tokenizer.json").is_file()
    summary = imdb_run.summary
    assert {"loss", "top1"} <= set(summary["test"]) and set(summary["test"]["per_class"]) == {"neg", "pos"}
    assert "top5" not in summary["last"]  # meaningless for two classes
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_reviews = sum(1 for label in ("neg", "pos") for _ in (imdb_run.data / "aclImdb" / "train" / label).glob("*.txt"))
    assert rows[0]["val_samples"] == round(train_reviews * 0.2)  # 80/20 of the train split
    trained = train_reviews - rows[0]["val_samples"]
    assert rows[0]["samples"] == trained - trained % 32  # full batches of 32 only
    assert (run / "plots" / "loss.png").is_file() and (run / "plots" / "accuracy.png").is_file()


def test_predict_raw_strings_json(imdb_run, tmp_path, cli):
    reviews = tmp_path / "reviews.txt"
    reviews.write_text("An awful, boring waste of time.\n\nA wonderful film, I loved it!\n")
    result = cli("predict", "--run", imdb_run.run_dir, "--text", "The movie was great!", "--text-file", reviews, "--json")
    assert result.code == 0, result.err
    rows = [json.loads(line) for line in result.out.strip().splitlines()]
    assert [r["text"] for r in rows] == ["The movie was great!", "An awful, boring waste of time.",
                                         "A wonderful film, I loved it!"]
    for row in rows:
        assert set(row) == {"text", "answer", "score", "unknown", "label", "probability"} and 0 <= row["probability"] <= 1
        assert row["answer"] == row["label"] and not row["unknown"]  # a run never evaluated: no threshold
        assert row["label"] == ("pos" if row["probability"] > 0.5 else "neg")


def test_exported_text_model_runs_without_this_package(imdb_run, tmp_path):
    export = imdb_run.run_dir / "exports" / "text"
    copy = tmp_path / "standalone"
    shutil.copytree(export, copy)
    proc = subprocess.run([sys.executable, "-I", str(copy / "classify.py"), "great acting, a joy", "dull"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    from inceptionlab.infer.text import TextPredictor

    ours = list(TextPredictor.from_run(imdb_run.run_dir, torch.device("cpu")).predict(["great acting, a joy", "dull"]))
    assert [r["probability"] for r in rows] == pytest.approx([r["probability"] for r in ours], abs=1e-5)


def test_image_files_to_a_text_run_is_a_clear_error(imdb_run, tmp_path, cli):
    png = tmp_path / "x.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(png)
    result = cli("predict", "--run", imdb_run.run_dir, png)
    assert result.code == 2 and "--text" in result.err


def test_evaluate_text_run_on_its_test_split(imdb_run, cli):
    result = cli("evaluate", imdb_run.run_dir, "--split", "test", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert set(report["per_class"]) == {"neg", "pos"} and "top5" not in report
    assert report["top1"] == pytest.approx(imdb_run.summary["test"]["top1"])  # same model, same vocabulary


@pytest.mark.parametrize("split", ["val", "test", "train"])
def test_evaluate_reads_only_the_split_it_scores(imdb_run, split, monkeypatch):
    """Same metrics as building the whole split pair (old path), from fewer reviews read."""
    from pathlib import Path

    from inceptionlab.data import readers
    from inceptionlab.data.datasets import imdb
    from inceptionlab.judge.evaluate import evaluate_run, run_evaluation
    from inceptionlab.models.registry import load_run_model

    reads = []
    real_decode = imdb.decode
    monkeypatch.setattr(imdb, "decode", lambda data: reads.append(1) or real_decode(data))
    one = evaluate_run(imdb_run.run_dir, None, split, device=torch.device("cpu"), batch_size=64, num_workers=0)
    one_split_reads = len(reads)

    reads.clear()
    model, spec = load_run_model(imdb_run.run_dir)
    recipe = load_recipe(Path(imdb_run.run_dir) / "recipe.resolved.yaml",
                         [f"data.text.tokenizer={Path(imdb_run.run_dir) / spec.tokenizer}"])
    pair = readers.read_imdb(recipe.data)
    whole = run_evaluation(model, spec, {"train": pair.train, "val": pair.val, "test": pair.test}[split],
                           device=torch.device("cpu"), batch_size=64, num_workers=0)

    root = imdb_run.data / "aclImdb"
    on_disk = {s: sum(1 for label in ("neg", "pos") for _ in (root / s / label).glob("*.txt")) for s in ("train", "test")}
    assert len(reads) == on_disk["train"] + on_disk["test"]  # the pair reads both folders
    assert one_split_reads == on_disk["test" if split == "test" else "train"]
    assert one.result["samples"] == whole["samples"] == len({"train": pair.train, "val": pair.val,
                                                             "test": pair.test}[split])
    assert one.result["loss"] == pytest.approx(whole["loss"], rel=1e-6)
    assert one.result["top1"] == whole["top1"]
    assert torch.equal(one.result["confusion"], whole["confusion"])
