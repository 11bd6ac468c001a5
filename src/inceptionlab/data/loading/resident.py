"""`data.loader=resident`: a whole split kept in memory (on the device when it fits), batched by index.

Two loaders. `ResidentLoader` serves in-memory arrays (CIFAR-10, Fashion-MNIST, tokenised IMDB).
`ResidentImageLoader` serves image folders: decoded once, kept as uint8, augmented on the device.
The split's uint8 cache (decoded_cache.py) lives on the device, or in pinned host memory when it does not
fit there; each batch is one gather plus one `DeviceAugment` call that returns normalised floats in
the training dtype and memory format. The sample order is `EpochSampler`'s (a function of seed and
epoch); the crop/flip RNG of batch b is a generator seeded from (seed, epoch, rank, b), so a run
resumed mid-epoch draws exactly the boxes an uninterrupted run draws.

Nothing per step makes the host wait for a GPU: each epoch's order goes to the device once (from
pinned memory, without blocking) and every batch's index is a slice of it; the host keeps its own copy
only to gather from a pinned host cache and to see which batches hold portraits. Training batches are
all full (the last partial one is dropped, `EpochSampler.batches`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch

from inceptionlab.data.loading.decoded_cache import decode_split, estimated_bytes, load_or_build
from inceptionlab.data.loading.image_options import DeviceImageOptions, batch_seed, image_folder_of
from inceptionlab.data.loading.sampler import EpochSampler, default_num_workers
from inceptionlab.data.splits import ArraySplit
from inceptionlab.data.transforms.device import DeviceAugment, upright
from inceptionlab.data.transforms.device_ops import to_device

if TYPE_CHECKING:
    from inceptionlab.data.loading.decoded_cache import ImageCache

# Share of free memory the cache may take: the model, activations and optimizer need the rest
# (Inception v3 at batch 32, 299 px: ~9 GB of activations on a GPU).
MEMORY_SHARE = 0.25


class ResidentLoader:
    """A whole in-memory split on the device, served as shuffled index batches.

    For datasets that fit in memory (CIFAR-10, Fashion-MNIST, tokenised IMDB) this replaces per-sample
    `__getitem__` calls, collation and worker processes with one gather per batch on the device.
    Same order and resume semantics as the DataLoader path (`EpochSampler`).
    """

    def __init__(self, split: ArraySplit, batch_size: int, sampler: EpochSampler, device: torch.device,
                 drop_last: bool = False):
        self.inputs = split.inputs.to(device)
        self.targets = split.targets.to(device)
        self.batch_size, self.sampler, self.device, self.drop_last = batch_size, sampler, device, drop_last
        self.skipped: list[str] = []

    @property
    def yields_normalised(self) -> bool:
        """False: the split's uint8 images (or token ids) as stored; the session normalises them."""
        return False

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.sampler.set_epoch(epoch, start)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = to_device(self.sampler.batched_order(self.batch_size, self.drop_last), self.device)
        for batch in order.split(self.batch_size):
            yield self.inputs[batch], self.targets[batch]

    def __len__(self) -> int:
        return self.sampler.batches(self.batch_size, self.drop_last)


@dataclass
class ResidentImageLoader:
    """Yields `(normalised images, targets)` batches (the `Loader` protocol of loaders.py)."""

    images: torch.Tensor  # uint8 (N, 3, H, W), on the device or pinned on the host; portraits stored turned
    heights: torch.Tensor  # upright, on the device
    widths: torch.Tensor
    targets: torch.Tensor
    batch_size: int
    sampler: EpochSampler
    device: torch.device
    augment: DeviceAugment
    seed: int = 0
    rank: int = 0
    skipped: list[str] = field(default_factory=list)
    drop_last: bool = False  # training: every batch full
    portrait: torch.Tensor | None = None  # bool (N,) on the host: which images are stored turned

    @property
    def yields_normalised(self) -> bool:
        """True: `DeviceAugment` already normalised these batches; the session must not do it again."""
        return True

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.sampler.set_epoch(epoch, start)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        host_order = self.sampler.batched_order(self.batch_size, self.drop_last)
        order = to_device(host_order, self.device)  # once per epoch; each step's index is a slice of it
        first_batch = self.sampler.start // self.batch_size
        generator = torch.Generator(device=self.device)
        pinned_host_cache = self.images.device.type == "cpu" and self.device.type != "cpu"
        batches = zip(host_order.split(self.batch_size), order.split(self.batch_size))
        for number, (host_index, index) in enumerate(batches, start=first_batch):
            generator.manual_seed(batch_seed(self.seed, self.sampler.epoch, self.rank, number))
            if pinned_host_cache:  # gather on the host, copy the uint8 batch only
                pixels = self.images[host_index].pin_memory().to(self.device, non_blocking=True)
            else:
                pixels = self.images[index]
            heights, widths = self.heights[index], self.widths[index]
            if self.portrait is not None and bool(self.portrait[host_index].any()):  # a host tensor: no sync
                pixels = upright(pixels, heights, widths)
            yield self.augment(pixels, heights, widths, generator), self.targets[index]

    def __len__(self) -> int:
        return self.sampler.batches(self.batch_size, self.drop_last)


def available_host_bytes() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def placement(needed: int, device: torch.device, sharers: int = 1) -> torch.device | None:
    """Where a cache of `needed` bytes goes: the device, host memory (pinned), or None (too big).

    `sharers`: processes on this node that each keep a copy (torchrun's local world size). Each rank's
    GPU is its own; host memory is shared, so each may take its share of the host's quarter."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if needed <= MEMORY_SHARE * free:
            return device
    if needed <= MEMORY_SHARE * available_host_bytes() / max(1, sharers):
        return torch.device("cpu")
    return None


def resident_image_bytes(dataset: Any, options: DeviceImageOptions, device: torch.device, *, required: bool,
                         sharers: int = 1) -> int:
    """Bytes `resident_image_loader` would keep on `device` (a GPU) for `dataset`, decided as it decides, before
    it runs: 0 for a split that is not an image folder, goes to host memory, or does not fit."""
    found = image_folder_of(dataset)
    if found is None or device.type != "cuda":
        return 0
    folder, indices = found
    estimate = estimated_bytes(folder.samples, Path(folder.root), options.cache_size)
    if not required and placement(estimate, device, sharers) is None:
        return 0
    served = estimate * len(indices) // max(1, len(folder.samples))  # the loader keeps its indices' images
    return served if placement(served, device, sharers) == device else 0


def resident_image_loader(
    dataset: Any,
    options: DeviceImageOptions,
    *,
    batch_size: int,
    train: bool,
    seed: int,
    rank: int,
    world_size: int,
    device: torch.device,
    num_workers: int | None,
    required: bool,
    weights: torch.Tensor | None = None,
    sharers: int = 1,
) -> ResidentImageLoader | None:
    """A ResidentImageLoader for an image folder that fits in memory; None means use the DataLoader path.

    `required` (data.loader=resident) skips the size check: the user asked for it. `sharers`: processes
    on this node (each keeps a copy in host memory when it does not go to its GPU).
    """
    found = image_folder_of(dataset)
    if found is None:
        return None
    folder, indices = found
    split_root = Path(folder.root)
    estimate = estimated_bytes(folder.samples, split_root, options.cache_size)
    if not required and placement(estimate, device, sharers) is None:
        return None
    workers = default_num_workers() if num_workers is None else num_workers
    sample = 2 * len(indices) < len(folder.samples)  # data.max_*_samples took under half of the split
    cache = load_or_build(folder.samples, split_root, options.cache_size, workers, build=not sample,
                          interpolation=options.interpolation)
    if cache is None:
        # No current cache: decode only the sample, in memory (16 of tiny-imagenet's 100,000 images:
        # milliseconds instead of a minute for all).
        cache = decode_split([folder.samples[i] for i in indices], options.cache_size, workers, options.interpolation)
        indices = list(range(len(indices)))
    return _loader_from_cache(cache, indices, options, batch_size, train, seed, rank, world_size, device, weights,
                              sharers)


def _loader_from_cache(cache: ImageCache, indices: list[int], options: DeviceImageOptions, batch_size: int,
                       train: bool, seed: int, rank: int, world_size: int, device: torch.device,
                       weights: torch.Tensor | None = None, sharers: int = 1) -> ResidentImageLoader:
    chosen = torch.tensor(indices, dtype=torch.long)
    readable = chosen[cache.readable[chosen]]
    if weights is not None:  # one per position of `indices`: keep the readable ones'
        weights = torch.as_tensor(weights)[cache.readable[chosen]]
    reasons = {str(path): path for path in cache.unreadable}
    unreadable = [reasons[cache.paths[i]] for i in chosen[~cache.readable[chosen]].tolist()]
    images = cache.images[readable]
    where = placement(images.numel(), device, sharers) or torch.device("cpu")
    images = images.to(where)
    if where.type == "cpu" and device.type == "cuda":
        images = images.pin_memory()
    heights, widths = cache.heights[readable], cache.widths[readable]
    portrait = heights > widths
    sampler = EpochSampler(len(readable), shuffle=train, seed=seed, rank=rank, world_size=world_size, pad=train,
                           weights=weights)
    return ResidentImageLoader(images, heights.to(device), widths.to(device), cache.targets[readable].to(device),
                               batch_size, sampler, device, options.augment(train), seed, rank, unreadable,
                               drop_last=train, portrait=portrait if bool(portrait.any()) else None)
