"""DataLoader construction: epoch-seeded shuffling that resumes mid-epoch, sharding across ranks.

The order of an epoch is a function of (seed, epoch) alone, so a run resumed after a crash sees the
same batches as one that never stopped; `start` skips the samples already consumed.
"""

from __future__ import annotations

from typing import Any, Iterator, Sized

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from inceptionlab.data.arrays import ArraySplit
from inceptionlab.data.image_loader import resident_image_loader
from inceptionlab.data.sampling import EpochSampler, SkipTrackingLoader, default_num_workers
from inceptionlab.data.splits import collate_skipping_unreadable
from inceptionlab.data.stream_loader import stream_image_loader

# data.loader choices, as make_loader reads them. auto: in-memory splits and image folders that fit are
# resident, bigger image folders stream; stream: image folders decoded in workers, augmented on the device;
# workers: per-image crops in DataLoader workers (the guide's path, uint8 batches).
LOADERS = ("auto", "resident", "stream", "workers")


class ResidentLoader:
    """A whole in-memory split on the device, served as shuffled index batches.

    For datasets that fit in memory (CIFAR-10, Fashion-MNIST, tokenised IMDB) this replaces per-sample
    `__getitem__` calls, collation and worker processes with one gather per batch on the device.
    Same order and resume semantics as the DataLoader path (`EpochSampler`).
    """

    def __init__(self, split: ArraySplit, batch_size: int, sampler: EpochSampler, device: torch.device):
        self.inputs = split.inputs.to(device)
        self.targets = split.targets.to(device)
        self.batch_size, self.sampler, self.device = batch_size, sampler, device
        self.skipped: list[str] = []

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.sampler.set_epoch(epoch, start)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.tensor(list(self.sampler), dtype=torch.long, device=self.device)
        for batch in order.split(self.batch_size):
            yield self.inputs[batch], self.targets[batch]

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)


class _ArrayDataset(Dataset):
    """ArraySplit as a map-style dataset, for the worker-process path (`data.loader=workers`)."""

    def __init__(self, split: ArraySplit):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.split.inputs[index], int(self.split.targets[index])


def cap_samples(dataset: Dataset, limit: int | None, seed: int) -> Dataset:
    """A fixed random subset of `limit` samples (for smoke runs); the whole dataset otherwise."""
    size = len(dataset)  # type: ignore[arg-type]
    if limit is None or limit >= size:
        return dataset
    generator = torch.Generator().manual_seed(seed)
    keep = torch.randperm(size, generator=generator)[:limit].sort().values.tolist()
    if isinstance(dataset, ArraySplit):
        return ArraySplit(dataset.inputs[keep], dataset.targets[keep], dataset.class_names)
    return Subset(dataset, keep)


def make_loader(
    dataset: Sized,
    *,
    batch_size: int,
    train: bool,
    seed: int,
    num_workers: int | None,
    rank: int = 0,
    world_size: int = 1,
    pin_memory: bool = False,
    device: torch.device | None = None,
    mode: str = "auto",
    images: Any = None,
) -> SkipTrackingLoader | ResidentLoader:
    """Resident (on-device index batches) for in-memory splits unless mode="workers"; DataLoader otherwise.

    With `images` (a ResidentImageOptions), an image folder that fits in memory (or any, for
    mode="resident") is decoded once and augmented on the device (data/image_loader.py); one that
    does not fit (or any, for mode="stream") is decoded in workers batch by batch and augmented on
    the device (data/stream_loader.py).
    """
    if images is not None and mode != "workers":
        on_images = dict(batch_size=batch_size, train=train, seed=seed, rank=rank, world_size=world_size,
                         device=device or torch.device("cpu"), num_workers=num_workers)
        if mode != "stream":
            resident = resident_image_loader(dataset, images, required=mode == "resident", **on_images)
            if resident is not None:
                return resident  # type: ignore[return-value]
        streamed = stream_image_loader(dataset, images, **on_images)
        if streamed is not None:
            return streamed
    sampler = EpochSampler(len(dataset), shuffle=train, seed=seed, rank=rank, world_size=world_size, pad=train)
    if isinstance(dataset, ArraySplit):
        if mode in ("auto", "resident"):
            return ResidentLoader(dataset, batch_size, sampler, device or torch.device("cpu"))
        dataset = _ArrayDataset(dataset)
    workers = default_num_workers() if num_workers is None else num_workers
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        dataset,  # type: ignore[arg-type]
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate_skipping_unreadable,
        pin_memory=pin_memory,
        drop_last=False,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
        generator=generator,
    )
    return SkipTrackingLoader(loader, generator, seed)
