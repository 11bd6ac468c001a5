"""Folders as users have them: links, hidden files, one class, odd names, files that cannot be read.

One rule decides what counts as an image and as a class (data/io/image_files.py); training (every
loader), evaluate, predict and the decoded cache all follow it, and every skipped file is named with
its reason. Training here uses the guide's small CIFAR-10 CNN at 32 px: the rules do not depend on
the model.
"""

from __future__ import annotations

import json
import os
import shutil
import unicodedata
from pathlib import Path

import pytest
from conftest import FAST, make_image_folder
from PIL import Image

from inceptionlab.config import load_recipe
from inceptionlab.data.datasets.imagefolder import RobustImageFolder, image_folder_splits
from inceptionlab.data.io.image_files import expand_image_paths
from inceptionlab.engine.fit import fit
from inceptionlab.errors import UserError

RECIPE = "inception_v3/imagefolder"
SMALL_CNN = ["model.name=cifar10_cnn", "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32"]


def small_recipe(data: Path, *extra: str):
    return load_recipe(RECIPE, [*FAST, *SMALL_CNN, f"data.root={data}", "train.epochs=1", *extra])


@pytest.fixture
def folder(tmp_path) -> Path:
    return make_image_folder(tmp_path / "data", train_per_class=4, val_per_class=2, size=24)


def sample_files(dataset) -> set[str]:
    return {path for path, _ in dataset.samples}


# --- what counts --------------------------------------------------------------------------------


def test_hidden_folders_and_files_count_for_nothing(folder):
    train = folder / "train"
    (train / ".thumbnails").mkdir()
    Image.new("RGB", (8, 8)).save(train / ".thumbnails" / "t.png")
    (train / ".ipynb_checkpoints").mkdir()  # empty, as Jupyter leaves it
    (train / "cat" / ".thumbs").mkdir()
    Image.new("RGB", (8, 8)).save(train / "cat" / ".thumbs" / "small.png")
    (train / "cat" / "._cat_0.png").write_bytes(b"\x00\x05\x16\x07 macOS resource fork")
    dataset = RobustImageFolder(train)
    assert dataset.classes == ["cat", "dog", "fox"]
    assert len(dataset.samples) == 12 and not any("/." in path for path in sample_files(dataset))
    assert dataset.ignored_files == []
    # predict walks folders by the same rule
    assert {str(p) for p in expand_image_paths([train])[0]} == sample_files(dataset)


def test_a_class_whose_images_sit_in_a_linked_folder_counts(folder, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(folder / "train" / "fox"), elsewhere)
    (folder / "train" / "fox").mkdir()
    (folder / "train" / "fox" / "linked").symlink_to(elsewhere, target_is_directory=True)
    dataset = RobustImageFolder(folder / "train")
    foxes = [path for path, target in dataset.samples if dataset.classes[target] == "fox"]
    assert len(foxes) == 4 and all("/fox/linked/" in path for path in foxes)


def test_class_names_match_across_unicode_normalisations(folder):
    for split, form in (("train", "NFD"), ("val", "NFC")):
        (folder / split / "fox").rename(folder / split / unicodedata.normalize(form, "café"))
    splits = image_folder_splits(folder, "train", "val", None, None)
    assert splits.class_names == [unicodedata.normalize("NFC", "café"), "cat", "dog"]
    assert len(splits.train.samples) == 12


def test_images_directly_in_the_split_folder_are_noted(folder):
    Image.new("RGB", (8, 8)).save(folder / "train" / "stray.png")
    splits = image_folder_splits(folder, "train", "val", None, None)
    note = next(n for n in splits.notes if "stray.png" in n)
    assert "not in a class folder" in note and "1 image" in note


def test_a_single_class_is_refused_before_any_compute(tmp_path, monkeypatch):
    data = make_image_folder(tmp_path / "data", classes=("cat",), train_per_class=3, val_per_class=1, size=16)
    from inceptionlab.engine import session

    monkeypatch.setattr(session, "build_model", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(UserError, match=r"one class \(cat\).*two or more"):
        fit(small_recipe(data), tmp_path / "runs", progress=False)
    assert not (tmp_path / "runs").exists()


# --- unreadable files, with their reasons -------------------------------------------------------


def bad_files(split: Path, monkeypatch) -> dict[str, str]:
    """One file of each kind of trouble in `split`/cat; the reason each must be reported with."""
    cat = split / "cat"
    (cat / "gone.jpg").symlink_to("/nonexistent/gone.jpg")
    (cat / "empty.jpg").write_bytes(b"")
    (cat / "notes.png").write_text("this is text")
    Image.new("L", (60, 60)).save(cat / "huge.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 60 x 60 is over twice that: PIL refuses it
    return {"gone.jpg": "broken link", "empty.jpg": "empty file", "notes.png": "not an image",
            "huge.png": "image too large"}


@pytest.mark.parametrize("loader", ["resident", "stream", "workers"])
def test_every_loader_skips_and_names_unreadable_files_with_their_reason(folder, tmp_path, loader, monkeypatch, capsys):
    expected = bad_files(folder / "train", monkeypatch)
    outcome = fit(small_recipe(folder, f"data.loader={loader}"), tmp_path / "runs", progress=False)
    assert outcome.status == "completed"
    reasons = {Path(path).name: why for path, why in outcome.summary["skipped_reasons"].items()}
    assert {name: reasons.get(name, "")[:len(why)] for name, why in expected.items()} == expected
    assert sorted(Path(p).name for p in outcome.summary["skipped_files"]) == sorted(expected)
    line = next(line for line in capsys.readouterr().out.splitlines() if "train_loss" in line)
    assert "skipped 4 unreadable image(s)" in line and "broken link" in line


def test_bad_files_in_val_appear_in_the_epoch_line(folder, tmp_path, capsys):
    (folder / "val" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    outcome = fit(small_recipe(folder), tmp_path / "runs", progress=False)
    line = next(line for line in capsys.readouterr().out.splitlines() if "train_loss" in line)
    assert "broken.jpg" in line and "truncated or corrupt" in line
    assert any(p.endswith("broken.jpg") for p in outcome.summary["skipped_files"])


def test_the_decoded_cache_survives_a_dangling_link(folder):
    from inceptionlab.data.loading.decoded_cache import load_or_build

    (folder / "train" / "dog" / "gone.jpg").symlink_to("/nonexistent/gone.jpg")
    dataset = RobustImageFolder(folder / "train")
    cache = load_or_build(dataset.samples, folder / "train", 32)
    assert [Path(p).name for p in cache.unreadable] == ["gone.jpg"]
    assert cache.unreadable[0].problem.startswith("broken link")


def test_the_decoded_cache_is_written_with_the_users_umask(folder):
    from inceptionlab.data.loading.decoded_cache import cache_paths, load_or_build

    previous = os.umask(0o022)
    try:
        load_or_build(RobustImageFolder(folder / "train").samples, folder / "train", 32)
    finally:
        os.umask(previous)
    for path in cache_paths(folder / "train", 32):
        assert path.stat().st_mode & 0o777 == 0o644, path


# --- evaluate -----------------------------------------------------------------------------------


def test_evaluate_names_unreadable_files(squares_run, tmp_path, cli):
    data = tmp_path / "data"
    shutil.copytree(squares_run.data, data)
    (data / "val" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (data / "val" / "cat" / "empty.png").write_bytes(b"")
    result = cli("evaluate", squares_run.run_dir, "--data", data, "--out", tmp_path / "eval", "--num-workers", "0")
    assert result.code == 0, result.err
    said = result.out + result.err
    assert "skipped 2 unreadable image(s)" in said and "broken.jpg" in said and "empty file" in said
    as_json = cli("evaluate", squares_run.run_dir, "--data", data, "--out", tmp_path / "eval2", "--json")
    report = json.loads(as_json.out)
    assert sorted(Path(s["file"]).name for s in report["skipped"]) == ["broken.jpg", "empty.png"]
    assert report["samples"] == 9


def test_evaluate_table_aligns_wide_class_names(capsys):
    from inceptionlab.cli.evaluate import _print_table

    def display_width(text: str) -> int:  # columns a terminal gives: East Asian wide characters take two
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)

    report = {"per_class": {"猫": 0.5, "dog": 1.0, "Füchse": 0.25}, "per_class_samples": {"猫": 2, "dog": 3, "Füchse": 4},
              "samples": 9, "loss": 1.0, "top1": 0.5}
    _print_table(report)
    rows = capsys.readouterr().out.splitlines()[:4]
    starts = {display_width(row[:row.index(str(n))]) for row, n in zip(rows[1:], (4, 2, 3))}
    assert len(starts) == 1, rows
