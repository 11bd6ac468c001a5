"""Optimizer, parameter groups and learning-rate schedule: what trains when, at what rate.

Parameter groups come from the registry's parts of the model (models/parts.py): the head, the
auxiliary heads and the body, the body split further into its layers when `finetune.layer_decay` is
set. Each is split again into parameters that decay and ones that do not (normalisation layers'
weights and biases, unless `optim.decay_norm_and_bias`). Every group carries its name, its part and
its rate multiplier in the optimizer's param_groups (saved with its state).

The schedule is one `LambdaLR` stepped after every optimizer step; each group's rate is
`optim.lr x multiplier x factor(step)`. The factor of a step is, in order:

1. the phase: with `finetune.freeze_epochs` F (0 < F < epochs), the first F epochs train the head
   alone at optim.lr (the body and auxiliary heads at 0: they are frozen, engine/finetune.py); the
   schedule below then starts again at epoch F for every group, so its warm-up protects the newly
   unfrozen body. With F >= epochs (a linear probe) the schedule spans the run, the body at 0;
2. a linear warm-up over `schedule.warmup_epochs` from `warmup_start_factor`, rising every step
   (`warmup_per_step`, the references' default) or once per epoch;
3. the main schedule, a function of the epoch as in the guide (steplr, cosine, constant), over the
   epochs after the warm-up.

The step counts in the image loader's steps per epoch; `fit` places the schedule at epoch x that count
at each epoch's start (`seek_schedule`), because an epoch may run another loader: head-only epochs on
cached features have as many steps as there are readable images, the image loader as many as files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn
from torch.optim import lr_scheduler

from inceptionlab.config import FinetuneConfig, OptimConfig, ScheduleConfig
from inceptionlab.models.parts import ModelParts

# Fused kernels update every parameter in one call: on the CPU the default per-tensor loop costs
# ~0.5 ms per step for a 2-layer MLP, more than its forward and backward together.
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": lambda params, c, fused: torch.optim.SGD(
        params, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay, nesterov=c.nesterov, fused=fused
    ),
    "adamw": lambda params, c, fused: torch.optim.AdamW(
        params, lr=c.lr, betas=tuple(c.betas), weight_decay=c.weight_decay, fused=fused
    ),
    "adam": lambda params, c, fused: torch.optim.Adam(
        params, lr=c.lr, betas=tuple(c.betas), weight_decay=c.weight_decay, fused=fused
    ),
}


def _steplr(c: ScheduleConfig, epochs: int, lr: float) -> Callable[[int], float]:
    return lambda epoch: c.gamma ** (epoch // c.step_size)


def _cosine(c: ScheduleConfig, epochs: int, lr: float) -> Callable[[int], float]:
    floor = c.min_lr / lr  # CosineAnnealingLR's eta_min, as a share of the group's rate
    return lambda epoch: floor + (1 - floor) * (1 + math.cos(math.pi * epoch / max(1, epochs))) / 2


def _constant(c: ScheduleConfig, epochs: int, lr: float) -> Callable[[int], float]:
    return lambda epoch: 1.0


# schedule.name -> (config, epochs of the main schedule, optim.lr) -> factor of an epoch (0-based).
SCHEDULES: dict[str, Callable[[ScheduleConfig, int, float], Callable[[int], float]]] = {
    "steplr": _steplr,
    "cosine": _cosine,
    "constant": _constant,
}

# Normalisation layers whose weights get no weight decay (torchvision references' norm_weight_decay; the
# public classes, where the references name torch's private bases _BatchNorm and _InstanceNorm).
NORM_LAYERS = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
    nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
    nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm,
)


def _can_fuse(params: list[torch.nn.Parameter]) -> bool:
    return bool(params) and all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params)


def no_decay_names(model: nn.Module) -> set[str]:
    """Parameters of normalisation layers, and biases (and other 1-D tensors): timm's and the torchvision
    references' default exclusions from weight decay."""
    names = set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if isinstance(module, NORM_LAYERS) or name == "bias" or param.ndim <= 1:
                names.add(full)
    return names


@dataclass(frozen=True)
class GroupPlan:
    name: str  # head | aux | body | body/<layer>; "/no_decay" appended for the undecayed half
    part: str  # head | aux | body
    names: tuple[str, ...]
    lr_mult: float
    decay: bool


def plan_groups(model: nn.Module, parts: ModelParts, optim: OptimConfig, finetune: FinetuneConfig) -> list[GroupPlan]:
    """The parameter groups of `model`: parts x layers (with layer_decay) x decay / no decay."""
    undecayed = set() if optim.decay_norm_and_bias else no_decay_names(model)
    units: list[tuple[str, str, tuple[str, ...], float]] = [("head", "head", parts.head, 1.0),
                                                           ("aux", "aux", parts.aux, 1.0)]
    body_mult = finetune.body_lr_mult
    if finetune.layer_decay is None:
        units.append(("body", "body", parts.body, body_mult))
    else:
        depth = len(parts.layers)
        for index, layer in enumerate(parts.layers):  # the layer next to the head: layer_decay^1
            units.append((f"body/{layer.name or '(model)'}", "body", layer.params,
                          body_mult * finetune.layer_decay ** (depth - index)))
    plans = []
    for name, part, names, mult in units:
        decayed = tuple(n for n in names if n not in undecayed)
        plain = tuple(n for n in names if n in undecayed)
        plans += [GroupPlan(name, part, decayed, mult, True)] if decayed else []
        plans += [GroupPlan(f"{name}/no_decay", part, plain, mult, False)] if plain else []
    return plans


def build_optimizer(params: Iterable[torch.nn.Parameter] | nn.Module, cfg: OptimConfig, *,
                    parts: ModelParts | None = None, finetune: FinetuneConfig | None = None) -> torch.optim.Optimizer:
    """The optimizer over a module's parameter groups (`parts` given), or over plain parameters."""
    if parts is None:
        params = [p for p in (params.parameters() if isinstance(params, nn.Module) else params) if p.requires_grad]
        return OPTIMIZERS[cfg.name](params, cfg, _can_fuse(params) or None)
    assert isinstance(params, nn.Module)
    named = dict(params.named_parameters())
    groups = [{"params": [named[n] for n in plan.names], "name": plan.name, "part": plan.part, "lr_mult": plan.lr_mult,
               "lr": cfg.lr * plan.lr_mult, "weight_decay": cfg.weight_decay if plan.decay else 0.0}
              for plan in plan_groups(params, parts, cfg, finetune or FinetuneConfig())]
    every = [p for group in groups for p in group["params"]]
    return OPTIMIZERS[cfg.name](groups, cfg, _can_fuse(every) or None)


@dataclass(frozen=True)
class Phases:
    """Which epochs train the head alone and where the schedule starts."""

    epochs: int
    freeze_epochs: int = 0

    @property
    def linear_probe(self) -> bool:
        return self.freeze_epochs >= self.epochs

    @property
    def schedule_start(self) -> int:
        """The epoch the warm-up and main schedule start at: after the head-only epochs, or 0."""
        return 0 if self.linear_probe else self.freeze_epochs

    def head_only(self, epoch: int) -> bool:
        return epoch < self.freeze_epochs


def schedule_factor(cfg: ScheduleConfig, phases: Phases, steps_per_epoch: int, lr: float) -> Callable[[int, str], float]:
    """factor(global step, part) of the rate; see the module docstring."""
    span = phases.epochs - phases.schedule_start
    main = SCHEDULES[cfg.name](cfg, span - cfg.warmup_epochs if cfg.warmup_epochs else span, lr)
    warm_steps = cfg.warmup_epochs * steps_per_epoch

    def warmup(step: int) -> float:
        if step >= warm_steps:
            return 1.0
        done = step if cfg.warmup_per_step else (step // steps_per_epoch) * steps_per_epoch
        return cfg.warmup_start_factor + (1 - cfg.warmup_start_factor) * done / warm_steps

    def factor(step: int, part: str) -> float:
        epoch = step // steps_per_epoch
        if phases.head_only(epoch) and part != "head":
            return 0.0  # frozen
        if phases.head_only(epoch) and not phases.linear_probe:
            return 1.0  # head-only epochs before the unfreeze: optim.lr
        local = step - phases.schedule_start * steps_per_epoch
        local_epoch = local // steps_per_epoch
        return warmup(local) * main(max(0, local_epoch - cfg.warmup_epochs))

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: ScheduleConfig, epochs: int, *, steps_per_epoch: int = 1,
                    freeze_epochs: int = 0, lr: float | None = None) -> lr_scheduler.LambdaLR:
    """A LambdaLR to step after every optimizer step (steps_per_epoch=1: once per epoch)."""
    base = lr if lr is not None else optimizer.param_groups[0]["lr"] / optimizer.param_groups[0].get("lr_mult", 1.0)
    factor = schedule_factor(cfg, Phases(epochs, freeze_epochs), steps_per_epoch, base)
    parts = [group.get("part", "head") for group in optimizer.param_groups]
    # Plain closures, not callable objects: LambdaLR saves an object's attributes in its state_dict and
    # would restore the old settings over a resumed run's (`--set schedule....`).
    return lr_scheduler.LambdaLR(optimizer, [_for_part(factor, part) for part in parts])


def _for_part(factor: Callable[[int, str], float], part: str) -> Callable[[int], float]:
    return lambda step: factor(step, part)


def seek_schedule(scheduler: lr_scheduler.LambdaLR, step: int) -> None:
    """Place `scheduler` at global `step` (epoch x steps per epoch + steps done in it): every group's rate as
    the schedule gives it there. Nothing changes when it is there already (an epoch of the image loader's
    length, or a resumed run whose checkpoint holds the position)."""
    if scheduler.last_epoch == step:
        return
    scheduler.last_epoch = step - 1
    scheduler.step()  # LambdaLR's own step: the rates of `step`, and get_last_lr() with them
