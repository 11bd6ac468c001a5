"""Training transforms built from the recipe. Evaluation's transform belongs to the model's spec
(`ModelSpec.eval_transform`, `ModelSpec.normalizer`): preprocessing travels with the weights.

Transforms stop at uint8 CHW tensors; the spec's normaliser turns a batch into normalised floats on
the device. Moving uint8 instead of float32 cuts host-to-device traffic 4x and the float maths runs
once per batch on the accelerator instead of per image in a worker process.
"""

from __future__ import annotations

from torch import nn
from torchvision.transforms import InterpolationMode, v2

from inceptionlab.config import DataConfig


def train_transform(cfg: DataConfig) -> v2.Compose:
    """The guide's RandomResizedCrop(train_crop_size, bilinear), plus an optional flip."""
    steps: list[nn.Module] = [
        v2.ToImage(),
        v2.RandomResizedCrop(
            cfg.train_crop_size,
            scale=tuple(cfg.train_crop_scale),
            interpolation=InterpolationMode(cfg.interpolation),
            antialias=True,
        ),
    ]
    if cfg.hflip:
        steps.append(v2.RandomHorizontalFlip())
    return v2.Compose(steps)
