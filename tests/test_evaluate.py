"""`inceptionlab evaluate` on runs and on pretrained models, and training on tiny-imagenet files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torchvision
import yaml
from conftest import shared_data
from helpers.datasets import write_tiny_imagenet
from helpers.small_runs import copy_run_dir

from inceptionlab.data.datasets.tiny_imagenet import prepare_tiny_imagenet
from inceptionlab.models.registry import cached_weights_file
from helpers.page_examples import check_example


@pytest.fixture(scope="module")
def run_and_data(squares_run):
    return squares_run.run_dir, squares_run.data


def test_evaluate_json_has_the_promised_keys(run_and_data, cli):
    run_dir, _ = run_and_data
    result = cli("evaluate", run_dir, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert {"loss", "top1", "top5", "per_class"} <= set(report)
    assert 0 <= report["top1"] <= report["top5"] <= 1
    assert set(report["per_class"]) == {"cat", "dog", "fox"} and report["samples"] == 9
    for key in ("confusion_csv", "confusion_png", "json"):
        written = Path(report["files"][key])
        assert written.is_relative_to(run_dir / "eval") and written.is_file() and written.stat().st_size > 0, key
    assert json.loads(Path(report["files"]["json"]).read_text())["top1"] == report["top1"]
    rows = (run_dir / "eval" / "confusion.csv").read_text().splitlines()
    assert rows[0].split(",")[1:] == ["cat", "dog", "fox"]
    assert sum(int(v) for row in rows[1:] for v in row.split(",")[1:]) == 9
    # The same numbers the training run recorded for its last epoch (model.pt is the final model).
    summary = json.loads((run_dir / "summary.json").read_text())
    assert report["top1"] == pytest.approx(summary["last"]["top1"])
    assert report["loss"] == pytest.approx(summary["last"]["loss"], rel=1e-4)


def test_evaluate_table(run_and_data, cli):
    run_dir, _ = run_and_data
    result = cli("evaluate", run_dir)
    assert result.code == 0 and "accuracy" in result.out and "top-5" in result.out
    assert all(name in result.out for name in ("cat", "dog", "fox"))
    check_example("first-steps-evaluate", result.out, labels=["cat", "dog", "fox"])


def test_evaluate_says_which_weights_it_scored(run_and_data, cli, tmp_path):
    """model.pt holds the weights training ended with, not its best epoch's (training's last line names
    the best): the first line and eval.json say which file was scored, and --weights is named as given."""
    run_dir, _ = run_and_data
    result = cli("evaluate", run_dir, "--out", tmp_path / "final")
    assert result.code == 0, result.err
    assert result.out.splitlines()[0] == f"scored {run_dir / 'model.pt'}: the weights training ended with"
    assert json.loads((tmp_path / "final" / "eval.json").read_text())["weights"] == str(run_dir / "model.pt")
    other = tmp_path / "other.pt"
    other.write_bytes((run_dir / "model.pt").read_bytes())
    result = cli("evaluate", run_dir, "--weights", other, "--out", tmp_path / "other", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["weights"] == str(other)


def test_evaluate_needs_a_run_or_a_model(cli):
    result = cli("evaluate")
    assert result.code == 2 and "RUN_DIR or --run RUN_DIR" in result.err and "--model NAME" in result.err


@pytest.fixture(scope="module", params=["written", "real"])
def tiny_imagenet(request, tmp_path_factory):
    """A prepared tiny-imagenet-200 (classes regrouped): written by the tests in the original layout
    (3 classes, helpers/datasets.py), or a copy of the real files (train subset + all val, 200 classes)."""
    if request.param == "written":
        root = write_tiny_imagenet(tmp_path_factory.mktemp("tin"))
    else:
        source = shared_data("tiny-imagenet-200")
        root = tmp_path_factory.mktemp("tin") / "tiny-imagenet-200"
        shutil.copytree(source, root, copy_function=shutil.copy)
    prepare_tiny_imagenet(root, progress=False)
    return root


@pytest.mark.slow  # trains Inception v3 (the real files: copies 14,405 of them and regroups val/ first)
def test_finetune_recipe_on_tiny_imagenet_files(tiny_imagenet, tmp_path, cli):
    sets = ["model.weights=null", "data.train_crop_size=75", "data.val_resize_size=86", "data.val_crop_size=75",
            "data.num_workers=0", "data.max_train_samples=64", "data.max_val_samples=40", "train.batch_size=16",
            "train.epochs=1"]
    result = cli("train", "inception_v3/tiny_imagenet", "--data", tiny_imagenet, "--out", tmp_path / "runs",
                 "--no-progress", "--json", *[x for s in sets for x in ("--set", s)])
    assert result.code == 0, result.err
    summary = json.loads(result.out.strip().splitlines()[-1])
    classes = len((tiny_imagenet / "wnids.txt").read_text().split())  # 3 written, 200 real
    spec = json.loads((tmp_path / "runs" / "inception_v3" / "tiny_imagenet").glob("*/spec.json").__next__().read_text())
    assert spec["num_classes"] == classes and spec["class_names"][0] == "n01443537"
    assert spec["class_labels"][0] == "goldfish"  # human names from words.txt
    assert len(summary["last"]["per_class"]) == classes
    run = Path(summary["run_dir"])
    assert run.parent == tmp_path / "runs" / "inception_v3" / "tiny_imagenet"
    weights = torch.load(run / "model.pt", map_location="cpu", weights_only=True)
    assert weights["fc.weight"].shape == (classes, 2048)  # num_classes: null follows the data


def test_unprepared_tiny_imagenet_says_what_to_run(tmp_path, cli):
    source = write_tiny_imagenet(tmp_path / "source")
    root = tmp_path / "tiny-imagenet-200"
    (root / "val").mkdir(parents=True)
    (root / "val" / "images").mkdir()
    shutil.copy(source / "wnids.txt", root)
    result = cli("train", "inception_v3/tiny_imagenet", "--data", root, "--set", "model.weights=null")
    assert result.code == 2 and "inceptionlab data tiny-imagenet" in result.err


def test_pretrained_model_on_wnid_folders(tiny_imagenet, tmp_path, cli, monkeypatch):
    """--model NAME maps tiny-imagenet's wnid folders onto ImageNet's 1000 outputs."""
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))
    target = cached_weights_file("resnet18")
    target.parent.mkdir(parents=True)
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), target)
    subset = tmp_path / "val"
    for wnid in sorted(p.name for p in (tiny_imagenet / "val").iterdir() if p.is_dir())[:3]:
        shutil.copytree(tiny_imagenet / "val" / wnid, subset / wnid)
    result = cli("evaluate", "--model", "resnet18", "--data", subset, "--json", "--out", tmp_path / "eval")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["samples"] == len(list(subset.rglob("*.JPEG")))  # 3 classes: 12 written, 150 real images
    assert set(report["per_class"]) == {"goldfish", "European fire salamander", "bullfrog"}


def test_the_first_line_says_what_each_kind_of_weights_file_holds(tmp_path):
    from inceptionlab.checkpoint import RunDir
    from inceptionlab.judge.evaluate import _what_it_holds
    from inceptionlab.models.spec import ModelSpec

    run = RunDir(tmp_path)
    raw = ModelSpec("resnet18", 2, ["a", "b"])
    averaged = ModelSpec("resnet18", 2, ["a", "b"], weights="ema")
    assert _what_it_holds(run, run.model_file, raw, given=False) == "the weights training ended with"
    assert _what_it_holds(run, run.model_file, averaged, given=False) == \
        "the average (EMA) of the weights training ended with"
    assert _what_it_holds(run, run.best, raw, given=False).startswith("the best epoch's checkpoint so far")
    assert _what_it_holds(run, run.last, raw, given=False).startswith("the last checkpoint")
    assert _what_it_holds(run, tmp_path / "x.pt", raw, given=True) == "--weights"


def test_the_first_line_points_to_the_best_epoch_when_training_ended_elsewhere(tmp_path):
    """Training's last line names its best epoch; when that is not the last, evaluate's first line says
    where its weights are (checkpoints/best.pt), so "why is top-1 lower than training said?" answers itself."""
    from inceptionlab.checkpoint import RunDir
    from inceptionlab.judge.evaluate import _what_it_holds
    from inceptionlab.models.spec import ModelSpec

    run = RunDir(tmp_path)
    raw = ModelSpec("resnet18", 2, ["a", "b"])
    run.best.parent.mkdir(parents=True)
    run.best.write_bytes(b"checkpoint")
    run.summary_file.write_text(json.dumps({"best_metric": "val_top1", "best": {"epoch": 3}, "epochs_done": 5}))
    assert _what_it_holds(run, run.model_file, raw, given=False) == (
        f"the weights training ended with (epoch 5; the best by val_top1 was epoch 3: --weights {run.best})")
    run.summary_file.write_text(json.dumps({"best_metric": "val_top1", "best": {"epoch": 5}, "epochs_done": 5}))
    assert _what_it_holds(run, run.model_file, raw, given=False) == "the weights training ended with"


def test_evaluate_takes_no_progress_as_train_and_lr_find_do(run_and_data, cli, tmp_path):
    run_dir, _ = run_and_data
    result = cli("evaluate", run_dir, "--no-progress", "--keep-rule", "--out", tmp_path / "eval")
    assert result.code == 0, result.err
    assert "samples" in result.out


def test_a_demo_run_scores_a_folder_of_ones_own_photos(run_and_data, cli, tmp_path):
    """A run of the embedded demo (data.reader digits, which writes its data set into data.root) scoring the
    user's own photos with --data: the folder is read as class folders, not taken for a place to generate
    the demo's digits into ("exists but is not a digits ImageFolder; choose an empty or new folder")."""
    run_dir, data = run_and_data
    demo = copy_run_dir(run_dir, tmp_path)
    recipe = yaml.safe_load((demo / "recipe.resolved.yaml").read_text())
    recipe["data"].update(reader="digits", root=str(tmp_path / "digits"))
    (demo / "recipe.resolved.yaml").write_text(yaml.safe_dump(recipe))
    photos = tmp_path / "my_photos"
    shutil.copytree(data / "val", photos)  # class folders of one's own, no split
    result = cli("evaluate", demo, "--data", photos, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["samples"] == len(list(photos.rglob("*.png"))) and set(report["per_class"]) == {"cat", "dog", "fox"}
    assert not (tmp_path / "digits").exists()  # nothing generated
