"""A model's penultimate features: what enters its head, taken by a forward pre-hook on the head layer.

One way for every reader: the frozen-feature cache (engine/features.py) trains a head on them,
`evaluate` fits the unknown detector's bank on them (models/knn.py), and predict, serve and explain
give them to the decision rule beside the logits. The head is `parts.head_modules`'s (the layer that
outputs the classes), so what is taken is after pooling, flattening and the body's eval-mode dropout.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from inceptionlab.models.parts import head_modules


def head_name(model: nn.Module, num_classes: int) -> str:
    """The head layer whose input is the model's features."""
    found = head_modules(model, num_classes)
    if not found:
        raise ValueError(f"{type(model).__name__} has no layer that outputs its {num_classes} classes")
    return found[0]


@contextlib.contextmanager
def captured(head: nn.Module, to_cpu: bool = False, flat: bool = True) -> Iterator[list[torch.Tensor]]:
    """While inside, every input `head` gets is appended to the yielded list, as float (N, D) (flat=False:
    as the head got it, e.g. SqueezeNet's N x 512 x 13 x 13 map)."""
    taken: list[torch.Tensor] = []

    def keep(module: nn.Module, args: tuple) -> None:
        value = args[0].detach().float()
        value = value.reshape(value.shape[0], -1) if flat else value
        taken.append(value.cpu() if to_cpu else value)

    hook = head.register_forward_pre_hook(keep)
    try:
        yield taken
    finally:
        hook.remove()


def mean_over_views(taken: list[torch.Tensor], views: int) -> torch.Tensor:
    """The features of a pass that ran each batch `views` times in a row (test-time augmentation's views),
    averaged per batch: the head is linear, so the mean feature is what gives the averaged logits."""
    if views == 1:
        return torch.cat(taken) if taken else torch.zeros(0, 0)
    groups = [torch.stack(taken[i:i + views]).mean(0) for i in range(0, len(taken), views)]
    return torch.cat(groups) if groups else torch.zeros(0, 0)


class WithFeatures(nn.Module):
    """`model` answering [logits | features] in one tensor (N, C + D): what runtimes that return one array
    (serve's engines, predict under test-time augmentation, whose views average it whole) run when the
    decision rule reads features. `split` takes them apart again."""

    def __init__(self, model: nn.Module, head: str):
        super().__init__()
        self.model, self.head = model, head

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        with captured(self.model.get_submodule(self.head)) as taken:
            output = self.model(images)
        logits = (output if isinstance(output, torch.Tensor) else output[0]).float()  # InceptionOutputs: main
        return torch.cat([logits.reshape(len(logits), -1), taken[-1].to(logits.device)], dim=1)

    @staticmethod
    def split(output, dim: int):
        """(logits, features) of a WithFeatures output with `dim` feature columns."""
        return output[:, :-dim], output[:, -dim:]
