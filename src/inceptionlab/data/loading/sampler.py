"""Which samples each rank sees in each epoch: a function of (seed, epoch) alone, so runs resume exactly.

Shared by every loader (worker processes, resident arrays, resident images, streamed images). With
per-sample `weights` (data.sampler=balanced) an epoch is as many draws with replacement, sample i
drawn with probability proportional to weights[i]; the draw is still a function of (seed, epoch), and
each rank takes its share of it, so the class balance and the resume semantics hold for every loader.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import torch
from torch.utils.data import Sampler

from inceptionlab.data.loading.image_options import image_folder_of


class EpochSampler(Sampler[int]):
    """Shuffled (or sequential) indices for one rank of `world_size`, reproducible per epoch.

    Training pads the index list so every rank gets the same number of samples, and its loaders drop
    the last partial batch, as timm does (a batch of one image breaks BatchNorm in training mode), so
    every rank takes the same number of full steps (DDP needs equal step counts); evaluation
    (`pad=False`) shards without padding and keeps every sample, so none is counted twice or left out.
    """

    def __init__(self, size: int, *, shuffle: bool, seed: int = 0, rank: int = 0, world_size: int = 1, pad: bool = True,
                 weights: torch.Tensor | None = None):
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self.rank, self.world_size, self.pad = rank, world_size, pad
        self.epoch, self.start = 0, 0
        if weights is not None and len(weights) != size:
            raise ValueError(f"{len(weights)} sample weights for {size} samples")
        self.weights = None if weights is None else torch.as_tensor(weights, dtype=torch.float64)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch's order; skip the first `start` samples of this rank's share."""
        self.epoch, self.start = epoch, start

    def _indices(self) -> list[int]:
        if self.shuffle and self.weights is not None:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.multinomial(self.weights, self.size, replacement=True, generator=generator).tolist()
        elif self.shuffle:
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


def split_targets(dataset: Any) -> torch.Tensor:
    """The class index of every sample of a split, read without decoding any image."""
    if hasattr(dataset, "targets"):
        return torch.as_tensor(dataset.targets, dtype=torch.long)
    found = image_folder_of(dataset)
    if found is not None:
        folder, indices = found
        return torch.tensor([folder.targets[i] for i in indices], dtype=torch.long)
    return torch.tensor([int(dataset[i][1]) for i in range(len(dataset))], dtype=torch.long)


def class_counts(targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    return torch.bincount(targets, minlength=num_classes)[:num_classes]


def inverse_frequency(counts: torch.Tensor, power: float) -> torch.Tensor:
    """count^-power per class, normalised to mean 1 over the classes present (absent ones: 1)."""
    present = counts > 0
    weights = torch.ones(len(counts), dtype=torch.float64)
    weights[present] = counts[present].double() ** -power
    weights[present] /= weights[present].mean()
    return weights


def balanced_sample_weights(targets: torch.Tensor, num_classes: int, power: float) -> torch.Tensor:
    """Per-sample draw weights n_class^-power: power 1 draws every class equally often in expectation."""
    return inverse_frequency(class_counts(targets, num_classes), power)[targets]


def draw_weights(sampler: str, targets: torch.Tensor, num_classes: int, power: float) -> torch.Tensor | None:
    """data.sampler's per-sample weights for the samples whose targets these are (None: plain shuffle).
    Computed for the samples a loader really serves: cached features leave out the files that could not
    be read, and their classes' counts are what the balance is of."""
    return balanced_sample_weights(targets, num_classes, power) if sampler == "balanced" else None
