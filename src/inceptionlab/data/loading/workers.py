"""`data.loader=workers`: samples decoded and transformed in DataLoader worker processes (the guide's path).

`SkipTrackingLoader` wraps the DataLoader: it fixes each epoch's order and worker seeds, and names
the files its workers could not decode instead of failing the epoch on one bad image. The streamed
image loader (streamed.py) builds on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sized

import torch
from torch.utils.data import DataLoader, Dataset

from inceptionlab.data.loading.sampler import EpochSampler, default_num_workers
from inceptionlab.data.loading.shared_memory import batch_bytes, fit_workers
from inceptionlab.data.splits import ArraySplit

# Batches each worker prepares ahead (PyTorch's default is 2; streamed.py says why it keeps 2).
PREFETCH = 4


def partition_unreadable(batch: list[tuple[Any, Any]]) -> tuple[list[tuple[Any, Any]], list[str]]:
    """(the readable `(input, target)` items, the paths of the unreadable `(None, path)` ones)."""
    return [(x, y) for x, y in batch if x is not None], [y for x, y in batch if x is None]


def collate_skipping_unreadable(batch: list[tuple[Any, Any]]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Stack the readable samples; return the paths of unreadable ones beside them."""
    good, skipped = partition_unreadable(batch)
    if not good:
        return torch.empty(0), torch.empty(0, dtype=torch.long), skipped
    inputs = torch.stack([torch.as_tensor(x) for x, _ in good])
    targets = torch.tensor([y for _, y in good], dtype=torch.long)
    return inputs, targets, skipped


def worker_seed(seed: int, epoch: int, rank: int) -> int:
    """The loader generator's seed for one epoch on one rank. The DataLoader draws its workers' base
    seed from that generator, so each rank's workers get RNG streams of their own: with the rank left
    out, every rank's workers drew the same random crops and flips. (4,099, a prime above any world
    size run here, keeps (epoch, rank) pairs apart.)"""
    return (seed * 1_000_003 + epoch) * 4_099 + rank


@dataclass
class SkipTrackingLoader:
    """Yields `(inputs, targets)` and remembers which files could not be decoded."""

    loader: DataLoader
    generator: torch.Generator  # the loader's own: worker seeds never draw on the global RNG
    seed: int = 0
    skipped: list[str] = field(default_factory=list)

    @property
    def yields_normalised(self) -> bool:
        """False: workers hand over uint8 images (or token ids); the session normalises them on the device."""
        return False

    @property
    def sampler(self) -> EpochSampler:
        return self.loader.sampler  # type: ignore[return-value]

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Fix the epoch's sample order and worker seeds; skip the first `start` samples."""
        self.sampler.set_epoch(epoch, start)
        self.generator.manual_seed(worker_seed(self.seed, epoch, self.sampler.rank))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for inputs, targets, skipped in self.loader:
            self.skipped.extend(skipped)
            if len(targets):
                yield inputs, targets

    def __len__(self) -> int:
        return len(self.loader)


class ArrayDataset(Dataset):
    """ArraySplit as a map-style dataset, for the worker-process path (`data.loader=workers`)."""

    def __init__(self, split: ArraySplit):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.split.inputs[index], int(self.split.targets[index])


def worker_loader(dataset: Sized, sampler: EpochSampler, *, batch_size: int, seed: int, num_workers: int | None,
                  pin_memory: bool = False) -> SkipTrackingLoader:
    """A DataLoader over `dataset` in `num_workers` processes (default: one per core, at most 8; fewer
    when /dev/shm cannot hold their batches, shared_memory.py)."""
    if isinstance(dataset, ArraySplit):
        dataset = ArrayDataset(dataset)
    workers = default_num_workers() if num_workers is None else num_workers
    if workers > 0:
        workers = fit_workers(workers, PREFETCH, batch_bytes(dataset, batch_size), what="data loader")
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
        prefetch_factor=PREFETCH if workers > 0 else None,
        generator=generator,
    )
    return SkipTrackingLoader(loader, generator, seed)
