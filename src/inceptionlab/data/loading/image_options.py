"""What the two device-augmented image loaders share: their options, batch seeds, and which datasets qualify.

`resident.py` (an image folder decoded once and kept as uint8) and `streamed.py` (decoded batch by
batch in workers) both hand uint8 pixels to `DeviceAugment` and must draw the same crops and flips
for the same (seed, epoch, rank, batch), so these live here rather than in either of them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Subset

from inceptionlab import hardware
from inceptionlab.config import AugmentConfig, needed_cache_size
from inceptionlab.data.transforms.device import DEFAULT_RATIO, DeviceAugment
from inceptionlab.runtime import AUTOCAST_DTYPES


@dataclass(frozen=True)
class DeviceImageOptions:
    """What the device augmentation needs from the recipe (data section, precision, memory format)."""

    train_size: int = 299
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = DEFAULT_RATIO
    hflip: bool = False
    val_resize_size: int = 342
    val_crop_size: int = 299
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    cache_size: int = 342  # shorter side kept, px (decoded_cache.kept_size)
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    augmentation: AugmentConfig = field(default_factory=AugmentConfig)  # policy and erasing after the crop (training)
    interpolation: str = "bilinear"  # the recipe's data.interpolation: the cache's resize and the device resampler

    @classmethod
    def from_recipe(cls, recipe: Any, device: torch.device | str = "cpu") -> "DeviceImageOptions":
        """The recipe's values; a training run has decided `auto` before (engine/speed.py), anything
        else that still says `auto` gets the probe's rule: bf16 only where the device has bf16 units
        (emulated bf16 resampled 64 -> 299 px at 60 img/s on an AVX2-only AMD EPYC, fp32 at ~1,100, both
        with the dense products of the time)."""
        data, train = recipe.data, recipe.train
        precision = train.precision
        if precision == "auto":
            precision = "bf16" if hardware.device_facts(device).bf16 else "fp32"
        # channels_last auto: the resampling writes NHWC, so keeping it costs no copy.
        channels_last = train.channels_last if isinstance(train.channels_last, bool) else True
        return cls(data.train_crop_size, tuple(data.train_crop_scale), DEFAULT_RATIO, data.hflip,
                   data.val_resize_size, data.val_crop_size, tuple(data.mean), tuple(data.std),
                   data.cache_size or needed_cache_size(data), AUTOCAST_DTYPES[precision] or torch.float32,
                   channels_last, recipe.augment, data.interpolation or "bilinear")

    def augment(self, train: bool) -> Any:
        """The batch transform: `DeviceAugment`, or for training with a policy or erasing, `PolicyAugment`
        (the same call)."""
        if train:
            crop = DeviceAugment(self.train_size, self.mean, self.std, True, self.scale, self.ratio, self.hflip,
                                 dtype=self.dtype, channels_last=self.channels_last, interpolation=self.interpolation)
            if not self.augmentation.per_image:
                return crop
            # start-up time: the policies read torchvision's tables; imported only when a recipe asks for one
            from inceptionlab.data.transforms.device_policy import PolicyAugment
            from inceptionlab.data.transforms.policies import batch_policy

            return PolicyAugment(crop, batch_policy(self.augmentation), self.augmentation.random_erasing)
        return DeviceAugment(self.val_crop_size, self.mean, self.std, False, resize_size=self.val_resize_size,
                             dtype=self.dtype, channels_last=self.channels_last, interpolation=self.interpolation)


def batch_seed(seed: int, epoch: int, rank: int, batch: int) -> int:
    """A 64-bit seed per (seed, epoch, rank, batch): batches draw independent, replayable streams."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{rank}/{batch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # manual_seed takes [0, 2**63) on every device


def image_folder_of(dataset: Any) -> tuple[Any, list[int]] | None:
    """(ImageFolder, indices into its samples) for an image folder or a Subset of one; None otherwise."""
    from torchvision.datasets import ImageFolder  # start-up time: torchvision only when images are read

    if isinstance(dataset, Subset) and isinstance(dataset.dataset, ImageFolder):
        return dataset.dataset, list(dataset.indices)
    if isinstance(dataset, ImageFolder):
        return dataset, list(range(len(dataset)))
    return None
