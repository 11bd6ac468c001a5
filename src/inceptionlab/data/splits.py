"""What readers hand to the engine, free of torchvision so text and in-memory datasets start fast."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


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


