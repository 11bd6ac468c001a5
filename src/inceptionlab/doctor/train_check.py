"""`inceptionlab doctor --train-check`: the guide's "run a basic PyTorch example", done properly.

A small CNN (conv, batch norm, ReLU, max-pool, linear, cross-entropy, AdamW: the kernels every
training run needs) trains on scikit-learn's 1,797 real 8x8 digits (they ship inside its wheel: no
network) for a few seconds on each device: the CPU and every visible GPU. The check passes when the
training loss falls to under half its start and held-out accuracy is far above chance (0.1), and it
reports images/s. An install that passes has trained a model, not only run one convolution.

The data sit on the device as one tensor, so images/s measures the device, not a data loader; with
8x8 images a GPU is bound by kernel launches, so read the figure as "it trains", not as a benchmark.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from inceptionlab.data.datasets.digits import load_digits_arrays, split_indices
from inceptionlab.errors import UserError

CHANCE = 0.1  # 10 digit classes


@dataclass(frozen=True)
class TrainCheckSettings:
    seconds: float = 3.0  # training time per device after warm-up; the minimum steps come first
    min_steps: int = 30  # measured here: by step 30 the loss is 1.96 -> 0.21, held-out top-1 0.96
    max_steps: int = 5_000  # a fast GPU does ~1,000 steps/s on this model: cap the work, not just the time
    warmup_steps: int = 5  # first steps pay lazy initialisation and kernel selection: not timed
    batch_size: int = 64
    lr: float = 3e-3
    seed: int = 0
    # Pass criteria: loss at most half the first steps' (2.3 -> < 1.15) and top-1 far above chance.
    max_loss_ratio: float = 0.5
    min_val_top1: float = 0.8


@dataclass(frozen=True)
class DigitsTensors:
    train_x: torch.Tensor  # N x 1 x 8 x 8 float32 in [-1, 1]
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor

    def to(self, device: torch.device) -> DigitsTensors:
        return DigitsTensors(*(t.to(device) for t in (self.train_x, self.train_y, self.val_x, self.val_y)))


@dataclass(frozen=True)
class TrainCheckResult:
    device: str
    steps: int
    seconds: float
    images_per_s: float
    first_loss: float
    last_loss: float
    val_top1: float
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.ok else "fail",
            "steps": self.steps,
            "seconds": round(self.seconds, 3),
            "images_per_s": round(self.images_per_s, 1),
            "first_loss": round(self.first_loss, 4),
            "last_loss": round(self.last_loss, 4),
            "val_top1": round(self.val_top1, 4),
            "detail": self.detail,
        }


def load_digits_tensors() -> DigitsTensors:
    """The demo's stratified split of the digits: train (70%) to train, val + test (30%) held out."""
    images, targets = load_digits_arrays()
    splits = split_indices(targets)
    held_out = splits["val"] + splits["test"]
    x = torch.from_numpy(images).float().div_(127.5).sub_(1.0).unsqueeze(1)
    y = torch.from_numpy(targets.astype(np.int64))
    train, val = torch.tensor(splits["train"]), torch.tensor(held_out)
    return DigitsTensors(x[train], y[train], x[val], y[val])


def small_cnn(num_classes: int = 10) -> nn.Module:
    """8x8x1 -> 16 -> 32 channels (3x3, batch norm, ReLU) -> max-pool to 4x4 -> linear: 10k parameters.

    32/64 channels learn no better in 30 steps (top-1 0.976 vs 0.959) at 3x the time per step."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, num_classes),
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _batches(count: int, batch_size: int, generator: torch.Generator):
    """Endless shuffled index batches (CPU tensors), a new order every epoch."""
    while True:
        order = torch.randperm(count, generator=generator)
        for start in range(0, count - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def train_on_device(
    device: str | torch.device, data: DigitsTensors, settings: TrainCheckSettings = TrainCheckSettings()
) -> TrainCheckResult:
    """Train the small CNN on `device` for `settings.seconds` (at least `min_steps` steps) and judge it."""
    device = torch.device(device)
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG as it was
        torch.manual_seed(settings.seed)
        model = small_cnn().to(device)
    generator = torch.Generator().manual_seed(settings.seed)
    on_device = data.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr)
    losses: list[torch.Tensor] = []  # kept on the device: one transfer at the end, no per-step sync
    started = timed_from = time.perf_counter()
    model.train()
    for step, index in enumerate(_batches(len(data.train_y), settings.batch_size, generator), start=1):
        index = index.to(device)
        loss = nn.functional.cross_entropy(model(on_device.train_x[index]), on_device.train_y[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        if step == settings.warmup_steps:
            _sync(device)
            timed_from = time.perf_counter()
        elapsed = time.perf_counter() - timed_from
        if step >= settings.max_steps or (step >= settings.min_steps and elapsed >= settings.seconds):
            break
    _sync(device)
    seconds = time.perf_counter() - timed_from
    timed_steps = max(step - settings.warmup_steps, 0)
    values = torch.stack(losses).float().cpu()
    return _judge(device, step, time.perf_counter() - started, timed_steps * settings.batch_size / max(seconds, 1e-9),
                  values, _top1(model, on_device), settings)


@torch.no_grad()
def _top1(model: nn.Module, data: DigitsTensors) -> float:
    model.eval()
    predicted = model(data.val_x).argmax(dim=1)
    return float((predicted == data.val_y).float().mean())


def _judge(device: torch.device, steps: int, seconds: float, images_per_s: float, losses: torch.Tensor,
           val_top1: float, settings: TrainCheckSettings) -> TrainCheckResult:
    # Means over 5 / 10 steps: one batch of 64 is noisy, the trend is what matters.
    first, last = float(losses[:5].mean()), float(losses[-10:].mean())
    summary = (f"loss {first:.2f} -> {last:.2f} in {steps} steps ({seconds:.1f} s), "
               f"{images_per_s:,.0f} img/s, held-out top-1 {val_top1:.3f} (chance {CHANCE})")
    problems = []
    if not (math.isfinite(first) and math.isfinite(last)):
        problems.append("the loss is not finite")
    elif last > settings.max_loss_ratio * first:
        problems.append(f"the loss did not fall below {settings.max_loss_ratio:g} x its start")
    if val_top1 < settings.min_val_top1:
        problems.append(f"held-out top-1 is under {settings.min_val_top1}")
    detail = summary if not problems else f"{summary}: {'; '.join(problems)} (a broken kernel or optimizer)"
    return TrainCheckResult(str(device), steps, seconds, images_per_s, first, last, val_top1, not problems, detail)


def train_checks(devices: list[dict[str, Any]], settings: TrainCheckSettings = TrainCheckSettings()
                 ) -> list[tuple[str, str, str]]:
    """Train on every device entry of a doctor report (adding its "train" result); one (name, status,
    detail) row each, which doctor turns into its checks (this module never imports doctor: no cycle)."""
    try:
        data = load_digits_tensors()
    except UserError as exc:
        return [("train", "fail", str(exc))]
    checks = []
    for entry in devices:
        if "error" in entry:  # a GPU that could not even be queried already has a failing check
            continue
        try:
            result = train_on_device(entry["device"], data, settings)
        except Exception as exc:  # a missing kernel or a driver error is the finding, not a crash
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            entry["train"] = {"status": "fail", "detail": f"training failed: {message}"}
            checks.append((f"train {entry['device']}", "fail", entry["train"]["detail"]))
            continue
        entry["train"] = result.to_dict()
        checks.append((f"train {entry['device']}", "ok" if result.ok else "fail", result.detail))
    return checks
