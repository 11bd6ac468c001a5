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

from pathlib import Path
from typing import Any

from torchvision.datasets import ImageFolder

from inceptionlab.data.io.decode import ImageReadError, UnreadableFile, load_rgb
from inceptionlab.data.io.image_files import ClassFolders, list_class_folders
from inceptionlab.data.splits import SplitPair
from inceptionlab.errors import UserError


class RobustImageFolder(ImageFolder):
    """ImageFolder whose items are `(image, target)`, or `(None, UnreadableFile)` for a file that cannot
    be decoded. Classes and files are image_files.py's rule (`list_class_folders`), not torchvision's."""

    def __init__(self, root: Path, transform: Any = None):
        self.listing: ClassFolders = list_class_folders(Path(root))
        self.ignored_files: list[str] = self.listing.ignored
        super().__init__(str(root), transform=transform, loader=load_rgb)

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


def image_folder_splits(root: Path, train_split: str, val_split: str, train_tf: Any, val_tf: Any) -> SplitPair:
    train = RobustImageFolder(root / train_split, transform=train_tf)
    val = RobustImageFolder(root / val_split, transform=val_tf)
    check_same_classes(root / train_split, train.classes, root / val_split, val.classes)
    notes = []
    ignored = len(train.ignored_files) + len(val.ignored_files)
    if ignored:
        example = (train.ignored_files + val.ignored_files)[0]
        notes.append(f"ignored {ignored} non-image file(s), e.g. {example}")
    for split in (train, val):
        loose = split.listing.loose
        if loose:
            notes.append(f"ignored {len(loose)} image(s) directly in {split.root}/, not in a class folder, "
                         f"e.g. {Path(loose[0]).name}: move them into {split.root}/<class>/ to use them")
    return SplitPair(train, val, list(train.classes), None, notes)
