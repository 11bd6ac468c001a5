"""In-memory splits: whole datasets as tensors (CIFAR-10, Fashion-MNIST, MNIST, tokenised text)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ArraySplit:
    """One split held in memory: `inputs` uint8 images (N, C, H, W) or int64 token ids (N, L)."""

    inputs: torch.Tensor
    targets: torch.Tensor  # int64 (N,)
    class_names: list[str]

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.targets):
            raise ValueError(f"{len(self.inputs)} inputs but {len(self.targets)} targets")

    def __len__(self) -> int:
        return len(self.targets)
