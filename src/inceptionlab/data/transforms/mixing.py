"""MixUp and CutMix on a device batch: torchvision's own transforms, drawing from a seeded stream.

`torchvision.transforms.v2.MixUp` / `CutMix` mix a batch with itself rolled by one (image k with
image k - 1), one lambda ~ Beta(alpha, alpha) per batch, and return soft targets
lam * onehot(y) + (1 - lam) * onehot(y rolled); CutMix pastes a box whose clipping at the border is
corrected for (lambda = 1 - the box's true area share). With both on, each batch takes one of them,
50:50 (`RandomChoice`, as torchvision's reference recipe). They draw from torch's global CPU
generator; `BatchMix` lets them draw inside `fork_rng` from a seed that is a function of (seed,
epoch, rank, step), and restores the global state afterwards: a resumed run mixes exactly as an
uninterrupted one, and nothing else's random numbers move.

Both data paths call it on the device batch, after normalisation (engine/loop.py): mixing is linear,
so before or after normalisation is the same up to rounding; after it, a uint8 batch from the worker
path and a float batch from the device path take one code path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torchvision.transforms import v2

from inceptionlab.config import AugmentConfig
from inceptionlab.data.transforms.policies import derived_seed


@dataclass
class BatchMix:
    """(inputs, class indices, epoch, step) -> (mixed inputs, soft targets (N, C) float32); the batch as
    it is, with its indices, from epoch `off_epoch` on (epochs counted from 0, as the loop does)."""

    num_classes: int
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    off_epoch: int | None = None
    seed: int = 0
    rank: int = 0
    _transform: v2.Transform = field(init=False, repr=False)

    def __post_init__(self) -> None:
        choices: list[v2.Transform] = []
        if self.mixup_alpha > 0:
            choices.append(v2.MixUp(alpha=self.mixup_alpha, num_classes=self.num_classes))
        if self.cutmix_alpha > 0:
            choices.append(v2.CutMix(alpha=self.cutmix_alpha, num_classes=self.num_classes))
        if not choices:
            raise ValueError("BatchMix needs mixup_alpha or cutmix_alpha > 0")
        self._transform = choices[0] if len(choices) == 1 else v2.RandomChoice(choices)

    def active(self, epoch: int) -> bool:
        return self.off_epoch is None or epoch < self.off_epoch

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor, epoch: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.active(epoch):
            return inputs, targets
        with torch.random.fork_rng(devices=[]):  # the CPU generator only: torchvision's draws are all there
            torch.default_generator.manual_seed(derived_seed("mix", self.seed, epoch, self.rank, step))
            return self._transform(inputs, targets)


def batch_mix(cfg: AugmentConfig, num_classes: int, seed: int, rank: int) -> BatchMix | None:
    """The recipe's MixUp/CutMix, or None when both are off."""
    if not cfg.mixes:
        return None
    return BatchMix(num_classes, cfg.mixup_alpha, cfg.cutmix_alpha, cfg.mix_off_epoch, seed, rank)
