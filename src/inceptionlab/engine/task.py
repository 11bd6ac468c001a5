"""Task kinds: each fixes the loss, how to read logits out of a model's output, and the metrics.

Models with auxiliary classifiers (Inception v3's AuxLogits, GoogLeNet's aux1/aux2) return a tuple
in training mode; the task, not the loop, knows to add their loss with its weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torch.nn import functional as F

from inceptionlab.metrics import ClassificationMeter


def split_outputs(output: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(main logits, auxiliary logits) from a tensor, a namedtuple (InceptionOutputs) or a tuple."""
    if isinstance(output, torch.Tensor):
        return output, []
    main, *aux = tuple(output)
    return main, [a for a in aux if a is not None]


@dataclass
class MulticlassTask:
    num_classes: int
    label_smoothing: float = 0.0
    aux_loss_weight: float = 0.4  # Inception v3 paper's weight for the auxiliary classifier

    def loss(self, output: Any, targets: torch.Tensor) -> torch.Tensor:
        logits, aux = split_outputs(output)
        loss = F.cross_entropy(logits, targets, label_smoothing=self.label_smoothing)
        for aux_logits in aux:
            loss = loss + self.aux_loss_weight * F.cross_entropy(aux_logits, targets, label_smoothing=self.label_smoothing)
        return loss

    def eval_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Validation loss is plain cross-entropy (no smoothing) so runs compare on one scale.
        return F.cross_entropy(logits.float(), targets)

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().softmax(dim=-1)

    def meter(self, device: torch.device | str, confusion: bool = False, validate: bool = True) -> ClassificationMeter:
        return ClassificationMeter(self.num_classes, device, confusion=confusion, validate=validate)


TASKS = {"multiclass": MulticlassTask}


def make_task(kind: str, num_classes: int, label_smoothing: float = 0.0, aux_loss_weight: float | None = None) -> MulticlassTask:
    task = TASKS[kind](num_classes=num_classes, label_smoothing=label_smoothing)
    if aux_loss_weight is not None:
        task.aux_loss_weight = aux_loss_weight
    return task


def main_logits(output: Any) -> torch.Tensor:
    return split_outputs(output)[0]



