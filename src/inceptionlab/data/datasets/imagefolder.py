"""ImageFolder reading that never stops a long run for one bad file.

Decisions (docs/troubleshooting.md, "Bad input"):
- what counts as an image and as a class is image_files.py's rule (dot-names count for nothing,
  folder links are followed, class names are Unicode NFC); a file with a non-image extension is
  ignored and counted, reported once; images directly in the split folder are noted;
- an image that cannot be decoded (corrupt, truncated, empty, too large, a broken link) is skipped
  at load time and named with its reason at the end of each epoch: one bad JPEG in 100,000 should
  not cost a 90-epoch run;
- an empty class folder, no class folders at all, or train/val class sets that differ are errors:
  they change the meaning of the labels, so nothing sensible can be trained.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from torchvision.datasets import ImageFolder, VisionDataset

from inceptionlab.data.datasets.file_list import SPLITS_FILE, LabelRow, splits_writer
from inceptionlab.data.io.decode import ImageReadError, UnreadableFile, load_rgb
from inceptionlab.data.io.image_files import IMAGE_EXTENSIONS, ClassFolders, left_out_notes, list_class_folders
from inceptionlab.data.splits import SplitPair
from inceptionlab.errors import UserError


class RobustImageFolder(ImageFolder):
    """ImageFolder whose items are `(image, target)`, or `(None, UnreadableFile)` for a file that cannot
    be decoded. Classes and files are image_files.py's rule (`list_class_folders`), not torchvision's.

    `max_side`: JPEGs are decoded at the smallest reduced scale whose shorter side is still at least
    this (PIL draft), as `predict`, `serve` and the decoded cache read them (the model's eval resize)."""

    def __init__(self, root: Path, transform: Any = None, max_side: int | None = None):
        self.listing: ClassFolders = list_class_folders(Path(root))
        self.ignored_files: list[str] = self.listing.ignored
        loader = partial(load_rgb, max_side=max_side) if max_side else load_rgb
        super().__init__(str(root), transform=transform, loader=loader)

    def find_classes(self, directory: Any) -> tuple[list[str], dict[str, int]]:
        return list(self.listing.classes), {name: i for i, name in enumerate(self.listing.classes)}

    def make_dataset(self, directory: Any, class_to_idx: dict[str, int], *args: Any, **kwargs: Any) -> list[tuple[str, int]]:
        return list(self.listing.samples)

    def __getitem__(self, index: int) -> tuple[Any, int] | tuple[None, UnreadableFile]:
        path, target = self.samples[index]
        try:
            image = self.loader(path)
        except ImageReadError as exc:
            return None, UnreadableFile.from_error(exc, path)
        if self.transform is not None:
            image = self.transform(image)
        return image, target


def check_same_classes(train_root: Path, train_classes: list[str], val_root: Path, val_classes: list[str]) -> None:
    if train_classes == val_classes:
        return
    only_train = sorted(set(train_classes) - set(val_classes))
    only_val = sorted(set(val_classes) - set(train_classes))
    raise UserError(
        f"{val_root}: class folders differ from {train_root} "
        f"(only in train: {', '.join(only_train[:5]) or '-'}; only in val: {', '.join(only_val[:5]) or '-'}); "
        "make both splits hold the same class folders"
    )


def image_folder_splits(root: Path, train_split: str, val_split: str, train_tf: Any, val_tf: Any,
                        max_sides: tuple[int | None, int | None] = (None, None)) -> SplitPair:
    """`max_sides`: the JPEG decoding hint (RobustImageFolder's `max_side`) of train and val."""
    train = RobustImageFolder(root / train_split, transform=train_tf, max_side=max_sides[0])
    val = RobustImageFolder(root / val_split, transform=val_tf, max_side=max_sides[1])
    check_same_classes(root / train_split, train.classes, root / val_split, val.classes)
    notes = left_out_notes(root, train.ignored_files + val.ignored_files, [])
    for split in (train, val):
        notes += left_out_notes(Path(split.root), [], split.listing.loose)
    return SplitPair(train, val, list(train.classes), None, notes)


class LabelledFiles(RobustImageFolder):
    """A split given as (file, label) rows (a labels CSV, or files split off one class folder) instead of
    a folder of class folders; items as RobustImageFolder's. `root` names the data root and the split
    (`<root>/<split>`, which need not exist): the decoded cache keeps one file per split under it."""

    def __init__(self, rows: list[LabelRow], classes: list[str], root: Path, transform: Any = None,
                 max_side: int | None = None):
        # No folder to scan: torchvision's VisionDataset set-up only, then the samples as given.
        VisionDataset.__init__(self, str(root), transform=transform)
        self.loader = partial(load_rgb, max_side=max_side) if max_side else load_rgb
        self.extensions, self.ignored_files = IMAGE_EXTENSIONS, []
        self.classes, self.class_to_idx = list(classes), {c: i for i, c in enumerate(classes)}
        self.samples = [(str(row.file), self.class_to_idx[row.label]) for row in rows]
        self.imgs, self.targets = self.samples, [label for _, label in self.samples]


def labelled_file_splits(rows: list[LabelRow], root: Path, train_tf: Any, val_tf: Any, notes: list[str] | None = None,
                         max_sides: tuple[int | None, int | None] = (None, None)) -> SplitPair:
    """Train and val datasets from rows whose `split` says which; the rows are recorded with the run."""
    classes = sorted({row.label for row in rows})
    parts = {name: [r for r in rows if r.split == name] for name in ("train", "val")}
    others = sorted({r.split for r in rows} - {"train", "val", "test"})
    if others:
        raise UserError(f"split {others[0]!r} in the labels: use train, val (and test)")
    for name in ("train", "val"):
        if not parts[name]:
            raise UserError(f"{root}: no {name} images in the labels; give some rows split={name}, or leave the "
                            "split column out to split each class by data.val_fraction")
    missing = sorted(set(classes) - {r.label for r in parts["train"]})
    if missing:
        raise UserError(f"{root}: class {missing[0]!r} has no training images; give it some, or remove it")
    train = LabelledFiles(parts["train"], classes, Path(root) / "train", train_tf, max_sides[0])
    val = LabelledFiles(parts["val"], classes, Path(root) / "val", val_tf, max_sides[1])
    test_rows = [r for r in rows if r.split == "test"]
    test = LabelledFiles(test_rows, classes, Path(root) / "test", val_tf, max_sides[1]) if test_rows else None
    pair = SplitPair(train, val, classes, None, list(notes or []), test=test)
    pair.artifacts[SPLITS_FILE] = splits_writer(rows, Path(root))
    return pair
