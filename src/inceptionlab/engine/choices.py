"""Recipe values that name an entry of an engine table, checked against that very table.

The tables that implement a choice (OPTIMIZERS, SCHEDULES, TASKS, READERS, loaders, precisions, the
epoch metrics) are the only list of what is valid: adding an optimizer to `engine/optim.py` makes it
a valid `optim.name` with no second list to update. `config.py` checks structure and cross-field
rules; this module adds these checks, before any data is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from inceptionlab.config import Recipe, load_recipe
from inceptionlab.data.loading.loaders import LOADERS
from inceptionlab.data.readers import ARRAY_READERS, READERS
from inceptionlab.engine.fit import EPOCH_METRICS
from inceptionlab.engine.optim import OPTIMIZERS, SCHEDULES
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
    ]


def check_choices(recipe: Recipe, where: str | Path) -> Recipe:
    for key, value, valid in recipe_choices(recipe):
        names = list(valid)
        if value not in names:
            raise UserError(f"{where}: {key}={value!r} is not one of {', '.join(names)}")
    if recipe.task == "binary" and recipe.train.best_metric == "val_top5":
        raise UserError(f"{where}: train.best_metric=val_top5 means nothing for a binary task; use val_top1 or val_loss")
    check_model_kwargs(recipe.model.name, recipe.model.kwargs)  # before any data is read
    return recipe


def load_training_recipe(name_or_path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """`config.load_recipe` plus the table checks: what `train`, `demo` and `recipes --show` load."""
    return check_choices(load_recipe(name_or_path, overrides), name_or_path)
