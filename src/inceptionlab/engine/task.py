"""Task kinds: each fixes the loss, how to read logits out of a model's output, and the metrics.

Models with auxiliary classifiers (Inception v3's AuxLogits, GoogLeNet's aux1/aux2) return a tuple
in training mode; the task, not the loop, knows to add their loss with its weight.

The task owns the loss's normalisation: `loss_sum` is the batch's summed per-sample loss and
`normaliser` what that sum is divided by, the batch's count or, with class weights, the sum of its
samples' weights (a function of the targets alone, so the loop knows a whole step's before its first
micro-batch runs). The loop divides a step's summed loss once by the step's normaliser
(engine/loop.py: train_step), so micro-batching, MixUp/CutMix and class weights compose: any split of
a batch makes the whole batch's step. A part divided by its own sum of weights did not: at one sample
per part each weight cancelled itself.
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


def main_logits(output: Any) -> torch.Tensor:
    return split_outputs(output)[0]


@dataclass
class MulticlassTask:
    """Softmax over C classes, cross-entropy; metrics top-1, top-5, per class."""

    num_classes: int
    label_smoothing: float = 0.0
    aux_loss_weight: float = 0.4  # Inception v3 paper's weight for the auxiliary classifier
    class_weights: torch.Tensor | None = None  # train.class_weights: cross-entropy's per-class weight

    def loss_sum(self, output: Any, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy summed over the batch, against class indices (N,) or class probabilities (N, C),
        the soft targets of MixUp/CutMix (data/transforms/mixing.py); the aux heads see the same targets.

        Label smoothing e turns either target q (one-hot or mixed) into (1 - e) * q + e / C, torch's
        `cross_entropy(..., label_smoothing=e)` for indices and probabilities alike (torchvision's
        references mix, then smooth this way). Both steps are linear and the mixing weights sum to 1,
        so it equals smoothing each one-hot target, then mixing (timm's order). With class weights w a
        sample's term is -sum_c w_c q'_c log p_c (q' smoothed): torch's summed weighted cross-entropy,
        the same for an index and its one-hot row.
        """
        logits, aux = split_outputs(output)
        weight = _on(self.class_weights, logits)
        loss = F.cross_entropy(logits, targets, weight=weight, label_smoothing=self.label_smoothing, reduction="sum")
        for aux_logits in aux:
            loss = loss + self.aux_loss_weight * F.cross_entropy(aux_logits, targets, weight=weight,
                                                                 label_smoothing=self.label_smoothing, reduction="sum")
        return loss

    def normaliser(self, targets: torch.Tensor) -> torch.Tensor | float:
        """The batch's count, or with class weights sum_i sum_c q_ic w_c over the unsmoothed targets q:
        w_y for an index or one-hot row (torch's weighted mean divides by it), lam w_y + (1 - lam) w_y'
        for a mixed one. MixUp/CutMix pair each sample with another of the same batch, so a mixed
        batch's normaliser is its unmixed one's: the loss keeps its scale while mixing is on and at
        `mix_off_epoch` (probability targets divided by N, index targets by sum w_y: 2.473 against 2.729
        on one batch)."""
        if self.class_weights is None:
            return float(targets.shape[0])
        weight = _on(self.class_weights, targets)
        if targets.dim() == 1:
            return weight[targets].sum()
        return (targets.float() @ weight).sum()

    def loss(self, output: Any, targets: torch.Tensor) -> torch.Tensor:
        """One batch's loss: its summed loss over its normaliser (the per-sample, weighted, mean)."""
        return self.loss_sum(output, targets) / self.normaliser(targets)

    def eval_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Validation loss is plain cross-entropy (no smoothing) so runs compare on one scale.
        return F.cross_entropy(logits.float(), targets)

    def correct(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (logits.argmax(dim=1) == targets).sum()

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().softmax(dim=-1)

    def meter(self, device: torch.device | str, confusion: bool = False) -> ClassificationMeter:
        return ClassificationMeter(self.num_classes, device, confusion=confusion)


def _as_two_class(logits: torch.Tensor) -> torch.Tensor:
    """One logit z per sample -> logits [0, z]: softmax gives [1 - sigmoid(z), sigmoid(z)]."""
    z = logits.reshape(-1, 1).float()
    return torch.cat([torch.zeros_like(z), z], dim=1)


class BinaryMeter(ClassificationMeter):
    def __init__(self, device: torch.device | str, confusion: bool = False):
        super().__init__(2, device, confusion=confusion, topk=None)

    def update(self, logits: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor) -> None:
        super().update(_as_two_class(logits), targets, loss)


@dataclass
class BinaryTask:
    """One logit per sample, sigmoid, binary cross-entropy (the IMDB classifier's `from_logits=True`)."""

    num_classes: int = 2
    label_smoothing: float = 0.0
    class_weights: torch.Tensor | None = None  # [negative, positive]: a weighted mean, as cross-entropy's

    def loss_sum(self, output: Any, targets: torch.Tensor) -> torch.Tensor:
        """Binary cross-entropy summed over the batch, each sample's term times its class's weight."""
        logits = main_logits(output).reshape(-1)
        soft = targets.float() * (1 - self.label_smoothing) + 0.5 * self.label_smoothing
        if self.class_weights is None:
            return F.binary_cross_entropy_with_logits(logits, soft, reduction="sum")
        weight = _on(self.class_weights, logits)[targets]
        return (F.binary_cross_entropy_with_logits(logits, soft, reduction="none") * weight).sum()

    def normaliser(self, targets: torch.Tensor) -> torch.Tensor | float:
        """The batch's count, or the sum of its samples' class weights (MulticlassTask.normaliser)."""
        if self.class_weights is None:
            return float(targets.shape[0])
        return _on(self.class_weights, targets)[targets].sum()

    def loss(self, output: Any, targets: torch.Tensor) -> torch.Tensor:
        """One batch's loss: its summed loss over its normaliser (the per-sample, weighted, mean)."""
        return self.loss_sum(output, targets) / self.normaliser(targets)

    def eval_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(logits.reshape(-1).float(), targets.float())

    def correct(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return ((logits.reshape(-1) > 0).long() == targets).sum()

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """[P(class 0), P(class 1)] per sample."""
        return _as_two_class(logits).softmax(dim=-1)

    def meter(self, device: torch.device | str, confusion: bool = False) -> BinaryMeter:
        return BinaryMeter(device, confusion=confusion)


def _on(weights: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    return None if weights is None else weights.to(device=like.device, dtype=torch.float32)


TASKS = {"multiclass": MulticlassTask, "binary": BinaryTask}


def make_task(kind: str, num_classes: int, label_smoothing: float = 0.0, aux_loss_weight: float | None = None,
              class_weights: torch.Tensor | None = None) -> Any:
    """The task named `kind` in TASKS; `aux_loss_weight` only for tasks that weigh auxiliary heads."""
    options: dict[str, Any] = {"num_classes": num_classes, "label_smoothing": label_smoothing,
                               "class_weights": class_weights}
    if aux_loss_weight is not None and "aux_loss_weight" in TASKS[kind].__dataclass_fields__:
        options["aux_loss_weight"] = aux_loss_weight
    return TASKS[kind](**options)
