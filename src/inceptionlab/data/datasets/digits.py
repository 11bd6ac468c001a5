"""The embedded demo dataset: scikit-learn's 1,797 real 8x8 handwritten digits as an ImageFolder.

The data ships inside the scikit-learn wheel, so the demo needs no network. The folder is written
to a temporary sibling and renamed into place, so an interrupted run leaves nothing half-made.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from inceptionlab.errors import UserError
from PIL import Image

SPLITS = ("train", "val", "test")
# 70% train, 20% val, 10% test (never seen in training: the demo predicts these).
_FRACTIONS = (0.7, 0.2, 0.1)
_SEED = 0


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits  # optional extra (demo): scikit-learn ships the digits
    except ImportError:
        raise UserError("the demo dataset needs scikit-learn: pip install 'inceptionlab[demo]'") from None
    digits = load_digits()
    # Values are 0..16 ink levels; scale to 0..255 and invert nothing: white digits on black.
    images = np.clip(digits.images * (255.0 / 16.0), 0, 255).astype(np.uint8)
    return images, digits.target


def split_indices(targets: np.ndarray) -> dict[str, list[int]]:
    """A stratified split: each digit keeps the same proportions in every split."""
    rng = np.random.default_rng(_SEED)
    out: dict[str, list[int]] = {s: [] for s in SPLITS}
    for label in np.unique(targets):
        idx = rng.permutation(np.flatnonzero(targets == label))
        cut1 = int(round(len(idx) * _FRACTIONS[0]))
        cut2 = cut1 + int(round(len(idx) * _FRACTIONS[1]))
        for split, part in zip(SPLITS, (idx[:cut1], idx[cut1:cut2], idx[cut2:])):
            out[split].extend(int(i) for i in part)
    return out


def _write_split(folder: Path, images: np.ndarray, targets: np.ndarray, indices: list[int]) -> None:
    for i in indices:
        class_dir = folder / str(int(targets[i]))
        class_dir.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[i], mode="L").save(class_dir / f"digit_{i:04d}.png")


def ensure_digits_imagefolder(root: Path) -> Path:
    """`root` with train/, val/, test/ class folders of PNGs; built once, then reused."""
    root = Path(root)
    if all((root / s).is_dir() for s in SPLITS):
        return root
    if root.exists() and any(root.iterdir()):
        raise UserError(f"{root}: exists but is not a digits ImageFolder; choose an empty or new folder")
    images, targets = load_digits_arrays()
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".digits-", dir=root.parent))
    try:
        for split, indices in split_indices(targets).items():
            _write_split(tmp / split, images, targets, indices)
        if root.exists():
            root.rmdir()  # empty (checked above)
        os.replace(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root
