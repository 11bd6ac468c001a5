"""Model inputs for checking and timing: real images made into the model's input by its spec alone.

Which pictures: `--images` when given, else the sample photos (the package's own, or
INCEPTIONLAB_SAMPLE_IMAGES) and a run's validation images. `load_images` turns them into uint8
NCHW through `ModelSpec.eval_transform` (the one preprocessing path), `normalize` into what an
exported graph takes; `random_inputs` stands in where no real image exists (latency does not
depend on the values).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from inceptionlab.config import load_recipe
from inceptionlab.data.datasets.file_list import read_splits_file, recorded_split
from inceptionlab.data.io.decode import ImageReadError, load_rgb
from inceptionlab.data.io.image_files import expand_image_paths, sample_image_files
from inceptionlab.data.readers import READERS
from inceptionlab.errors import UserError
from inceptionlab.infer.source import ModelSource
from inceptionlab.models.spec import ModelSpec

RANDOM_SEED = 0


def run_val_images(run_dir: Path | None) -> list[Path]:
    """The run's validation images (from its recipe), or [] when the data has moved or is arrays."""
    if run_dir is None or not (Path(run_dir) / "recipe.resolved.yaml").is_file():
        return []

    try:
        data = load_recipe(Path(run_dir) / "recipe.resolved.yaml", recorded_split(run_dir)).data
        reader = READERS.get(data.reader)
        if reader is None:  # array datasets (CIFAR-10, MNIST) have no image files
            return []
        if data.split_file:  # the run split one folder itself: its validation files are listed there
            return [row.file for row in read_splits_file(Path(data.split_file), reader.root(data)) if row.split == "val"]
        files, _ = expand_image_paths([reader.root(data) / data.val_split])
    except UserError:
        return []
    return files


def default_image_files(source: ModelSource) -> list[Path]:
    """Real images to check and calibrate on: the sample pictures, then the run's val data."""
    return sample_image_files() + run_val_images(source.run_dir)


def image_files(folders: list[Path] | None, source: ModelSource) -> list[Path]:
    if not folders:
        return default_image_files(source)

    files, errors = expand_image_paths(list(folders))
    if errors:
        where, message = errors[0]
        raise UserError(f"{where}: {message}; pass a folder of images with --images")
    return files


def spread(files: list[Path], count: int) -> list[Path]:
    """`count` files spread evenly over the list (every class of a sorted ImageFolder, not the first)."""
    if len(files) <= count:
        return list(files)
    step = len(files) / count
    return [files[int(i * step)] for i in range(count)]


def shuffled(files: list[Path], seed: int = RANDOM_SEED) -> list[Path]:
    files = list(files)
    random.Random(seed).shuffle(files)
    return files


def load_images(files: list[Path], spec: ModelSpec) -> np.ndarray:
    """uint8 NCHW array of the files after the spec's eval transform; unreadable files are skipped."""
    transform = spec.eval_transform()
    images = []
    for path in files:
        try:
            # The spec's transform converts channels too (one grey channel for Fashion-MNIST-style models).
            images.append(torch.as_tensor(transform(load_rgb(path, max_side=spec.resize_size))))
        except (ImageReadError, OSError, ValueError):
            continue
    if not images:
        return np.zeros((0, *spec.input_shape), np.uint8)
    return torch.stack(images).numpy()


def normalize(images: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """uint8 NCHW -> float32 NCHW, (x / 255 - mean) / std: what the exported graph expects."""
    return spec.normalizer()(torch.from_numpy(images)).numpy()


def random_inputs(count: int, shape: tuple[int, ...], seed: int = RANDOM_SEED) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, *shape)).astype(np.float32)
