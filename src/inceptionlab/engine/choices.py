"""Every check a recipe can be given before any data is read, in one place.

Two kinds. Values that name an entry of an engine table are checked against that very table (OPTIMIZERS,
SCHEDULES, TASKS, READERS, loaders, precisions, the epoch metrics, BatchNorm policies): adding an optimizer to
`engine/optim.py` makes it a valid `optim.name` with no second list to update. And values that cannot
work together (`conflicts`): each refused with one line naming the keys, their values and the fix,
instead of a crash after an epoch or a run that silently does something else. `config.py` checks each
section's own values; `check_recipe` is what `train`, `lr-find`, `demo`, `recipes --show` and the
session builder (the API) all call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from inceptionlab.config import Recipe, blame, load_recipe
from inceptionlab.data.loading.loaders import LOADERS
from inceptionlab.data.readers import ARRAY_READERS, READERS
from inceptionlab.engine.batchnorm import BN_POLICIES
from inceptionlab.engine.optim import OPTIMIZERS, SCHEDULES
from inceptionlab.engine.report import EPOCH_METRICS
from inceptionlab.engine.task import TASKS
from inceptionlab.errors import UserError
from inceptionlab.models.registry import check_model_kwargs
from inceptionlab.runtime import AUTOCAST_DTYPES


def recipe_choices(recipe: Recipe) -> list[tuple[str, str, Iterable[str]]]:
    """(key, value, valid names) for every recipe value that picks from a table."""
    return [
        ("task", recipe.task, TASKS),
        ("optim.name", recipe.optim.name, OPTIMIZERS),
        ("schedule.name", recipe.schedule.name, SCHEDULES),
        ("train.precision", recipe.train.precision, ["auto", *AUTOCAST_DTYPES]),
        ("train.best_metric", recipe.train.best_metric, EPOCH_METRICS),
        ("data.reader", recipe.data.reader, [*READERS, *ARRAY_READERS]),
        ("data.loader", recipe.data.loader, LOADERS),
        ("finetune.bn", recipe.finetune.bn, ["auto", *BN_POLICIES]),
    ]


def conflicts(recipe: Recipe) -> list[tuple[tuple[str, ...], str]]:
    """(the keys involved, the one-line message) for every pair of values that cannot work together."""
    found: list[tuple[tuple[str, ...], str]] = []
    train, metric = recipe.train, recipe.train.best_metric
    if metric.startswith("val_raw_") and not recipe.ema.enabled:
        found.append((("train.best_metric", "ema.decay"),
                      f"train.best_metric={metric} scores the trained weights beside their average, and there is "
                      f"no average without EMA: set ema.decay (e.g. 0.999) or train.best_metric="
                      f"{metric.replace('val_raw_', 'val_')}"))
    if recipe.task == "binary" and metric == "val_top5":
        found.append((("train.best_metric", "task"),
                      "train.best_metric=val_top5 means nothing for a binary task; use val_top1 or val_loss"))
    if recipe.data.sampler == "balanced" and train.class_weights == "auto":
        found.append((("data.sampler", "train.class_weights"),
                      "data.sampler=balanced and train.class_weights=auto both correct for uneven classes: together "
                      "a class's share of the loss goes as n^-(data.balance_power + train.class_weight_power), twice "
                      "the correction; keep one: set train.class_weights=null or data.sampler=shuffle"))
    if recipe.augment.per_image and recipe.data.reader not in READERS:
        found.append((("augment.policy", "augment.random_erasing", "data.reader"),
                      f"augment.policy and augment.random_erasing act on image folders; data.reader="
                      f"{recipe.data.reader} is served as arrays without per-image transforms: "
                      "set augment.policy=none and augment.random_erasing=0"))
    tune = recipe.finetune
    if tune.feature_cache is True and recipe.augment.on() and (tune.freeze_epochs or tune.body_lr_mult == 0):
        found.append((("finetune.feature_cache", "augment.policy", "augment.random_erasing", "augment.mixup_alpha",
                       "augment.cutmix_alpha"),
                      f"finetune.feature_cache=true trains the head-only epochs on one cached eval view of each "
                      f"image, where {', '.join(recipe.augment.on())} would not act: set finetune.feature_cache=auto "
                      "(the head then trains through the frozen body, augmented) or drop the augmentation"))
    if recipe.augment.mixes and recipe.task != "multiclass":
        found.append((("augment.mixup_alpha", "augment.cutmix_alpha", "task"),
                      f"augment.mixup_alpha and augment.cutmix_alpha mix the targets of a multiclass task, "
                      f"not task={recipe.task}: set both to 0"))
    return found


def check_recipe(recipe: Recipe, where: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Every table choice and every combination of `recipe`; the first bad one is a UserError blamed on the
    last --set that gave one of its keys, else on `where`. Reads no data, builds nothing but the model's
    argument list."""
    for key, value, valid in recipe_choices(recipe):
        names = list(valid)
        if value not in names:
            raise UserError(f"{blame(where, overrides, key)}: {key}={value!r} is not one of {', '.join(names)}")
    for keys, message in conflicts(recipe):
        raise UserError(f"{blame(where, overrides, keys)}: {message}")
    check_model_kwargs(recipe.model.name, recipe.model.kwargs)
    return recipe


def load_training_recipe(name_or_path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """`config.load_recipe` plus `check_recipe`: what `train`, `lr-find`, `demo` and `recipes --show` load."""
    return check_recipe(load_recipe(name_or_path, overrides), name_or_path, overrides)
