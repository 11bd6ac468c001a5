"""What a run says about itself before its first step: the lines `train` and `lr-find` print.

Pure wording: each function turns what the session builder decided (recipe values, the optimizer's
groups, the task's class weights, the device) into lines. Nothing here decides anything.
"""

from __future__ import annotations

from typing import Any

import torch

from inceptionlab import hardware
from inceptionlab.config import DataConfig, Recipe, needed_cache_size
from inceptionlab.data.loading.sampler import class_counts

RANDOM_INIT = "weights: random init (training from scratch)"


def imbalance_notes(recipe: Recipe, task: Any, targets: torch.Tensor, num_classes: int) -> list[str]:
    """Uneven classes, and what the run does about them (class weights, the balanced sampler)."""
    counts = class_counts(targets, num_classes)
    present = counts[counts > 0]
    notes = []
    if len(present) and int(present.max()) > 2 * int(present.min()):
        notes.append(f"classes: {int(present.min())} to {int(present.max())} training images per class"
                     + ("" if recipe.data.sampler == "balanced" or recipe.train.class_weights is not None else
                        " (imbalanced: see train.class_weights=auto or data.sampler=balanced)"))
    weights = getattr(task, "class_weights", None)
    if weights is not None:
        notes.append(f"class weights: {float(weights.min()):.3g} to {float(weights.max()):.3g} (mean 1)"
                     if recipe.train.class_weights == "auto" else "class weights: as listed in the recipe"
                     + (", on top of the balanced sampler (each class's weight multiplies its share of the draws)"
                        if recipe.data.sampler == "balanced" else ""))
    if recipe.data.sampler == "balanced":
        power = recipe.data.balance_power
        notes.append("sampler: balanced (" + ("every class drawn equally often" if power == 1 else
                     f"class drawn in proportion to its count^{1 - power:g}") + ", as many draws per epoch as images)")
    return notes


# A linear probe's head needs steps, not epochs: Fashion-MNIST through EfficientNet-Lite0 with 10 labels a class
# (100 images, 4 steps an epoch at batch 32) scored 0.547 +- 0.018 in 24 steps (6 epochs, lr 0.03) and
# 0.727 +- 0.018 in 40 (10 epochs, lr 0.1); with 20 a class (42 steps) Inception's probe was within 0.007 of
# the best arm (benchmarks/transfer_real.py, 3 seeds, AMD EPYC Zen 4, 2026-12-05).
PROBE_MIN_STEPS = 40


def few_probe_steps_notes(recipe: Recipe, steps_per_epoch: int) -> list[str]:
    """Said when a linear probe's head gets fewer than PROBE_MIN_STEPS optimizer steps in all."""
    epochs = recipe.train.epochs
    steps = steps_per_epoch * epochs
    probe = recipe.finetune.body_lr_mult == 0 or recipe.finetune.freeze_epochs >= epochs  # the body never trains
    if not probe or steps >= PROBE_MIN_STEPS:
        return []
    enough = -(-PROBE_MIN_STEPS // max(steps_per_epoch, 1))
    return [f"note: the head gets {steps} optimizer steps in all ({steps_per_epoch} an epoch x {epochs} epochs); a "
            f"probe with 10 photos a class scored 0.547 in 24 steps at lr 0.03 and 0.727 in 40 at lr 0.1 "
            f"(Fashion-MNIST, docs/fine-tuning.md): for at least {PROBE_MIN_STEPS}, set train.epochs={enough} "
            "(epochs on cached features cost little) and try a higher optim.lr"]


def optimizer_notes(recipe: Recipe, optimizer: torch.optim.Optimizer) -> list[str]:
    """The optimizer, its rates by part, what decays and the warm-up, in one line."""
    groups = optimizer.param_groups
    undecayed = sum(len(g["params"]) for g in groups if g["weight_decay"] == 0)
    rates = sorted({round(g["lr_mult"], 6) for g in groups if g["part"] == "body"})
    shown = f"body x{rates[0]:g}" if len(rates) == 1 else f"body x{rates[0]:.3g} .. x{rates[-1]:.3g} by layer"
    decay = ("every parameter decays" if recipe.optim.decay_norm_and_bias else
             f"{undecayed} norm and bias tensors without weight decay")
    warm = recipe.schedule
    warmup = (f"; warm-up {warm.warmup_epochs} epochs {'per step' if warm.warmup_per_step else 'per epoch'}"
              if warm.warmup_epochs else "")
    return [f"optimizer: {recipe.optim.name} lr {recipe.optim.lr:g} (head x1, {shown}), {len(groups)} groups; "
            f"{decay}{warmup}"]


def cache_size_notes(data: DataConfig) -> list[str]:
    """A warning when data.cache_size keeps images smaller than the eval resize or the training crop
    needs (validation would upsample what `evaluate` resizes from the file)."""
    needed = needed_cache_size(data)
    if data.cache_size is None or needed is None or data.cache_size >= needed:
        return []
    return [f"warning: data.cache_size={data.cache_size} keeps a photo's shorter side at {data.cache_size} px, "
            f"below the {needed} px the model resizes to (data.val_resize_size, data.train_crop_size): validation "
            f"upsamples such images and differs from `evaluate`; set data.cache_size=null (or {needed})"]


def speed_warnings(recipe: Recipe, device: torch.device) -> list[str]:
    """Said at once when a set precision can only be emulated on this device."""
    warning = hardware.emulation_warning(hardware.device_facts(device), recipe.train.precision)
    return [f"warning: {warning}"] if warning else []


def from_scratch_recipe(recipe: Recipe) -> bool:
    """Every layer at the full rate from the first step: no head-only epochs, no warm-up, no lower body rate."""
    tune = recipe.finetune
    return (tune.freeze_epochs == 0 and recipe.schedule.warmup_epochs == 0 and tune.body_lr_mult == 1
            and tune.layer_decay is None)


def from_scratch_warning(recipe: Recipe) -> str:
    """Weights given to a recipe written for training from scratch: named, not changed (no default measured
    on real weights rescues every case: docs/fine-tuning.md), and harmless since epoch 0 keeps the start."""
    return (f"warning: model.weights={recipe.model.weights} starts from trained weights, but every layer trains at "
            f"optim.lr={recipe.optim.lr:g} from the first step (schedule.warmup_epochs=0, finetune.freeze_epochs=0, "
            "finetune.body_lr_mult=1: a recipe for training from scratch), which can wreck them; model.pt keeps the "
            "starting weights unless an epoch scores better; to fine-tune, set schedule.warmup_epochs=1 or "
            "finetune.freeze_epochs=1, or a lower optim.lr")


def random_body_freeze_skipped(recipe: Recipe) -> str:
    return (f"finetune.freeze_epochs={recipe.finetune.freeze_epochs} skipped: the body is random init "
            f"(model.weights={recipe.model.weights or 'null'}), and a head trained on random features learns nothing "
            "the whole model keeps; the whole model trains from epoch 1")


def random_body_probe_refused(recipe: Recipe) -> str:
    tune = recipe.finetune
    why = ("finetune.body_lr_mult=0" if tune.body_lr_mult == 0 else
           f"finetune.freeze_epochs={tune.freeze_epochs} >= train.epochs={recipe.train.epochs}")
    fix = "finetune.body_lr_mult=1" if tune.body_lr_mult == 0 else "finetune.freeze_epochs=0"
    return (f"{why} trains only the head, on a random body (model.weights={recipe.model.weights or 'null'} loads "
            f"none): a linear probe of random features; set model.weights (imagenet, a weights file or a run "
            f"directory) or {fix}")
