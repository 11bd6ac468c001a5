"""The training and evaluation loops: short and explicit. They never know which case study runs.

One step is the guide's: forward, loss, backward, optimizer step, with autocast, an optional
GradScaler (fp16), gradient clipping and channels_last inputs as settings, not branches per model.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

import torch
from torch import nn

from inceptionlab.engine.task import main_logits
from inceptionlab.metrics import RunningMeter
from inceptionlab.runtime import autocast


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite: parameters after this point are not worth saving."""


# At a log point: (this rank's mean loss since the last one) -> (a stop was requested on any rank, every
# rank's interval loss in rank order). Under DDP one collective (engine/distributed.py: agree_at_log), so
# every rank stops, and raises NonFiniteLoss, at the same step: a rank that raised alone left the others
# blocked in their next collective until NCCL's timeout.
Agree = Callable[[float], tuple[bool, list[float]]]


def alone(loss: float) -> tuple[bool, list[float]]:
    """One process, no stop requested."""
    return False, [loss]


class Task(Protocol):
    def loss_sum(self, output: Any, targets: torch.Tensor) -> torch.Tensor: ...
    def normaliser(self, targets: torch.Tensor) -> torch.Tensor | float: ...
    def eval_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor: ...
    def correct(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor: ...
    def meter(self, device: torch.device, confusion: bool = False) -> Any: ...


@dataclass
class StepSettings:
    device: torch.device
    precision: str = "fp32"
    prepare: Callable[[torch.Tensor], torch.Tensor] = lambda x: x  # on-device input preparation
    grad_clip_norm: float | None = None
    log_every: int = 10
    # MixUp/CutMix (data/transforms/mixing.py): (inputs, targets, epoch, step) -> (inputs, loss targets)
    mix: Callable[[torch.Tensor, torch.Tensor, int, int], tuple[torch.Tensor, torch.Tensor]] | None = None
    # Gradient accumulation: a batch larger than this is run in parts of at most this many samples, each
    # part's summed loss divided by the whole batch's normaliser, gradients summed, one optimizer step
    # (None: whole).
    micro_batch: int | None = None
    # Under DDP, which averages the ranks' gradients: this rank's normaliser -> what it divides by, the
    # ranks' mean normaliser (engine/distributed.py: normaliser_over_ranks). None: its own.
    normaliser_over_ranks: Callable[[torch.Tensor | float], torch.Tensor | float] | None = None

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.precision)

    def to_device(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = inputs.to(self.device, non_blocking=True)
        return self.prepare(inputs), targets.to(self.device, non_blocking=True)


@dataclass
class EpochResult:
    metrics: dict[str, float]
    steps: int  # steps run in this call
    samples: int
    seconds: float
    stopped: bool  # True when a stop was requested before the loader ended
    # After the epoch's first step (kernel search, oneDNN primitive creation, loader start-up): the
    # throughput the run reports. Equal to samples/seconds for a one-step epoch.
    steady_samples: int = 0
    steady_seconds: float = 0.0

    @property
    def images_per_s(self) -> float:
        if self.steady_samples and self.steady_seconds > 0:
            return self.steady_samples / self.steady_seconds
        return self.samples / max(self.seconds, 1e-9)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(
    model: nn.Module,
    task: Task,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    settings: StepSettings,
    inputs: torch.Tensor,
    targets: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimisation step; returns (loss, main logits), both detached. The loss is the batch's
    per-sample (class-weighted) mean, whatever micro-batching did."""
    optimizer.zero_grad(set_to_none=True)
    loss, logits = _forward_backward(model, task, scaler, settings, inputs, targets)
    if not scaler.is_enabled():
        # fp32/bf16: the plain step. The disabled scaler's calls cost ~25 us of Python per step,
        # 0.15 s over IMDB's 6,250 steps.
        if settings.grad_clip_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip_norm)
        optimizer.step()
        return loss, logits
    if settings.grad_clip_norm is not None:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss, logits


def _forward_backward(model: nn.Module, task: Task, scaler: torch.amp.GradScaler, settings: StepSettings,
                      inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward, in parts of `settings.micro_batch` when the batch is larger: each part's
    summed loss is divided by the whole batch's normaliser (engine/task.py), so the parts' gradients add
    up to the whole batch's mean loss's, class weights and soft targets included. Under DDP the gradients
    are all-reduced once, with the last part's backward. Returns the (loss, main logits) of the batch."""
    normaliser = task.normaliser(targets)
    divisor = normaliser if settings.normaliser_over_ranks is None else settings.normaliser_over_ranks(normaliser)
    if settings.micro_batch is None or targets.shape[0] <= settings.micro_batch:
        parts = [(inputs, targets)]
    else:
        parts = list(zip(inputs.split(settings.micro_batch), targets.split(settings.micro_batch)))
    no_sync = getattr(model, "no_sync", None)
    sums, logits = [], []
    for index, (part_inputs, part_targets) in enumerate(parts):
        last = index == len(parts) - 1
        with contextlib.nullcontext() if last or no_sync is None else no_sync():
            with settings.autocast():
                output = model(part_inputs)
                summed = task.loss_sum(output, part_targets)
            loss = summed / divisor
            (scaler.scale(loss) if scaler.is_enabled() else loss).backward()
        sums.append(summed.detach())
        logits.append(main_logits(output).detach())
    if len(parts) == 1:
        return sums[0] / normaliser, logits[0]
    return torch.stack(sums).sum() / normaliser, torch.cat(logits)


def train_one_epoch(
    model: nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    task: Task,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    settings: StepSettings,
    *,
    first_step: int = 0,
    on_log: Callable[[int, float], None] | None = None,
    agree: Agree = alone,
    epoch: int = 0,
    after_step: Callable[[], None] | None = None,
    train_mode: Callable[[nn.Module], Any] = nn.Module.train,
) -> EpochResult:
    """Train over `loader` until it ends or `agree` says a stop was requested.

    With `settings.mix`, the loss sees the mixed batch and its soft targets (a function of the epoch
    and step, so a resumed run mixes as an uninterrupted one); top-1 counts against the batch's own labels.

    The host waits for the device only at log intervals: that is when progress is reported and the
    ranks agree on the loss and on stopping (`agree`: a collective under DDP; every rank runs the same
    number of steps, so all ranks agree at the same steps). A stop requested within an interval
    therefore takes effect at the interval's end, or at the epoch's end.

    `after_step` runs after every optimizer step (the per-step schedule, the weights' average);
    `train_mode` puts the model in training mode (a frozen body stays in eval mode: engine/finetune.py).
    """
    train_mode(model)
    meter = RunningMeter(settings.device)
    steps = samples = 0
    stopped = False
    start = time.perf_counter()
    steady_start, first_samples = None, 0
    for inputs, targets in loader:
        inputs, targets = settings.to_device(inputs, targets)
        loss_targets = targets
        if settings.mix is not None:
            inputs, loss_targets = settings.mix(inputs, targets, epoch, first_step + steps)
        loss, logits = train_step(model, task, optimizer, scaler, settings, inputs, loss_targets)
        if after_step is not None:
            after_step()
        meter.update(loss, task.correct(logits, targets), targets.shape[0])
        steps, samples = steps + 1, samples + targets.numel()
        if steps == 1:  # one sync per epoch: the first step's one-off costs stay out of img/s
            _sync(settings.device)
            steady_start, first_samples = time.perf_counter(), samples
        if steps % settings.log_every == 0 and _log_and_agree(meter, first_step + steps, on_log, agree):
            stopped = True
            break
    else:  # the loader ended: ask once more, so a stop requested in the last interval ends the run here
        if steps > 0 and steps % settings.log_every != 0:
            stopped = _log_and_agree(meter, first_step + steps, None, agree)
    _sync(settings.device)
    end = time.perf_counter()
    metrics = meter.compute()
    if samples and not math.isfinite(metrics["loss"]):
        raise NonFiniteLoss(f"epoch mean loss is {metrics['loss']}")
    steady = (samples - first_samples, end - steady_start) if steps > 1 and steady_start is not None else (0, 0.0)
    return EpochResult(metrics, steps, samples, end - start, stopped, *steady)


def _log_and_agree(meter: RunningMeter, step: int, on_log: Callable[[int, float], None] | None, agree: Agree) -> bool:
    """Log this rank's interval loss, then agree with the other ranks on theirs and on stopping (a stop
    requested while logging counts at once); raise on a non-finite loss on any rank, on every rank with
    one message. True when a stop was requested."""
    loss = meter.interval_loss()
    if on_log is not None and math.isfinite(loss):
        on_log(step, loss)
    stop, losses = agree(loss)
    bad = [rank for rank, value in enumerate(losses) if not math.isfinite(value)]
    if bad:
        where = "" if len(losses) == 1 else " on rank " + ", ".join(map(str, bad))
        raise NonFiniteLoss(f"loss is {losses[bad[0]]} at step {step}{where}")
    return stop


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    task: Task,
    settings: StepSettings,
    *,
    confusion: bool = True,
    on_batch: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> dict[str, Any]:
    """Loss (sample-weighted), top-1, top-5 and the confusion matrix over the whole loader;
    `on_batch(logits, targets)` sees every batch (evaluate's per-image results table)."""
    model.eval()
    meter = task.meter(settings.device, confusion=confusion)
    start = time.perf_counter()
    samples = 0
    for inputs, targets in loader:
        inputs, targets = settings.to_device(inputs, targets)
        with settings.autocast():
            logits = main_logits(model(inputs))
        meter.update(logits, targets, task.eval_loss(logits, targets))
        if on_batch is not None:
            on_batch(logits, targets)
        samples += targets.numel()
    _sync(settings.device)
    result = meter.compute()
    result["seconds"] = time.perf_counter() - start
    return result
