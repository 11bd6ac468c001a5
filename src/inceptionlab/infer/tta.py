"""A model with test-time augmentation: one forward per view (models/tta.py), logits averaged.

`with_tta(model, mode)` is what evaluate, predict, bench and the server's PyTorch backends run;
runtimes that run an exported graph (ONNX Runtime, OpenVINO) get the same views around each call
(serve/models.py), so the exported graph itself stays the plain model.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from inceptionlab.engine.task import main_logits
from inceptionlab.models.tta import iter_views, views_of


class TestTimeAugmented(nn.Module):
    """`model` answering the mean of its logits over the TTA views of each input.

    With `record_plain`, the logits of view 0 (the input itself) of every call are kept in `plain`:
    evaluate reads the gain of TTA from one pass instead of a second evaluation without it.
    """

    def __init__(self, model: nn.Module, mode: str, record_plain: bool = False):
        super().__init__()
        self.model, self.mode, self.views = model, mode, views_of(mode)
        self.plain: list[torch.Tensor] | None = [] if record_plain else None

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        total: torch.Tensor | None = None
        for index, view in enumerate(iter_views(images, self.mode)):
            logits = main_logits(self.model(view)).float()
            if index == 0 and self.plain is not None:
                self.plain.append(logits.detach())
            total = logits if total is None else total + logits
        assert total is not None
        return total / self.views


def with_tta(model: nn.Module, mode: str, record_plain: bool = False) -> nn.Module:
    """The model itself for mode "none" (nothing recorded), else wrapped."""
    return model if mode == "none" and not record_plain else TestTimeAugmented(model, mode, record_plain)


def run_with_tta(run: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, mode: str) -> torch.Tensor:
    """The same averaging around any batch function (an exported graph's session)."""
    total: torch.Tensor | None = None
    for view in iter_views(images, mode):
        logits = run(view).float()
        total = logits if total is None else total + logits
    assert total is not None
    return total / views_of(mode)
