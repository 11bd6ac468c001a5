"""Choosing the data path: `make_loader` returns one of four loaders, all with the `Loader` interface.

Every loader draws its order from `EpochSampler` (a function of seed and epoch alone, sharded across
ranks), so a run resumed after a crash sees the same batches as one that never stopped; `set_epoch`'s
`start` skips the samples already consumed. Training loaders yield full batches only (the last
partial one is dropped, as timm does: a batch of one image breaks BatchNorm in training mode);
evaluation loaders yield every sample.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, Sized, runtime_checkable

import torch
from torch.utils.data import Dataset, Subset

from inceptionlab.data.loading.image_options import DeviceImageOptions
from inceptionlab.data.loading.resident import ResidentLoader, resident_image_bytes, resident_image_loader
from inceptionlab.data.loading.sampler import EpochSampler
from inceptionlab.data.loading.streamed import stream_image_loader
from inceptionlab.data.loading.workers import worker_loader
from inceptionlab.data.splits import ArraySplit

# data.loader choices, as make_loader reads them. auto: in-memory splits and image folders that fit are
# resident, bigger image folders stream; stream: image folders decoded in workers, augmented on the device;
# workers: per-image crops in DataLoader workers (the guide's path, uint8 batches).
LOADERS = ("auto", "resident", "stream", "workers")


@runtime_checkable
class Loader(Protocol):
    """What the engine asks of every loader: `SkipTrackingLoader` (worker processes), `ResidentLoader`
    (in-memory arrays), `ResidentImageLoader` and `StreamImageLoader` (images augmented on the device)."""

    @property
    def skipped(self) -> list[str]:
        """Files that could not be decoded so far (named in the epoch line, never fatal)."""
        ...

    @property
    def yields_normalised(self) -> bool:
        """True when batches arrive as normalised floats; False for uint8 images or token ids, which
        the session's input preparation (the spec's normaliser) turns into the model's input."""
        ...

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Fix the epoch's order (and augmentation seeds); skip the first `start` samples of this rank."""
        ...

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def __len__(self) -> int: ...


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


def device_bytes(dataset: Sized, *, device: torch.device, mode: str = "auto", images: DeviceImageOptions | None = None,
                 local_world_size: int = 1) -> int:
    """Bytes a loader `make_loader` builds for `dataset` keeps on `device` (a GPU), known before it is built:
    a resident image folder placed there, or an in-memory split; 0 on a CPU and for streamed or worker
    batches. `train.batch_size=auto` probes before the loaders exist and keeps this much free for them."""
    if device.type != "cuda":
        return 0
    if images is not None and mode != "workers":
        if mode == "stream":
            return 0
        return resident_image_bytes(dataset, images, device, required=mode == "resident", sharers=local_world_size)
    if isinstance(dataset, ArraySplit) and mode in ("auto", "resident"):
        return sum(t.numel() * t.element_size() for t in (dataset.inputs, dataset.targets))
    return 0


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
    images: DeviceImageOptions | None = None,
    weights: torch.Tensor | None = None,
    local_world_size: int = 1,
) -> Loader:
    """Resident (on-device index batches) for in-memory splits unless mode="workers"; DataLoader otherwise.

    With `images`, an image folder that fits in memory (or any, for mode="resident") is decoded once
    and augmented on the device (resident.py); one that does not fit (or any, for mode="stream") is
    decoded in workers batch by batch and augmented on the device (streamed.py). `local_world_size`:
    processes on this node (torchrun), which share its host memory and /dev/shm.
    """
    if images is not None and mode != "workers":
        on_images: dict[str, Any] = dict(batch_size=batch_size, train=train, seed=seed, rank=rank,
                                         world_size=world_size, device=device or torch.device("cpu"),
                                         num_workers=num_workers, weights=weights if train else None,
                                         sharers=local_world_size)
        if mode != "stream":
            resident = resident_image_loader(dataset, images, required=mode == "resident", **on_images)
            if resident is not None:
                return resident
        streamed = stream_image_loader(dataset, images, **on_images)
        if streamed is not None:
            return streamed
    sampler = EpochSampler(len(dataset), shuffle=train, seed=seed, rank=rank, world_size=world_size, pad=train,
                           weights=weights if train else None)
    if isinstance(dataset, ArraySplit) and mode in ("auto", "resident"):
        return ResidentLoader(dataset, batch_size, sampler, device or torch.device("cpu"), drop_last=train)
    return worker_loader(dataset, sampler, batch_size=batch_size, seed=seed, num_workers=num_workers,
                         pin_memory=pin_memory, drop_last=train, sharers=local_world_size)
