"""Which files a check looks at: the data set's splits and classes, read by the rule training reads them by.

Layouts, as the readers take them:
- split folders: `DIR/train/<class>/...`, `DIR/val/<class>/...` (and `DIR/test/...` when present);
- one folder of class folders without splits (`DIR/<class>/...`): the split `all`;
- a labels CSV (`file,label[,split]`, file relative to the CSV's folder): data/datasets/file_list.py.

Split folders are read by `file_list.list_class_folder`, the rule the readers use for class folders
(dot-names count for nothing, folder links are followed once, class names are Unicode NFC, an image is
a visible file with an image extension), so a check sees what training sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from inceptionlab.data.datasets.file_list import list_class_folder, read_labels_csv
from inceptionlab.errors import UserError

SPLIT_NAMES = ("train", "val", "test")  # the split folders a data set may have, in this order


@dataclass
class SplitListing:
    name: str  # train | val | test | all
    root: Path
    classes: list[str] = field(default_factory=list)  # sorted; index = label; [] for an unlabelled split
    samples: list[tuple[str, int]] = field(default_factory=list)  # (file, label); label -1: unlabelled
    loose: list[str] = field(default_factory=list)  # images directly in the split folder, in no class folder
    ignored: list[str] = field(default_factory=list)  # files in class folders without an image extension

    @property
    def files(self) -> list[str]:
        return [path for path, _ in self.samples]


@dataclass
class DataListing:
    root: Path
    layout: str  # splits | single | csv
    splits: list[SplitListing]
    notes: list[str] = field(default_factory=list)

    @property
    def images(self) -> int:
        return sum(len(s.samples) for s in self.splits)


def list_split(name: str, root: Path) -> SplitListing:
    """A split folder by the rule training reads class folders by (file_list.list_class_folder)."""
    folder = list_class_folder(root)
    return SplitListing(name, Path(root), folder.classes, folder.samples, folder.loose, folder.ignored)


def list_dataset(root: Path, labels_csv: Path | None = None) -> DataListing:
    """The data set under `root` (split folders, or one folder of classes), or the files a labels CSV names."""
    root = Path(root)
    if labels_csv is not None:
        return _from_csv(Path(labels_csv))
    if not root.is_dir():
        raise UserError(f"{root}: no such folder; give the data set's folder (with train/ and val/, or class folders)")
    splits = [list_split(name, root / name) for name in SPLIT_NAMES if (root / name).is_dir()]
    if splits:
        return DataListing(root, "splits", [_unlabelled_if_flat(s, splits[0]) for s in splits])
    single = list_split("all", root)
    if not single.classes:
        raise UserError(f"{root}: no class folders and no train/ or val/ folder; expected {root}/<class>/<images> "
                        "or a labels CSV (--labels FILE.csv)")
    return DataListing(root, "single", [single])


def _unlabelled_if_flat(split: SplitListing, train: SplitListing) -> SplitListing:
    """A split whose one folder is `images/` beside a train split of many classes holds unlabelled images
    (Tiny ImageNet's test/, and its val/ before `inceptionlab data tiny-imagenet` sorts it by class)."""
    if split is train or split.classes != ["images"] or len(train.classes) < 2:
        return split
    return SplitListing(split.name, split.root, [], [(path, -1) for path, _ in split.samples], split.loose,
                        split.ignored)


def _from_csv(path: Path) -> DataListing:
    rows = read_labels_csv(path)
    classes = sorted({row.label for row in rows})
    index = {c: i for i, c in enumerate(classes)}
    names = list(dict.fromkeys(row.split or "all" for row in rows))
    splits = []
    for name in names:
        samples = [(str(row.file), index[row.label]) for row in rows if (row.split or "all") == name]
        splits.append(SplitListing(name, path.parent, classes, samples))
    return DataListing(path.parent, "csv", splits)
