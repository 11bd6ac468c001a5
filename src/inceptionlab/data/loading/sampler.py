"""Which samples each rank sees in each epoch: a function of (seed, epoch) alone, so runs resume exactly.

Shared by every loader (worker processes, resident arrays, resident images, streamed images).
"""

from __future__ import annotations

import os
from typing import Iterator

import torch
from torch.utils.data import Sampler


class EpochSampler(Sampler[int]):
    """Shuffled (or sequential) indices for one rank of `world_size`, reproducible per epoch.

    Training pads the index list so every rank gets the same number of samples, and its loaders drop
    the last partial batch, as timm does (a batch of one image breaks BatchNorm in training mode), so
    every rank takes the same number of full steps (DDP needs equal step counts); evaluation
    (`pad=False`) shards without padding and keeps every sample, so none is counted twice or left out.
    """

    def __init__(self, size: int, *, shuffle: bool, seed: int = 0, rank: int = 0, world_size: int = 1, pad: bool = True):
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self.rank, self.world_size, self.pad = rank, world_size, pad
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch's order; skip the first `start` samples of this rank's share."""
        self.epoch, self.start = epoch, start

    def _indices(self) -> list[int]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(self.size, generator=generator).tolist()
        else:
            order = list(range(self.size))
        if self.pad and self.world_size > 1 and self.size % self.world_size:
            order += order[: self.world_size - self.size % self.world_size]
        return order[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices()[self.start :])

    def __len__(self) -> int:
        return len(self._indices()) - self.start

    def batches(self, batch_size: int, drop_last: bool) -> int:
        """Batches left in the epoch: full ones only with `drop_last` (training: every rank has the same
        number of samples, so every rank takes the same number of steps)."""
        return len(self) // batch_size if drop_last else -(-len(self) // batch_size)

    def batched_order(self, batch_size: int, drop_last: bool) -> torch.Tensor:
        """The rest of the epoch's indices as one int64 host tensor, cut to whole batches with `drop_last`
        (`start` is a whole number of batches, so a resumed epoch ends where an uninterrupted one does)."""
        order = torch.tensor(list(self), dtype=torch.long)
        return order[: self.batches(batch_size, drop_last) * batch_size] if drop_last else order


def default_num_workers() -> int:
    return min(8, os.cpu_count() or 1)
