"""`inceptionlab data check`: planted problems are found, clean images are never called copies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_data
from helpers.page_examples import check_example
from PIL import Image

from inceptionlab.data.check import check_data, quick_check, warning_line


def smooth_image(rng: np.random.Generator, size: int = 64) -> Image.Image:
    """A distinct picture-like image: a random low-frequency field (8 x 8 upscaled) with a random bar."""
    field = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    image = np.asarray(Image.fromarray(field).resize((size, size), Image.BICUBIC)).copy()
    y, x = rng.integers(0, size - 12, 2)
    image[y:y + 10, x:x + rng.integers(10, size - x)] = rng.integers(0, 256, 3)
    return Image.fromarray(image)


def clean_dataset(root: Path, classes=("cat", "dog", "fox"), train=12, val=4, seed=0) -> Path:
    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("val", val)):
        for name in classes if count else ():
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                smooth_image(rng).save(folder / f"{name}_{i}.jpg", quality=90)
    return root


def files_in(finding) -> set[str]:
    out = set()
    for item in finding.files:
        out.update(item if isinstance(item, list) else [item])
    return out


def by_check(report) -> dict:
    found: dict = {}
    for f in report.findings:
        found.setdefault(f.check, []).append(f)
    return found


def test_a_clean_dataset_has_no_copies(tmp_path):
    report = check_data(clean_dataset(tmp_path / "data"), workers=0)
    assert report.images == 48 and report.near_copies_checked
    assert not report.findings, [f.message for f in report.findings]


@pytest.fixture
def planted(tmp_path):
    """A clean set with one of each problem planted; returns (root, {check: files it must name})."""
    root = clean_dataset(tmp_path / "data")
    train, val = root / "train", root / "val"
    shutil.copy(train / "cat" / "cat_0.jpg", train / "cat" / "cat_0_copy.jpg")  # exact, same class
    shutil.copy(train / "dog" / "dog_0.jpg", train / "fox" / "fox_from_dog.jpg")  # exact, another class
    source = Image.open(train / "fox" / "fox_1.jpg")
    source.resize((48, 48), Image.LANCZOS).save(val / "fox" / "fox_resized.jpg", quality=50)  # near, across splits
    Image.open(train / "cat" / "cat_2.jpg").save(val / "cat" / "cat_as_png.png")  # re-encoded, across splits
    Image.open(train / "dog" / "dog_3.jpg").resize((128, 128), Image.BICUBIC).save(train / "dog" / "dog_3_big.jpg")
    good = (train / "cat" / "cat_3.jpg").read_bytes()
    (train / "cat" / "truncated.jpg").write_bytes(good[: len(good) // 3])
    (train / "dog" / "empty.jpg").write_bytes(b"")
    smooth_image(np.random.default_rng(9), 16).save(train / "dog" / "tiny.png")
    Image.fromarray(np.random.default_rng(8).integers(0, 255, (40, 200, 3), dtype=np.uint8)).save(train / "fox" / "wide.png")
    smooth_image(np.random.default_rng(7)).convert("CMYK").save(train / "fox" / "cmyk.jpg")
    Image.new("RGB", (64, 64), (90, 90, 90)).save(train / "cat" / "blank.png")
    expected = {
        "exact_duplicates": {"train/cat/cat_0.jpg", "train/cat/cat_0_copy.jpg"},
        "label_conflict": {"train/dog/dog_0.jpg", "train/fox/fox_from_dog.jpg"},
        "leakage": {"train/fox/fox_1.jpg", "val/fox/fox_resized.jpg", "train/cat/cat_2.jpg", "val/cat/cat_as_png.png"},
        "near_duplicates": {"train/dog/dog_3.jpg", "train/dog/dog_3_big.jpg"},
        "undecodable": {"train/cat/truncated.jpg", "train/dog/empty.jpg"},
        "small_images": {"train/dog/tiny.png"},
        "aspect_ratio": {"train/fox/wide.png"},
        "modes": {"train/fox/cmyk.jpg"},
        "blank_images": {"train/cat/blank.png"},
    }
    return root, expected


def test_planted_problems_are_found_with_nothing_else(planted):
    root, expected = planted
    report = check_data(root, workers=0)
    found = by_check(report)
    for check, files in expected.items():
        assert check in found, f"{check} not found; found {sorted(found)}"
        assert set().union(*(files_in(f) for f in found[check])) == files, check
    copies = set().union(*(files_in(f) for c in ("exact_duplicates", "near_duplicates", "label_conflict", "leakage")
                           for f in found[c]))
    assert copies == set().union(*(expected[c] for c in ("exact_duplicates", "near_duplicates", "label_conflict",
                                                         "leakage")))
    severity = {f.check: f.severity for f in report.findings}
    assert severity["leakage"] == severity["label_conflict"] == severity["undecodable"] == "error"
    assert all(f.advice for f in report.findings)


def test_the_process_pool_finds_the_same(planted):
    root, _ = planted
    one, pool = check_data(root, workers=0), check_data(root, workers=2)
    assert [f.to_dict() for f in one.findings] == [f.to_dict() for f in pool.findings]


def test_imbalance_suggests_balanced_class_weights(tmp_path):
    root = clean_dataset(tmp_path / "data", train=4, val=2)
    rng = np.random.default_rng(5)
    for i in range(12):
        smooth_image(rng).save(root / "train" / "cat" / f"extra_{i}.jpg")
    [imbalance] = [f for f in quick_check(root) if f.check == "imbalance"]
    # 16 cat, 4 dog, 4 fox: 1 / n_c normalised to a mean of 1 = (1/16, 1/4, 1/4) / (9/48) = 1/3, 4/3, 4/3
    assert imbalance.details["weights"] == {"cat": 0.3333, "dog": 1.3333, "fox": 1.3333}
    assert "train.class_weights=auto" in imbalance.advice
    # ... the weights train.class_weights=auto trains with:
    import torch

    from inceptionlab.data.loading.sampler import inverse_frequency

    auto = inverse_frequency(torch.tensor([16, 4, 4]), 1.0).tolist()
    assert list(imbalance.details["weights"].values()) == pytest.approx(auto, abs=1e-4)
    assert any(f.check == "few_images" for f in quick_check(root)) is True  # dog and fox have 4 < 5
    line = warning_line(quick_check(root), root)
    assert line.startswith("warning: data check: classes are imbalanced") and "inceptionlab data check" in line
    assert "\n" not in line
    check_example("data-check-train-warning", line, labels=["cat", "dog", "fox"])


def test_a_folder_of_class_folders_counts_its_images_without_naming_a_split(tmp_path):
    """photos/<class>/ with no train/ or val/ (the split is made at training): the counts say "images of cat",
    not "all images of cat" (the listing's name for the whole folder)."""
    root = clean_dataset(tmp_path / "data", train=4, val=0)
    for name in ("cat", "dog", "fox"):
        (root / "train" / name).rename(root / name)
    shutil.rmtree(root / "train")
    rng = np.random.default_rng(5)
    for i in range(12):
        smooth_image(rng).save(root / "cat" / f"extra_{i}.jpg")
    findings = {f.check: f for f in quick_check(root)}
    assert findings["imbalance"].message.startswith("classes are imbalanced: 16 images of cat, 4 of ")
    assert findings["few_images"].message == "2 class(es) have fewer than 5 images"
    assert " all " not in warning_line(list(findings.values()), root)


def test_the_cli_reports_and_exits_1_on_errors(planted, cli):
    root, expected = planted
    result = cli("data", "check", root, "--workers", "0", "--json")
    assert result.code == 1
    report = json.loads(result.out)
    assert report["counts"]["error"] >= 3 and report["splits"]["train"]["classes"] == 3
    leakage = next(f for f in report["findings"] if f["check"] == "leakage")
    assert {name for group in leakage["files"] for name in group} == expected["leakage"]
    text = cli("data", "check", root, "--workers", "0")
    assert "ERROR   leakage" in text.out and "what to do:" in text.out
    check_example("data-check-report", text.out, labels=["cat", "dog", "fox"])


def test_a_clean_set_exits_0(tmp_path, cli):
    result = cli("data", "check", clean_dataset(tmp_path / "data"), "--workers", "0")
    assert result.code == 0 and "no problems found" in result.out


def test_an_unsorted_val_folder_says_how_to_sort_it(tmp_path):
    root = clean_dataset(tmp_path / "data", val=0)
    flat = root / "val" / "images"
    flat.mkdir(parents=True)
    smooth_image(np.random.default_rng(3)).save(flat / "val_0.jpg")
    (root / "val" / "val_annotations.txt").write_text("val_0.jpg\tcat\n")
    [finding] = [f for f in quick_check(root) if f.check == "unlabelled_split"]
    assert finding.severity == "error" and "inceptionlab data tiny-imagenet" in finding.advice


def test_real_images_with_planted_copies(tmp_path):
    """tiny-imagenet's own photos (3 classes x 20): the planted copies and nothing else."""
    tiny = shared_data("tiny-imagenet-200")
    root = tmp_path / "data"
    wnids = sorted(p.name for p in (tiny / "train").iterdir() if p.is_dir())[:3]
    for wnid in wnids:
        images = sorted((tiny / "train" / wnid / "images").glob("*.JPEG"))
        for split, chosen in (("train", images[:15]), ("val", images[15:])):
            (root / split / wnid).mkdir(parents=True)
            for image in chosen:
                shutil.copy(image, root / split / wnid / image.name)
    first = sorted((root / "train" / wnids[0]).glob("*.JPEG"))[0]
    Image.open(first).resize((40, 40), Image.LANCZOS).save(root / "val" / wnids[0] / "leaked.jpg", quality=60)
    found = by_check(check_data(root, workers=0))
    assert set(found) <= {"leakage", "modes"}, sorted(found)
    assert files_in(found["leakage"][0]) == {f"train/{wnids[0]}/{first.name}", f"val/{wnids[0]}/leaked.jpg"}


def test_train_gets_one_warning_line_from_the_cheap_checks(tmp_path):
    from inceptionlab.config import load_recipe
    from inceptionlab.data.readers import data_warning

    root = clean_dataset(tmp_path / "data", train=4, val=2)
    recipe = load_recipe("inception_v3/imagefolder", [f"data.root={root}"])
    assert data_warning(recipe.data) is not None and "fewer than 5" in data_warning(recipe.data)
    clean = clean_dataset(tmp_path / "clean", train=6, val=2)
    assert data_warning(load_recipe("inception_v3/imagefolder", [f"data.root={clean}"]).data) is None


@pytest.mark.parametrize("layout", ["splits", "single"])
def test_files_that_are_not_read_as_images_are_named(tmp_path, layout):
    """A notes file in a class folder is left out of training: the check says which files were left out,
    in both layouts (split folders, and one folder of class folders split at training)."""
    root = clean_dataset(tmp_path / "data", train=4, val=2 if layout == "splits" else 0)
    if layout == "single":
        for name in ("cat", "dog", "fox"):
            (root / "train" / name).rename(root / name)
        shutil.rmtree(root / "train")
    notes = (root / "train" / "cat" if layout == "splits" else root / "cat") / "notes.txt"
    notes.write_text("shot on the beach")
    findings = {f.check: f for f in quick_check(root)}
    ignored = findings["not_images"]
    assert ignored.severity == "info" and ignored.message == "1 file(s) in class folders are not read as images"
    assert ignored.files == [str(notes.relative_to(root))]


def test_iphone_photos_are_checked_like_any_image(tmp_path):
    """HEIC photos in a class folder are read by the check as training reads them (pillow-heif), hashed
    and compared: a copy of one in val/ is leakage, not two undecodable files."""
    pillow_heif = pytest.importorskip("pillow_heif", reason="pillow-heif (the `heif` extra) is not installed")
    root = clean_dataset(tmp_path / "data", train=4, val=2)
    photo = smooth_image(np.random.default_rng(9), size=96)
    for split in ("train", "val"):
        pillow_heif.from_pillow(photo).save(root / split / "cat" / "IMG_0001.HEIC", quality=90)
    report = check_data(root, workers=0)
    found = by_check(report)
    assert "undecodable" not in found
    assert {"train/cat/IMG_0001.HEIC", "val/cat/IMG_0001.HEIC"} <= files_in(found["leakage"][0])


def test_photos_this_installation_cannot_read_are_not_called_damaged(tmp_path):
    """Without pillow-heif an iPhone's HEIC photos cannot be read: the check says what reads them, apart
    from damaged files, whose advice is to re-save or delete them (never what to do with one's photos).
    In a fresh interpreter with pillow_heif blocked: a PIL plugin, once registered, is the process's."""
    import json
    import subprocess
    import sys

    root = clean_dataset(tmp_path / "data", train=4, val=2)
    (root / "train" / "cat" / "IMG_0001.HEIC").write_bytes(
        b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(64))
    (root / "train" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    script = ("import sys, json; sys.modules['pillow_heif'] = None\n"
              "from pathlib import Path\n"
              "from inceptionlab.data.check import check_data\n"
              "report = check_data(Path(sys.argv[1]), workers=0)\n"
              "print(json.dumps([f.to_dict() for f in report.findings]))\n")
    done = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = {f["check"]: f for f in json.loads(done.stdout)}
    assert found["undecodable"]["files"] == ["train/dog/broken.jpg"]
    needs = found["needs_reader"]
    assert needs["severity"] == "error" and needs["files"] == ["train/cat/IMG_0001.HEIC"]
    assert "pip install 'inceptionlab[heif]'" in needs["advice"] and "delete" not in needs["advice"]


def test_a_class_of_one_image_is_said_in_the_singular(tmp_path):
    from inceptionlab.data.check.report import format_report

    root = clean_dataset(tmp_path / "data", train=4, val=2)
    for extra in sorted((root / "train" / "fox").iterdir())[1:]:
        extra.unlink()  # fox: 1 training image
    text = format_report(check_data(root, workers=0))
    assert "           fox: 1 image, weight " in text and "           dog: 4 images, weight " in text


def test_a_copy_group_is_listed_once_with_its_near_copies(tmp_path):
    """An exact copy filed under another class, plus a re-encoded one: the check listed the group twice,
    `IMG_0001.JPEG = salamander_1.JPEG`, then `IMG_0001.JPEG = banner.png = salamander_1.JPEG`."""
    root = clean_dataset(tmp_path / "data")
    train = root / "train"
    shutil.copy(train / "dog" / "dog_0.jpg", train / "fox" / "IMG_0001.jpg")  # the same bytes, another class
    Image.open(train / "dog" / "dog_0.jpg").save(train / "fox" / "banner.png")  # re-encoded
    shutil.copy(train / "cat" / "cat_1.jpg", train / "cat" / "cat_1_copy.jpg")  # an exact copy alone
    findings = by_check(check_data(root, workers=0))
    (conflict,) = findings["label_conflict"]
    assert [sorted(group) for group in conflict.files] == [["train/dog/dog_0.jpg", "train/fox/IMG_0001.jpg",
                                                            "train/fox/banner.png"]]
    assert conflict.message.startswith("1 image(s) are filed under more than one class")
    (exact,) = findings["exact_duplicates"]
    assert exact.files == [["train/cat/cat_1.jpg", "train/cat/cat_1_copy.jpg"]]
    assert "near_duplicates" not in findings and "leakage" not in findings
