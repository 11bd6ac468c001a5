"""`data.loader=stream` for image folders too big to keep: decode in workers, augment on the device.

Each DataLoader worker decodes its files with `decode_to_fit` (decoded_cache.py: the resident cache's
own decode, so JPEGs are read at a reduced scale through PIL draft when the cache size allows it, and
the shorter side is kept at cache_size) and pads its batch top-left into one uint8 tensor
(batch_size, 3, H, W), portraits turned on their side as the cache stores them, H and W the largest
stored sides of that batch, with the upright heights and widths beside it. The main process copies that
tensor to the device (pinned and non-blocking on CUDA), puts portraits upright there, and
`DeviceAugment` crops, flips and normalises it, as the resident loader does. Every batch has batch_size
rows, the last short one included; its height and width are its own images' (64 px images: 64 x 64,
not cache_size^2 of padding; 4:3 photos at 342: 342 x 456, 468 KB each). What a worker hands over is
uint8, not floats.

The same batches as `ResidentImageLoader` for the same seed, epoch and rank: the order is
`EpochSampler`'s over the same indices, and batch b's crop/flip generator is seeded with
`batch_seed(seed, epoch, rank, b)`. One difference: the resident loader drops unreadable files before
sampling, this one finds them only while decoding, so when a split has unreadable files the batches
(and their sizes) differ from resident's; they are named in `.skipped` as the worker path does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from inceptionlab.data.loading.decoded_cache import decode_to_fit, stored_canvas
from inceptionlab.data.loading.image_options import DeviceImageOptions, batch_seed, image_folder_of
from inceptionlab.data.loading.sampler import EpochSampler, default_num_workers
from inceptionlab.data.loading.shared_memory import fit_workers
from inceptionlab.data.loading.workers import SkipTrackingLoader, partition_unreadable
from inceptionlab.data.transforms.device import DeviceAugment, stored, upright

# Batches each worker prepares ahead. 2 (PyTorch's default), not the worker path's 4: a batch of 64
# 4:3 photos at cache_size 342 is 30 MB of shared memory, so 8 workers x 2 already hold 510 MB of it.
PREFETCH = 2


class _StreamFiles(Dataset):
    """Position k of the split -> (upright uint8 CHW image, target), or (None, UnreadableFile) if unreadable."""

    def __init__(self, samples: list[tuple[str, int]], cache_size: int, interpolation: str = "bilinear"):
        self.samples, self.cache_size, self.interpolation = samples, cache_size, interpolation

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int] | tuple[None, str]:
        path, target = self.samples[index]
        image = decode_to_fit(path, self.cache_size, self.interpolation)
        return (None, image) if isinstance(image, str) else (image, target)  # a str: the UnreadableFile


@dataclass(frozen=True)
class PadBatch:
    """Collate: readable images top-left in a zeroed (batch_size, 3, H, W) uint8 tensor, portraits turned
    on their side (as the cache stores them); H, W: the largest stored height and width of the batch.

    Returns (pixels, heights, widths, targets, skipped paths); heights and widths are upright, and they
    and targets hold the readable images only, so rows past len(targets) are padding.
    """

    batch_size: int

    def __call__(self, batch: list[tuple[Any, Any]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
        good, skipped = partition_unreadable(batch)
        turned = [stored(image) for image, _ in good]
        height = max([1, *(image.shape[1] for image in turned)])
        width = max([1, *(image.shape[2] for image in turned)])
        pixels = torch.zeros(self.batch_size, 3, height, width, dtype=torch.uint8)
        for n, image in enumerate(turned):
            pixels[n, :, : image.shape[1], : image.shape[2]] = image
        heights = torch.tensor([image.shape[1] for image, _ in good], dtype=torch.long)
        widths = torch.tensor([image.shape[2] for image, _ in good], dtype=torch.long)
        targets = torch.tensor([target for _, target in good], dtype=torch.long)
        return pixels, heights, widths, targets, skipped


class StreamImageLoader(SkipTrackingLoader):
    """Yields `(normalised images, targets)` on the device; `set_epoch`, `skipped` as SkipTrackingLoader."""

    @property
    def yields_normalised(self) -> bool:
        """True: `DeviceAugment` already normalised these batches; the session must not do it again."""
        return True

    def __init__(self, loader: DataLoader, generator: torch.Generator, seed: int, *, batch_size: int,
                 device: torch.device, augment: DeviceAugment, rank: int = 0):
        super().__init__(loader, generator, seed)
        self.batch_size, self.device, self.augment, self.rank = batch_size, device, augment, rank

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        first_batch = self.sampler.start // self.batch_size  # as ResidentImageLoader numbers them
        generator = torch.Generator(device=self.device)
        for number, (pixels, heights, widths, targets, skipped) in enumerate(self.loader, start=first_batch):
            self.skipped.extend(skipped)
            if not len(targets):
                continue  # all of it unreadable; the numbering goes on, so later batches keep their seeds
            # The whole tensor travels (batch_size rows, pinned on CUDA); the padding rows stay behind.
            portraits = bool((heights > widths).any())  # host tensors: no sync
            pixels = pixels.to(self.device, non_blocking=True)[: len(targets)]
            heights, widths, targets = (t.to(self.device, non_blocking=True) for t in (heights, widths, targets))
            if portraits:
                pixels = upright(pixels, heights, widths)
            generator.manual_seed(batch_seed(self.seed, self.sampler.epoch, self.rank, number))
            yield self.augment(pixels, heights, widths, generator), targets


def stream_image_loader(
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
    weights: torch.Tensor | None = None,
    sharers: int = 1,
) -> StreamImageLoader | None:
    """A StreamImageLoader for an image folder (or a Subset of one); None for any other dataset.

    Training drops the last partial batch (`EpochSampler.batches`); `sharers`: processes on this node,
    which share /dev/shm."""
    found = image_folder_of(dataset)
    if found is None:
        return None
    folder, indices = found
    samples = [folder.samples[i] for i in indices]
    files = _StreamFiles(samples, options.cache_size, options.interpolation)
    sampler = EpochSampler(len(files), shuffle=train, seed=seed, rank=rank, world_size=world_size, pad=train,
                           weights=weights)
    workers = default_num_workers() if num_workers is None else num_workers
    # A batch (PadBatch): uint8, batch x 3 x its images' stored sides (estimated from a few headers).
    height, width = stored_canvas(samples, options.cache_size)
    workers = fit_workers(workers, PREFETCH, batch_size * 3 * height * width, what="streaming image loader",
                          sharers=sharers)
    # Its own generator: a DataLoader otherwise draws its base seed from the global RNG (decoded_cache.py).
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        files,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=PadBatch(batch_size),
        pin_memory=device.type == "cuda",
        drop_last=train,
        persistent_workers=workers > 0,
        prefetch_factor=PREFETCH if workers > 0 else None,
        generator=generator,
    )
    return StreamImageLoader(loader, generator, seed, batch_size=batch_size, device=device,
                             augment=options.augment(train), rank=rank)
