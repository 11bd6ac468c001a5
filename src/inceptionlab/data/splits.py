"""What dataset readers hand to the engine, free of torchvision so text and in-memory datasets start fast.

`SplitPair`: the train and validation datasets (and a test split) with the class names they agree on.
`ArraySplit`: one split held in memory as tensors (CIFAR-10, Fashion-MNIST, MNIST, tokenised text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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


@dataclass
class SplitPair:
    """Train and validation datasets with the class names they agree on."""

    train: Any
    val: Any
    class_names: list[str]
    class_labels: list[str] | None = None
    notes: list[str] = field(default_factory=list)
    test: Any = None  # a held-out split scored once after training, when the dataset has one
    artifacts: dict[str, Any] = field(default_factory=dict)  # file name -> save(path): saved with the run
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # what the data fixes in the model (vocab size)
