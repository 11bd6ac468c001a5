"""Write CIFAR-10 batches in the original "python version" format, for tests only.

The real batches are not in ../shared/data; tests build them from the 200 real CIFAR-10 PNGs and
load them back through the library's reader (`inceptionlab.data.datasets.cifar10`), which only reads.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import torch

from inceptionlab.data.datasets.cifar10 import IMAGE_SHAPE, ROW_BYTES


def dump_pickle_atomically(path: Path, content: dict) -> Path:
    """Pickle to a temporary sibling, then rename: `path` never holds a partial file.

    Protocol 4: protocol 2 would pickle bytes through `_codecs.encode` and protocol 5 arrays
    through `numpy._core.numeric._frombuffer`, both of which `RestrictedUnpickler` refuses.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            pickle.dump(content, f, protocol=4)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def as_uint8_images(images) -> np.ndarray:
    if isinstance(images, torch.Tensor):
        images = images.detach().cpu().numpy()
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != IMAGE_SHAPE:
        raise ValueError(f"expected uint8 images (N, 3, 32, 32), got {images.dtype} {images.shape}")
    return np.ascontiguousarray(images)


def write_cifar10_batch(
    path: str | os.PathLike,
    images,
    labels: list[int],
    batch_label: str = "batch written by inceptionlab tests",
    filenames: list[str] | None = None,
) -> Path:
    """Write `images` (uint8 (N, 3, 32, 32), numpy or tensor) and `labels` as an original-format batch."""
    array = as_uint8_images(images)
    labels = [int(label) for label in labels]
    if len(labels) != len(array):
        raise ValueError(f"{len(array)} images but {len(labels)} labels")
    names = filenames if filenames is not None else [f"image_{i:05d}.png" for i in range(len(array))]
    content = {
        b"batch_label": batch_label.encode(),
        b"labels": labels,
        b"data": array.reshape(len(array), ROW_BYTES),  # (3, 32, 32) flattens to R, G, B planes
        b"filenames": [name.encode() for name in names],
    }
    return dump_pickle_atomically(Path(path), content)


def write_cifar10_meta(path: str | os.PathLike, label_names: list[str]) -> Path:
    """Write a `batches.meta` in the original format."""
    content = {
        b"num_cases_per_batch": 10000,
        b"label_names": [name.encode() for name in label_names],
        b"num_vis": ROW_BYTES,
    }
    return dump_pickle_atomically(Path(path), content)
