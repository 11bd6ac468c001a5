"""Dataset readers by name: a recipe's `data.reader` picks one; the engine never asks which.

An image reader says where its ImageFolder root is (preparing it first if it can) and, optionally,
what the human labels of its folder names are. Splits are `<root>/<split>/<class>/...`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from inceptionlab.config import DataConfig
from inceptionlab.data.imagefolder import RobustImageFolder, SplitPair, image_folder_splits
from inceptionlab.errors import UserError


def _data_root(cfg: DataConfig) -> Path:
    if not cfg.root:
        raise UserError("no dataset folder: pass --data DIR (or set data.root in the recipe)")
    return Path(cfg.root).expanduser()


def _tiny_imagenet_root(cfg: DataConfig) -> Path:
    root = _data_root(cfg)
    if (root / "tiny-imagenet-200").is_dir() and not (root / "wnids.txt").exists():
        root = root / "tiny-imagenet-200"
    if (root / cfg.val_split / "images").is_dir():
        raise UserError(
            f"{root / cfg.val_split}: validation images are not grouped by class yet; "
            f"run `inceptionlab data tiny-imagenet --root {root}` first"
        )
    return root


def _tiny_imagenet_labels(root: Path, class_names: list[str]) -> list[str]:
    from inceptionlab.data.tiny_imagenet import read_class_names

    names = read_class_names(root)
    return [names.get(wnid, wnid) for wnid in class_names]


def _digits_root(cfg: DataConfig) -> Path:
    from inceptionlab.data.digits import ensure_digits_imagefolder

    return ensure_digits_imagefolder(_data_root(cfg))


@dataclass(frozen=True)
class ImageReader:
    root: Callable[[DataConfig], Path]
    labels: Callable[[Path, list[str]], list[str]] | None = None


READERS: dict[str, ImageReader] = {
    "imagefolder": ImageReader(_data_root),
    "tiny_imagenet": ImageReader(_tiny_imagenet_root, _tiny_imagenet_labels),
    "digits": ImageReader(_digits_root),
}


def _reader(cfg: DataConfig) -> ImageReader:
    try:
        return READERS[cfg.reader]
    except KeyError:
        raise UserError(f"data.reader={cfg.reader!r} is not one of {', '.join(READERS)}") from None


def read_splits(cfg: DataConfig, train_tf: Any, val_tf: Any) -> SplitPair:
    """Train and val datasets that agree on their classes."""
    reader = _reader(cfg)
    root = reader.root(cfg)
    splits = image_folder_splits(root, cfg.train_split, cfg.val_split, train_tf, val_tf)
    if reader.labels is not None:
        splits.class_labels = reader.labels(root, splits.class_names)
    return splits


def read_eval_split(cfg: DataConfig, transform: Any, split: str | None = None) -> RobustImageFolder:
    """One split (default: the validation split) for evaluation."""
    root = _reader(cfg).root(cfg)
    return RobustImageFolder(root / (split or cfg.val_split), transform=transform)
