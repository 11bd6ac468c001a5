"""An exponential moving average of a model's weights, updated after every optimizer step.

The averaging is torch's `swa_utils.AveragedModel` with `get_ema_multi_avg_fn` (one foreach lerp per
device and dtype); the decay and its warm-up are timm's `ModelEmaV3`: update k (1-based) uses

    decay_k = 0 for k = 1 (the average starts as a copy), else
    decay_k = min(decay, 1 - (1 + (k - 1) / warmup_gamma) ** -warmup_power)   (warm-up on)
    decay_k = decay                                                             (warm-up off)

Buffers are averaged as timm does by default (`ema.buffers=average`): floating-point buffers (BatchNorm's
running mean and variance) follow the same average as the weights, integer ones (num_batches_tracked)
are copied. Not averaging them pairs averaged weights with the raw model's statistics, the mismatch
behind timm #245's collapsed EMA validation; `ema.buffers=copy` copies every buffer instead.

Under DDP every rank holds the same weights after each step, so every rank's average is the same.
`state_dict()` holds the averaged weights (what `model.pt` holds when EMA is on) and the update count,
so a resumed run continues the same average.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from inceptionlab.config import EmaConfig


def ema_decay(cfg: EmaConfig, updates_done: int) -> float:
    """The decay of the next update, after `updates_done` updates (timm ModelEmaV3.get_decay(step=k), k = done + 1)."""
    assert cfg.decay is not None
    if updates_done <= 0:
        return 0.0
    if not cfg.warmup:
        return cfg.decay
    return min(cfg.decay, 1 - (1 + updates_done / cfg.warmup_gamma) ** -cfg.warmup_power)


class ModelEma:
    """The average of `model`'s weights (and buffers); `module` is an eval-mode model to evaluate."""

    def __init__(self, model: nn.Module, cfg: EmaConfig):
        self.cfg = cfg
        self._decay = 0.0
        self.averaged = AveragedModel(model, multi_avg_fn=self._average, use_buffers=cfg.buffers == "average")
        self.averaged.eval()

    @property
    def module(self) -> nn.Module:
        return self.averaged.module

    @property
    def updates(self) -> int:
        return int(self.averaged.n_averaged)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self._decay = ema_decay(self.cfg, self.updates)
        self.averaged.update_parameters(model)

    def _average(self, averaged: list[torch.Tensor], current: list[torch.Tensor], _: Any) -> None:
        # AveragedModel groups tensors by device and dtype: integer buffers come in a list of their own.
        if averaged[0].is_floating_point():
            get_ema_multi_avg_fn(self._decay)(averaged, current, _)
        else:  # num_batches_tracked: copied, as timm does
            for mine, theirs in zip(averaged, current):
                mine.copy_(theirs)

    def state_dict(self) -> dict[str, Any]:
        # `inference`: these are the run's weights (what models/weights.read_state_dict loads from a checkpoint).
        return {"weights": self.module.state_dict(), "updates": self.updates, "inference": True}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["weights"])
        self.averaged.n_averaged.fill_(int(state["updates"]))
