"""Learning-rate schedules: the exact per-epoch rate of each schedule, with and without warm-up.

`fit` reads the rate at the start of an epoch, trains with it, then steps the scheduler once; the
helper below does the same, so these sequences are what metrics.jsonl's `lr` column holds.
"""

from __future__ import annotations

import math

import pytest
import torch

from inceptionlab.config import OptimConfig, ScheduleConfig
from inceptionlab.engine.optim import build_optimizer, build_scheduler

LR, EPOCHS, MIN_LR = 0.1, 6, 0.01
STEP = dict(step_size=2, gamma=0.5)  # StepLR: halve every 2 epochs
WARMUP = dict(warmup_epochs=2, warmup_start_factor=0.1)
# Linear warm-up over 2 epochs from 0.1 x lr: epoch 1 at 0.1 x lr, epoch 2 halfway to lr (0.55 x lr);
# the main schedule then starts from lr at epoch 3 and runs over the remaining 4 epochs.
WARM = [0.01, 0.055]


def cosine(epochs: int) -> list[float]:
    """CosineAnnealingLR(T_max=epochs, eta_min=MIN_LR) at epochs 0..epochs-1."""
    return [MIN_LR + (LR - MIN_LR) * (1 + math.cos(math.pi * e / epochs)) / 2 for e in range(epochs)]


EXPECTED = {
    ("steplr", False): [0.1, 0.1, 0.05, 0.05, 0.025, 0.025],
    ("steplr", True): WARM + [0.1, 0.1, 0.05, 0.05],
    ("cosine", False): cosine(6),  # 0.1, 0.0940, 0.0775, 0.055, 0.0325, 0.0160
    ("cosine", True): WARM + cosine(4),  # ..., 0.1, 0.0868, 0.055, 0.0232
    ("constant", False): [0.1] * 6,
    ("constant", True): WARM + [0.1] * 4,
}


def rates_per_epoch(schedule: ScheduleConfig, epochs: int = EPOCHS) -> list[float]:
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = build_optimizer([weight], OptimConfig(name="sgd", lr=LR))
    scheduler = build_scheduler(optimizer, schedule, epochs)
    rates = []
    for _ in range(epochs):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # an epoch of training
        scheduler.step()
    return rates


@pytest.mark.parametrize("name,warmup", list(EXPECTED), ids=[f"{n}-{'warmup' if w else 'no_warmup'}" for n, w in EXPECTED])
def test_learning_rate_per_epoch(name, warmup):
    schedule = ScheduleConfig(name=name, min_lr=MIN_LR, **STEP, **(WARMUP if warmup else {}))
    assert rates_per_epoch(schedule) == pytest.approx(EXPECTED[name, warmup], rel=1e-9, abs=1e-12)


def test_warmup_start_factor_sets_the_first_epochs_rate():
    schedule = ScheduleConfig(name="constant", warmup_epochs=4, warmup_start_factor=0.2)
    # 0.2 x lr rising linearly to lr over 4 epochs: +0.2 x lr per epoch
    assert rates_per_epoch(schedule) == pytest.approx([0.02, 0.04, 0.06, 0.08, 0.1, 0.1], rel=1e-9)
