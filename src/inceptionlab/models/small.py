"""The guide's small case-study networks, registered beside torchvision's models."""

from __future__ import annotations

from torch import nn

from inceptionlab.models.registry import register_model


@register_model("cifar10_cnn")
def cifar10_cnn(num_classes: int = 10) -> nn.Module:
    """The guide's CIFAR-10 network as described (its listing has typos): 32x32 RGB input.

    conv 3->6 5x5, ReLU, maxpool 2 -> conv 6->16 5x5, ReLU, maxpool 2 -> 16*5*5=400 -> 120 -> 84 -> classes.
    """
    return nn.Sequential(
        nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, num_classes),
    )
