"""`data.loader=resident` for image folders: decoded once, kept as uint8, augmented on the device.

The split's uint8 cache (image_cache.py) lives on the device, or in pinned host memory when it does not
fit there; each batch is one gather plus one `DeviceAugment` call that returns normalised floats in
the training dtype and memory format. The sample order is `EpochSampler`'s (a function of seed and
epoch); the crop/flip RNG of batch b is a generator seeded from (seed, epoch, rank, b), so a run
resumed mid-epoch draws exactly the boxes an uninterrupted run draws.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch.utils.data import Subset

from inceptionlab.data.device_aug import DEFAULT_RATIO, DeviceAugment
from inceptionlab.data.sampling import EpochSampler, default_num_workers
from inceptionlab.runtime import AUTOCAST_DTYPES

if TYPE_CHECKING:
    from inceptionlab.data.image_cache import ImageCache

# Share of free memory the cache may take: the model, activations and optimizer need the rest
# (Inception v3 at batch 32, 299 px: ~9 GB of activations on a GPU).
MEMORY_SHARE = 0.25


@dataclass(frozen=True)
class ResidentImageOptions:
    """What the device augmentation needs from the recipe (data section, precision, memory format)."""

    train_size: int = 299
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = DEFAULT_RATIO
    hflip: bool = False
    val_resize_size: int = 342
    val_crop_size: int = 299
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    cache_size: int = 342
    dtype: torch.dtype = torch.float32
    channels_last: bool = False

    @classmethod
    def from_recipe(cls, recipe: Any) -> "ResidentImageOptions":
        data = recipe.data
        return cls(data.train_crop_size, tuple(data.train_crop_scale), DEFAULT_RATIO, data.hflip,
                   data.val_resize_size, data.val_crop_size, tuple(data.mean), tuple(data.std),
                   data.cache_size, AUTOCAST_DTYPES[recipe.train.precision] or torch.float32,
                   recipe.train.channels_last)

    def augment(self, train: bool) -> DeviceAugment:
        if train:
            return DeviceAugment(self.train_size, self.mean, self.std, True, self.scale, self.ratio, self.hflip,
                                 dtype=self.dtype, channels_last=self.channels_last)
        return DeviceAugment(self.val_crop_size, self.mean, self.std, False, resize_size=self.val_resize_size,
                             dtype=self.dtype, channels_last=self.channels_last)


def batch_seed(seed: int, epoch: int, rank: int, batch: int) -> int:
    """A 64-bit seed per (seed, epoch, rank, batch): batches draw independent, replayable streams."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{rank}/{batch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # manual_seed takes [0, 2**63) on every device


@dataclass
class ResidentImageLoader:
    """Yields `(normalised images, targets)` batches; same interface as ResidentLoader/SkipTrackingLoader."""

    images: torch.Tensor  # uint8 (N, 3, H, W), on the device or pinned on the host
    heights: torch.Tensor  # on the device
    widths: torch.Tensor
    targets: torch.Tensor
    batch_size: int
    sampler: EpochSampler
    device: torch.device
    augment: DeviceAugment
    seed: int = 0
    rank: int = 0
    skipped: list[str] = field(default_factory=list)
    yields_normalised: bool = True  # the session must not normalise these batches again

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.sampler.set_epoch(epoch, start)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.tensor(list(self.sampler), dtype=torch.long)
        first_batch = self.sampler.start // self.batch_size
        generator = torch.Generator(device=self.device)
        for number, batch in enumerate(order.split(self.batch_size), start=first_batch):
            generator.manual_seed(batch_seed(self.seed, self.sampler.epoch, self.rank, number))
            index = batch.to(self.images.device)
            pixels = self.images[index]
            if pixels.device != self.device:  # pinned host cache: copy the gathered uint8 batch only
                pixels = pixels.pin_memory().to(self.device, non_blocking=True)
            index = batch.to(self.device)
            yield self.augment(pixels, self.heights[index], self.widths[index], generator), self.targets[index]

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)


def image_folder_of(dataset: Any) -> tuple[Any, list[int]] | None:
    """(ImageFolder, indices into its samples) for an image folder or a Subset of one; None otherwise."""
    from torchvision.datasets import ImageFolder  # start-up time: torchvision only when images are read

    if isinstance(dataset, Subset) and isinstance(dataset.dataset, ImageFolder):
        return dataset.dataset, list(dataset.indices)
    if isinstance(dataset, ImageFolder):
        return dataset, list(range(len(dataset)))
    return None


def available_host_bytes() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def placement(needed: int, device: torch.device) -> torch.device | None:
    """Where a cache of `needed` bytes goes: the device, host memory (pinned), or None (too big)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if needed <= MEMORY_SHARE * free:
            return device
    if needed <= MEMORY_SHARE * available_host_bytes():
        return torch.device("cpu")
    return None


def resident_image_loader(
    dataset: Any,
    options: ResidentImageOptions,
    *,
    batch_size: int,
    train: bool,
    seed: int,
    rank: int,
    world_size: int,
    device: torch.device,
    num_workers: int | None,
    required: bool,
) -> ResidentImageLoader | None:
    """A ResidentImageLoader for an image folder that fits in memory; None means use the DataLoader path.

    `required` (data.loader=resident) skips the size check: the user asked for it.
    """
    found = image_folder_of(dataset)
    if found is None:
        return None
    from inceptionlab.data.image_cache import decode_split, estimated_bytes, load_or_build  # start-up time: PIL

    folder, indices = found
    split_root = Path(folder.root)
    if not required and placement(estimated_bytes(folder.samples, split_root, options.cache_size), device) is None:
        return None
    workers = default_num_workers() if num_workers is None else num_workers
    sample = 2 * len(indices) < len(folder.samples)  # data.max_*_samples took under half of the split
    cache = load_or_build(folder.samples, split_root, options.cache_size, workers, build=not sample)
    if cache is None:
        # No current cache: decode only the sample, in memory (16 of tiny-imagenet's 100,000 images:
        # milliseconds instead of a minute for all).
        cache = decode_split([folder.samples[i] for i in indices], options.cache_size, workers)
        indices = list(range(len(indices)))
    return _loader_from_cache(cache, indices, options, batch_size, train, seed, rank, world_size, device)


def _loader_from_cache(cache: ImageCache, indices: list[int], options: ResidentImageOptions, batch_size: int,
                       train: bool, seed: int, rank: int, world_size: int, device: torch.device) -> ResidentImageLoader:
    chosen = torch.tensor(indices, dtype=torch.long)
    readable = chosen[cache.readable[chosen]]
    unreadable = [cache.paths[i] for i in chosen[~cache.readable[chosen]].tolist()]
    images = cache.images[readable]
    where = placement(images.numel(), device) or torch.device("cpu")
    images = images.to(where)
    if where.type == "cpu" and device.type == "cuda":
        images = images.pin_memory()
    sampler = EpochSampler(len(readable), shuffle=train, seed=seed, rank=rank, world_size=world_size, pad=train)
    return ResidentImageLoader(images, cache.heights[readable].to(device), cache.widths[readable].to(device),
                               cache.targets[readable].to(device), batch_size, sampler, device,
                               options.augment(train), seed, rank, unreadable)
