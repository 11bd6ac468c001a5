"""Labels from a CSV, or one folder without val/: a seeded, stratified split that every command of a run reads."""

from __future__ import annotations

import csv
import json
import random
import shutil
from collections import Counter
from pathlib import Path

import pytest
from conftest import make_image_folder
from helpers.calibration_run import SETTINGS

from inceptionlab.config import load_recipe
from inceptionlab.data.datasets.file_list import LabelRow, read_labels_csv, stratified_split
from inceptionlab.errors import UserError
from inceptionlab.fileio import sha256_file


def rows(counts: dict[str, int]) -> list[LabelRow]:
    return [LabelRow(Path(f"/d/{label}_{i}.png"), label) for label, n in counts.items() for i in range(n)]


def test_the_split_is_stratified():
    split = stratified_split(rows({"a": 10, "b": 7, "c": 3, "d": 2, "e": 1}), 0.2, seed=42)
    val = Counter(r.label for r in split if r.split == "val")
    # round(n x 0.2), at least one of a class with two or more, never a whole class
    assert dict(val) == {"a": 2, "b": 1, "c": 1, "d": 1}
    train = Counter(r.label for r in split if r.split == "train")
    assert dict(train) == {"a": 8, "b": 6, "c": 2, "d": 1, "e": 1}


def test_the_split_is_reproducible_whatever_the_row_order():
    base = rows({"a": 30, "b": 20})
    shuffled = base[:]
    random.Random(1).shuffle(shuffled)
    one = {str(r.file): r.split for r in stratified_split(base, 0.25, seed=7)}
    assert one == {str(r.file): r.split for r in stratified_split(shuffled, 0.25, seed=7)}
    other = {str(r.file): r.split for r in stratified_split(base, 0.25, seed=8)}
    assert other != one and Counter(other.values()) == Counter(one.values())


def write_csv(path: Path, lines: list[list[str]]) -> Path:
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows(lines)
    return path


def test_csv_errors_name_the_line(tmp_path):
    (tmp_path / "a.png").write_bytes(b"x")
    with pytest.raises(UserError, match=r"labels.csv:3: a.png is listed twice \(also line 2\)"):
        read_labels_csv(write_csv(tmp_path / "labels.csv", [["file", "label"], ["a.png", "cat"], ["a.png", "dog"]]))
    with pytest.raises(UserError, match=r"1 listed file\(s\) do not exist, e.g. line 2: .*missing.png"):
        read_labels_csv(write_csv(tmp_path / "labels.csv", [["file", "label"], ["missing.png", "cat"]]))
    with pytest.raises(UserError, match="the first row must name the columns"):
        read_labels_csv(write_csv(tmp_path / "labels.csv", [["a.png", "cat"]]))


def flat_folder(root: Path) -> Path:
    """make_image_folder's train/ classes moved up: one folder of class folders, no splits."""
    data = make_image_folder(root / "made", train_per_class=10, val_per_class=0, size=36)
    (data / "train").rename(root / "photos")
    return root / "photos"


def read_splits(path: Path) -> dict[str, str]:
    with open(path) as handle:
        return {row["file"]: row["split"] for row in csv.DictReader(handle)}


@pytest.fixture(scope="module")
def flat_run(tmp_path_factory):
    from inceptionlab.engine.fit import fit

    root = tmp_path_factory.mktemp("flat")
    photos = flat_folder(root)
    recipe = load_recipe("inception_v3/imagefolder", [*SETTINGS, "train.epochs=1", f"data.root={photos}"])
    return fit(recipe, root / "runs", progress=False).run_dir, photos


def test_a_folder_without_val_is_split_and_the_split_recorded(flat_run):
    run_dir, photos = flat_run
    recorded = read_splits(run_dir / "splits.csv")
    assert len(recorded) == 30 and Counter(recorded.values()) == {"train": 24, "val": 6}
    assert all(not Path(name).is_absolute() for name in recorded)  # relative to the data root: the data may move
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["best"]["epoch"] == 1


def test_evaluate_scores_the_recorded_val_images_even_after_new_files_arrive(flat_run, tmp_path, cli):
    import shutil

    run_dir, photos = flat_run
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("checkpoints", "tb"))
    for i in range(5):  # new files: a fresh split would differ; the recorded one must not
        shutil.copy(photos / "cat" / "cat_0.png", photos / "cat" / f"new_{i}.png")
    try:
        result = cli("evaluate", copy, "--json")
        assert result.code == 0, result.err
        assert json.loads(result.out)["samples"] == 6
    finally:
        for i in range(5):
            (photos / "cat" / f"new_{i}.png").unlink()


def test_a_labels_csv_trains_with_its_own_split_column(tmp_path, cli):
    data = make_image_folder(tmp_path / "data", train_per_class=6, val_per_class=2, size=36)
    lines = [["file", "label", "split"]]
    for split in ("train", "val"):
        for path in sorted((data / split).rglob("*.png")):
            lines.append([str(path.relative_to(data)), path.parent.name, split])
    labels = write_csv(data / "labels.csv", lines)
    result = cli("train", "inception_v3/imagefolder", "--out", tmp_path / "runs", "--no-progress", "--json",
                 *[a for s in [*SETTINGS, "train.epochs=1", f"data.labels_csv={labels}"] for a in ("--set", s)])
    assert result.code == 0, result.err
    run_dir = Path(json.loads(result.out.strip().splitlines()[-1])["run_dir"])
    assert Counter(read_splits(run_dir / "splits.csv").values()) == {"train": 18, "val": 6}


def test_a_folder_without_val_says_which_files_it_left_out(tmp_path):
    """One folder of class folders (split at training) names the files it does not read, as split folders do:
    a notes file, and an image sitting in no class folder."""
    from inceptionlab.data.readers import read_splits
    from inceptionlab.models.registry import resolve_data_config

    photos = flat_folder(tmp_path)
    (photos / "cat" / "notes.txt").write_text("shot on the beach")
    shutil.copy(photos / "cat" / "cat_0.png", photos / "loose.png")
    recipe = load_recipe("inception_v3/imagefolder", [*SETTINGS, f"data.root={photos}"])
    notes = read_splits(resolve_data_config(recipe.data, recipe.model.name)).notes
    assert any(n.startswith("ignored 1 non-image file(s), e.g. ") and n.endswith("notes.txt") for n in notes), notes
    assert any(n.startswith(f"ignored 1 image(s) directly in {photos}/, not in a class folder") for n in notes), notes


def test_a_folder_too_small_to_split_says_so_in_its_own_terms(tmp_path, cli):
    """Classes of one image each leave nothing for validation: the error says that, not the labels CSV's
    advice about a split column the user never wrote."""
    image = flat_folder(tmp_path / "src") / "cat" / "cat_0.png"
    photos = tmp_path / "photos"
    for name in ("cat", "dog"):
        (photos / name).mkdir(parents=True)
        shutil.copy(image, photos / name / "one.png")
    result = cli("train", "inception_v3/imagefolder", "--data", photos, "--out", tmp_path / "runs", "--no-progress",
                 *[x for s in SETTINGS for x in ("--set", s)])
    assert result.code == 2 and not (tmp_path / "runs").exists()
    error = result.err.strip().splitlines()[-1]
    assert "labels" not in error and "split column" not in error
    assert f"{photos}" in error and "no image left for validation" in error and "at least 2 images" in error


def test_data_that_is_a_file_is_refused_naming_it(tmp_path, cli):
    photo = flat_folder(tmp_path) / "cat" / "cat_0.png"
    result = cli("train", "inception_v3/imagefolder", "--data", photo, "--out", tmp_path / "runs", "--no-progress")
    assert result.code == 2
    assert result.err.strip().splitlines()[-1] == (f"error: {photo}: not a folder; pass --data DIR, a folder of class "
                                                   "folders (or with train/ and val/ class folders)")


def test_a_run_on_a_folder_it_split_itself_resumes(flat_run, tmp_path, cli):
    """The run's own splits.csv, read back on resume so the same images are trained on, is not a change of
    the data: resuming (here: one epoch more) was refused as `data.split_file cannot change on resume`."""
    run_dir, _ = flat_run
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    result = cli("train", "--resume", copy, "--set", "train.epochs=2", "--no-progress", "--json")
    assert result.code == 0, result.err
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["epochs_done"] == 2 and summary["status"] == "completed"
    assert read_splits(copy / "splits.csv") == read_splits(run_dir / "splits.csv")  # the same split, kept
    other = tmp_path / "other.csv"
    shutil.copy(copy / "splits.csv", other)
    changed = cli("train", "--resume", copy, "--set", "train.epochs=3", "--set", f"data.split_file={other}")
    assert changed.code == 2 and "data.split_file cannot change on resume" in changed.err


def test_a_class_too_small_to_give_validation_an_image_is_named_at_training_and_evaluation(tmp_path, cli):
    """A class of one photo (an imbalanced folder's tail) all goes to training: nothing measures it. Training
    says so where it says the split, and evaluate names the model's classes its split has no image of, instead
    of a per-class table without them."""
    photos = flat_folder(tmp_path)
    (photos / "owl").mkdir()
    shutil.copy(photos / "cat" / "cat_0.png", photos / "owl" / "owl.png")
    trained = cli("train", "inception_v3/imagefolder", "--data", photos, "--out", tmp_path / "runs", "--no-progress",
                  "--json", *[x for s in [*SETTINGS, "train.epochs=1"] for x in ("--set", s)])
    assert trained.code == 0, trained.err
    said = trained.out + trained.err
    assert ("no validation image of owl (1 image in all, which trains): its accuracy is not measured; "
            "add images of it") in said
    run_dir = Path(json.loads(trained.out.strip().splitlines()[-1])["run_dir"])
    scored = cli("evaluate", run_dir, "--json")
    assert scored.code == 0, scored.err
    report = json.loads(scored.out)
    assert report["not_scored"] == ["owl"] and "owl" not in report["per_class"]
    recorded = json.loads((run_dir / "eval" / "results.json").read_text())  # what `compare` checks staleness by
    assert recorded["weights_sha256"] == sha256_file(run_dir / "model.pt")
    table = cli("evaluate", run_dir)
    assert table.code == 0, table.err
    assert "not scored: owl (no image of it in val): its accuracy is unknown" in table.out


def _new_photos(source: Path, target: Path, per_class: int) -> Path:
    """Other photos of the same classes, under names the run's data does not have (a test set)."""
    for folder in sorted(p for p in source.iterdir() if p.is_dir()):
        (target / folder.name).mkdir(parents=True)
        for i, image in enumerate(sorted(folder.rglob("*.png"))[:per_class]):
            shutil.copy(image, target / folder.name / f"new_{i}.png")
    return target


def test_evaluate_on_new_photos_scores_all_of_them_and_on_moved_data_its_recorded_split(flat_run, squares_run,
                                                                                        tmp_path, cli):
    """`evaluate RUN --data DIR`: a folder of new photos is scored whole, whatever the run was trained on
    (its splits.csv describes the run's own files, which are not there; splitting DIR 80/20 would score a
    fifth of it); the run's own data, moved, is still scored on its recorded validation images."""
    run_dir, photos = flat_run
    new = _new_photos(photos, tmp_path / "new", per_class=4)  # 3 classes x 4
    for run in (run_dir, squares_run.run_dir):  # split at training; trained on train/ + val/ folders
        scored = cli("evaluate", run, "--data", new, "--json", "--out", tmp_path / "eval" / run.name)
        assert scored.code == 0, scored.err
        assert json.loads(scored.out)["samples"] == 12
        table = json.loads((tmp_path / "eval" / run.name / "results.json").read_text())
        assert table["split"] == "all" and sorted(table["labels"]) == ["cat", "dog", "fox"]

    moved = tmp_path / "moved"
    shutil.copytree(photos, moved)
    scored = cli("evaluate", run_dir, "--data", moved, "--json", "--out", tmp_path / "eval-moved")
    assert scored.code == 0, scored.err
    assert json.loads(scored.out)["samples"] == 6  # the recorded val images, found under the new place
    whole = cli("evaluate", run_dir, "--data", moved, "--split", "all", "--json", "--out", tmp_path / "eval-all")
    assert whole.code == 0 and json.loads(whole.out)["samples"] == 30

    shutil.copy(photos / "cat" / "cat_0.png", new / "cat" / "cat_0.png")  # one name in common with the run's data
    mixed = cli("evaluate", run_dir, "--data", new, "--out", tmp_path / "eval-mixed")
    assert mixed.code == 2 and "--split all" in mixed.err and len(mixed.err.strip().splitlines()) == 1
