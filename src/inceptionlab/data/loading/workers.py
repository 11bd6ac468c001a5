"""`data.loader=workers`: samples decoded and transformed in DataLoader worker processes (the guide's path).

`SkipTrackingLoader` wraps the DataLoader: it fixes each epoch's order and worker seeds, and names
the files its workers could not decode instead of failing the epoch on one bad image. The streamed
image loader (streamed.py) builds on it.

Each sample's random transforms (crop, flip) draw from torch's RNG seeded with (seed, epoch, index)
(`SeededSamples`), not from the worker's own stream: persistent workers are seeded once per loader,
and a run resumed mid-epoch hands its samples to other workers than an uninterrupted one, so with
worker streams a resume drew other crops (210 of 244 tensors differed after a resume with 2 workers).
torchdata's StatefulDataLoader would instead save each worker's RNG state in the checkpoint: more
state, another dependency, and a resume bound to the same number of workers; a seed per sample makes
the crops a function of the data alone, whatever the workers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Sized

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

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


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed per (seed, epoch, sample index): each sample's transforms draw a stream of their own."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # manual_seed takes [0, 2**63)


class SeededSamples(Dataset):
    """`dataset[(epoch, index)]`: sample `index` with its random transforms drawn from torch's CPU RNG
    seeded with `sample_seed(seed, epoch, index)`; the caller's RNG state is restored afterwards (in the
    main process, with num_workers=0, it is the run's own stream: dropout draws from it)."""

    def __init__(self, dataset: Any, seed: int):
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(sample_seed(self.seed, epoch, index))
            return self.dataset[index]


class EpochIndices(Sampler):
    """An EpochSampler's order as `(epoch, index)` pairs, the keys `SeededSamples` takes."""

    def __init__(self, sampler: EpochSampler):
        self.sampler = sampler

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.sampler.epoch
        return ((epoch, index) for index in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


@dataclass
class SkipTrackingLoader:
    """Yields `(inputs, targets)` and remembers which files could not be decoded."""

    loader: DataLoader
    generator: torch.Generator  # the loader's own: worker seeds never draw on the global RNG
    seed: int = 0
    skipped: list[str] = field(default_factory=list)
    order: EpochSampler | None = None  # the epoch sampler, where the DataLoader's sampler wraps it

    @property
    def yields_normalised(self) -> bool:
        """False: workers hand over uint8 images (or token ids); the session normalises them on the device."""
        return False

    @property
    def sampler(self) -> EpochSampler:
        return self.order or self.loader.sampler  # type: ignore[return-value]

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
                  pin_memory: bool = False, drop_last: bool = False, sharers: int = 1) -> SkipTrackingLoader:
    """A DataLoader over `dataset` in `num_workers` processes (default: one per core, at most 8; fewer
    when /dev/shm cannot hold their batches, shared_memory.py; `sharers` processes on this node share it).
    `drop_last` (training): the last partial batch is left out."""
    if isinstance(dataset, ArraySplit):
        dataset = ArrayDataset(dataset)
    workers = default_num_workers() if num_workers is None else num_workers
    if workers > 0:
        workers = fit_workers(workers, PREFETCH, batch_bytes(dataset, batch_size), what="data loader", sharers=sharers)
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        SeededSamples(dataset, seed),
        batch_size=batch_size,
        sampler=EpochIndices(sampler),
        num_workers=workers,
        collate_fn=collate_skipping_unreadable,
        pin_memory=pin_memory,
        drop_last=drop_last,
        persistent_workers=workers > 0,
        prefetch_factor=PREFETCH if workers > 0 else None,
        generator=generator,
    )
    return SkipTrackingLoader(loader, generator, seed, order=sampler)
