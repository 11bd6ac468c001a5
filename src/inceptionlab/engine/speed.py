"""`auto` speed settings of a training run, decided on this run's model, input, batch and device.

inceptionlab.hardware rules candidates out by probe and picks among the rest by images/s; this module supplies
the measurement: forward + loss + backward + optimizer step on a private copy of the run's model with
synthetic inputs of the run's shape, so the run itself (its weights, optimizer, RNG streams) is exactly
what it would have been with the chosen values set by hand. Candidates are timed eager (torch.compile is
the probe's decision), within hardware's budget, and the device's cached memory is given back before the
run's own model and data are placed.

Under torchrun rank 0 decides and every rank uses its decision (broadcast): the others wait for it in
that collective, so the calibration must end well inside the process group's timeout (NCCL's default
10 min). It does: nothing is compiled, and once the budget (CALIBRATION_BUDGET_S, 20 s on a CPU; 60 s on a
GPU, where each candidate's warm-up is the kernel search) is spent no further candidate runs, so rank 0's
wait is the budget plus at most one candidate's warm-up and two steps.
Calibrating on every rank instead would time each GPU alike but still need one decision (ranks must
train alike), and on a CPU host the ranks' calibrations would compete for the same cores.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
from torch import nn

from inceptionlab import hardware
from inceptionlab.config import Recipe, TrainConfig
from inceptionlab.engine.loop import StepSettings, train_step
from inceptionlab.engine.optim import build_optimizer

# On a CPU the candidates are timed at a batch whose step costs at most this much forward work, so that
# four candidates fit the 20 s bound: 32 images of Inception v3 at 80 px (0.82 GFLOP each forward) ran
# a training step in ~0.7 s on 2 cores of an AMD EPYC. At 299 px (11.4 GFLOP) that is batch 2.
# Convolutions' relative speeds (bf16 vs fp32, NHWC vs NCHW) hold across batch sizes on a CPU.
CPU_CALIBRATION_GFLOP = 26.0
# torch.compile is chosen (by the probe, never timed) only for runs of at least this many optimizer steps:
# compiling Inception v3's training graph takes minutes, which a shorter run cannot win back.
COMPILE_MIN_STEPS = 5_000


@dataclass(frozen=True)
class RunShape:
    """What the measured step looks like: the model's input per sample and the task."""

    input_shape: tuple[int, ...]  # (C, H, W) for images, (L,) for token ids
    tokens: bool
    num_classes: int
    vocab_size: int = 2
    steps: int = 0  # optimizer steps of the whole run (for compile's long-run rule)


def wanted(train: TrainConfig) -> hardware.Wanted:
    return hardware.Wanted(train.precision, train.channels_last, train.compile)


def is_decided(train: TrainConfig) -> bool:
    return hardware.AUTO not in (train.precision, train.channels_last, train.compile)


def resolve_speed_settings(recipe: Recipe, model: nn.Module, task: Any, device: torch.device, shape: RunShape, *,
                           broadcast: Callable[[Any], Any] = lambda decision: decision,
                           fresh: bool = False, is_main: bool = True) -> tuple[Recipe, hardware.Decision]:
    """The recipe with every `auto` of train.precision/channels_last/compile replaced by a decision."""
    facts = hardware.device_facts(device)
    train = recipe.train
    decision = None
    if is_main:
        decision = decide_training(recipe, model, task, device, shape, facts, fresh=fresh)
    decision = broadcast(decision)
    if device.type == "cuda":
        hardware.free_device_memory()  # the candidates' model copies and activations, before the run's own
    choice = decision.choice
    resolved = replace(train, precision=choice.precision, channels_last=choice.channels_last, compile=choice.compile)
    return replace(recipe, train=resolved), decision


def decide_training(recipe: Recipe, model: nn.Module, task: Any, device: torch.device, shape: RunShape,
                    facts: hardware.DeviceFacts, *, fresh: bool = False, measure: bool = True,
                    cache: hardware.SpeedCache | None = None) -> hardware.Decision:
    """Probe, then (with `measure`) time the remaining candidates; without it the cache or the probe decides."""
    want = wanted(recipe.train)
    if not _has_convolutions(model) and want.channels_last == hardware.AUTO:
        want = replace(want, channels_last=False)  # no convolution reads the memory format
    candidates, reasons = hardware.plan_candidates(facts, want, training=True, long_run=shape.steps >= COMPILE_MIN_STEPS)
    if len(candidates) == 1:  # nothing left to choose: no key, no FLOP count, no timing
        return hardware.decide(candidates, None, ruled_out=reasons)
    batch = calibration_batch(model, shape, step_batch(recipe.train), device)
    key = hardware.make_key("train", facts, recipe.model.name, shape.input_shape, batch,
                            extra=f"{recipe.task}/{recipe.optim.name}/aux={recipe.model.aux_loss_weight is not None}")
    timer = _training_measure(recipe, model, task, device, shape, batch) if measure else None
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        decision = hardware.decide(candidates, timer, key=key, cache=cache or hardware.SpeedCache(), fresh=fresh,
                                   ruled_out=reasons, budget_s=hardware.calibration_budget(facts))
    if batch != recipe.train.batch_size:
        decision.batch = batch
    return decision


def step_batch(train: TrainConfig) -> int:
    """Images per forward/backward: the micro-batch when set, else the batch (32 while still `auto`)."""
    for value in (train.micro_batch_size, train.batch_size):
        if isinstance(value, int):
            return value
    return 32


def calibration_batch(model: nn.Module, shape: RunShape, batch: int, device: torch.device) -> int:
    """The run's batch on a GPU; on a CPU capped so one step stays near CPU_CALIBRATION_GFLOP."""
    if device.type != "cpu" or shape.tokens:
        return batch
    gflop = hardware.gflop_per_sample(model, shape.input_shape)
    if not gflop:
        return batch
    return max(1, min(batch, int(CPU_CALIBRATION_GFLOP // gflop)))


def _has_convolutions(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())


def _training_measure(recipe: Recipe, model: nn.Module, task: Any, device: torch.device, shape: RunShape,
                      batch: int) -> hardware.Measure:
    inputs, targets = synthetic_batch(shape, batch, device, recipe.task)

    facts = hardware.device_facts(device)

    def measure(candidate: hardware.Candidate, seconds: float) -> float | None:
        step = training_step(recipe, model, task, device, candidate, inputs, targets)
        with hardware.gpu_settings(facts, candidate.precision, recipe.train.deterministic):  # as the run will
            return hardware.time_steps(step, batch, seconds)

    return measure


def synthetic_batch(shape: RunShape, batch: int, device: torch.device, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs of the run's shape (speed does not depend on values) and valid targets."""
    generator = torch.Generator().manual_seed(0)
    if shape.tokens:
        inputs = torch.randint(1, max(2, shape.vocab_size), (batch, *shape.input_shape), generator=generator)
    else:
        inputs = torch.randn(batch, *shape.input_shape, generator=generator)
    classes = 2 if task == "binary" else shape.num_classes
    targets = torch.randint(0, classes, (batch,), generator=generator)
    return inputs.to(device), targets.to(device)


def training_step(recipe: Recipe, model: nn.Module, task: Any, device: torch.device, candidate: hardware.Candidate,
                  inputs: torch.Tensor, targets: torch.Tensor) -> Callable[[], None]:
    """One timed step of `candidate` on a private copy of `model` (the run's own model is untouched),
    always eager: compile is the probe's decision (hardware.candidates), never timed."""
    memory_format = torch.channels_last if candidate.channels_last else torch.contiguous_format
    copied = copy.deepcopy(model).to(device=device, memory_format=memory_format).train()
    optimizer = build_optimizer(copied.parameters(), recipe.optim)
    scaler = torch.amp.GradScaler(device.type, enabled=candidate.precision == "fp16")
    settings = StepSettings(device, candidate.precision)
    batch = inputs.contiguous(memory_format=memory_format) if inputs.dim() == 4 else inputs

    def step() -> None:
        train_step(copied, task, optimizer, scaler, settings, batch, targets)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return step
