"""Classification metrics, sample-weighted and correct under DistributedDataParallel.

torchmetrics keeps sums on each rank and all-reduces them in `compute()`; evaluation shards are not
padded (see `EpochSampler`), so every sample counts exactly once.
"""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix


class ClassificationMeter:
    """Loss (weighted by samples, not by batches), top-1, top-5 and optionally a confusion matrix."""

    def __init__(self, num_classes: int, device: torch.device | str = "cpu", confusion: bool = False,
                 topk: int | None = 5):
        self.num_classes = num_classes
        self.loss = MeanMetric().to(device)
        self.top1 = MulticlassAccuracy(num_classes, top_k=1, average="micro").to(device)
        # top-5 of 3 classes is always 1.0 but still says "the answer is among the 5 best": keep min(k, C).
        self.top5 = MulticlassAccuracy(num_classes, top_k=min(topk, num_classes), average="micro").to(device) if topk else None
        self.confusion = MulticlassConfusionMatrix(num_classes).to(device) if confusion else None

    @torch.no_grad()
    def update(self, logits: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor) -> None:
        logits = logits.float()
        self.loss.update(loss.detach().float(), weight=targets.numel())
        self.top1.update(logits, targets)
        if self.top5 is not None:
            self.top5.update(logits, targets)
        if self.confusion is not None:
            self.confusion.update(logits.argmax(dim=1), targets)

    def compute(self) -> dict[str, Any]:
        result: dict[str, Any] = {"loss": float(self.loss.compute()), "top1": float(self.top1.compute())}
        if self.top5 is not None:
            result["top5"] = float(self.top5.compute())
        if self.confusion is not None:
            matrix = self.confusion.compute().cpu()
            result["confusion"] = matrix
            result["per_class"] = per_class_accuracy(matrix)
            result["samples"] = int(matrix.sum())
        return result


def per_class_accuracy(confusion: torch.Tensor) -> list[float | None]:
    """Recall per true class (row); None for a class with no samples."""
    totals = confusion.sum(dim=1)
    correct = confusion.diag()
    return [None if int(t) == 0 else float(c) / float(t) for c, t in zip(correct, totals)]
