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

    Training pads the index list so every rank gets the same number of batches (DDP needs equal
    step counts); evaluation (`pad=False`) shards without padding so no sample is counted twice.
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


def default_num_workers() -> int:
    return min(8, os.cpu_count() or 1)
