"""Training transforms built from the recipe. Evaluation's transform belongs to the model's spec
(`ModelSpec.eval_transform`, `ModelSpec.normalizer`): preprocessing travels with the weights.

Transforms stop at uint8 CHW tensors; the spec's normaliser turns a batch into normalised floats on
the device. Moving uint8 instead of float32 cuts host-to-device traffic 4x and the float maths runs
once per batch on the accelerator instead of per image in a worker process.
"""

from __future__ import annotations

from torch import nn
from torchvision.transforms import InterpolationMode, v2

from inceptionlab.config import AugmentConfig, DataConfig
from inceptionlab.data.transforms.policies import mean_levels, torchvision_policy


def train_transform(cfg: DataConfig, augment: AugmentConfig | None = None) -> v2.Compose:
    """The guide's RandomResizedCrop(train_crop_size, bilinear), plus an optional flip; then the
    recipe's augmentation policy and random erasing (torchvision's, on the uint8 crop).

    Erasing runs before normalisation here (the batch is normalised on the device), so it fills the
    mean colour's uint8 level: within half a level of torchvision's references, which erase the
    normalised image with 0. The device path (device_policy.py) does the same.
    """
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
    if augment is not None:
        policy = torchvision_policy(augment)
        if policy is not None:
            steps.append(policy)
        if augment.random_erasing > 0:
            if cfg.mean is None:  # a programming error: the session resolves the data config first
                raise ValueError("random erasing fills the mean colour: resolve data.mean first (resolve_data_config)")
            steps.append(v2.RandomErasing(p=augment.random_erasing, value=mean_levels(cfg.mean)))
    return v2.Compose(steps)
