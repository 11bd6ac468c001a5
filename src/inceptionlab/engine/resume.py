"""`train --resume RUN --set key=value`: what a checkpoint can take, checked before anything is written.

A checkpoint holds the optimizer's state, the schedule's position and the model's weights, all made
under the recipe it was saved with. A value changed on resume is either applied so that the run really
trains with it (and said), or refused with a one-line error before the session is built:

- `train.epochs` trains to the new last epoch; the schedule, like every `schedule.*` value, is the new
  recipe's at the step reached (engine/optim.py's schedule is a function of the step built from the
  recipe; the checkpoint holds only its position);
- `optim.lr` scales every parameter group's rate and the schedule's base rates by new / old: the
  restored optimizer state would otherwise bring the old rate back while recipe.resolved.yaml said
  the new one;
- settings of the loop, the loss, the data path, the augmentation and the schedule (`RESUMABLE`,
  `RESUMABLE_SECTIONS`) are taken as they are;
- everything else (the model, the optimizer's name and its other values, fine-tuning stages and EMA,
  the data's shape and splits, the batch size and the seed, which fix the sample order) is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from inceptionlab.checkpoint import RunDir
from inceptionlab.config import Recipe, recipe_to_dict
from inceptionlab.data.datasets.file_list import SPLITS_FILE
from inceptionlab.errors import UserError

# Recipe keys a resumed run takes as they are: they change how the loop runs or where the data comes from,
# not what the checkpoint's state means.
RESUMABLE = frozenset({
    "description", "train.epochs", "optim.lr", "train.log_every", "train.eval_batch_size",
    "train.early_stop_patience", "train.early_stop_min_delta", "train.threads", "train.device",
    "train.deterministic", "train.grad_clip_norm", "train.label_smoothing", "train.precision",
    "train.channels_last", "train.compile", "data.root", "data.download", "data.num_workers", "data.loader",
    "data.hflip", "data.train_crop_scale", "train.micro_batch_size", "train.class_weights",
    "train.class_weight_power",
})
# Whole sections a resumed run takes as they are: the training augmentation holds no checkpoint state
# (turning MixUp off for the last epochs, say, is a legitimate change mid-run), and the schedule is
# recomputed from the recipe at the step the checkpoint reached.
RESUMABLE_SECTIONS = ("augment.", "schedule.")

# Why a refused key cannot change, by its section (the first match of the key's prefix).
WHY_NOT = (
    ("model.", "the checkpoint holds this model's weights"),
    ("optim.", "the checkpoint holds the optimizer's state for the old value"),
    ("train.batch_size", "the sample order and the step to resume at follow from it"),
    ("train.seed", "the sample order and the augmentation follow from it"),
    ("train.best_metric", "best.pt and early stopping have tracked the old metric"),
    ("data.", "the model's input and the splits were fixed when the run started"),
    ("", "the run was made with the old value"),
)


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key} {self.old} -> {self.new}"


def flat(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, dict) and key != "kwargs":
            yield from flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def resume_changes(ckpt: dict[str, Any], recipe: Recipe, run: Path) -> list[Change]:
    """The recipe's differences from the checkpoint's, each one a resumed run can take; raises UserError
    (one line, naming the key) for any other. Values still `null`/`auto` (filled in later, exactly as
    when the run started) are no change."""
    saved = dict(flat(json.loads(ckpt["recipe"])))
    changes = [Change(key, saved.get(key), value) for key, value in flat(recipe_to_dict(recipe))
               if value not in (None, "auto") and saved.get(key) != value and not _own_split(key, value, run)]
    for change in changes:
        _check(change, saved, ckpt, run)
    return changes


def _own_split(key: str, value: Any, run: Path) -> bool:
    """The run's own splits.csv, read back on resume (file_list.recorded_split) so that it trains on the
    images it started with, is the split the checkpoint was made on: no change, wherever the run now lies."""
    return key == "data.split_file" and Path(value) == Path(run) / SPLITS_FILE


def _check(change: Change, saved: dict[str, Any], ckpt: dict[str, Any], run: Path) -> None:
    done = int(ckpt["epoch"])
    if change.key not in RESUMABLE and not change.key.startswith(RESUMABLE_SECTIONS):
        why = next(reason for prefix, reason in WHY_NOT if change.key.startswith(prefix))
        raise UserError(f"--resume {run}: {change.key} cannot change on resume ({change.old} -> {change.new}): {why}; "
                        f"start a new run for it (on resume only {', '.join(sorted(RESUMABLE - {'description'}))} "
                        "and the augment and schedule sections may change)")
    if change.key == "train.epochs" and change.new <= done:
        raise UserError(f"--resume {run}: train.epochs={change.new}, but the run has done {done} epochs already; "
                        f"give more than {done}")
    if change.key == "train.precision" and "fp16" in (change.old, change.new):
        raise UserError(f"--resume {run}: train.precision cannot change to or from fp16 on resume "
                        f"({change.old} -> {change.new}): the checkpoint's loss scaler state belongs to it")


def refuse_finished(ckpt: dict[str, Any], recipe: Recipe, run: Path) -> None:
    """A run that finished all its epochs has nothing to resume: say how to train it longer (resuming it
    ran no epoch and rewrote its summary.json without the last epoch's scores). A run stopped by Ctrl-C
    in its last interval still resumes, to write what a finished run writes."""
    done, epochs = int(ckpt["epoch"]), recipe.train.epochs
    summary = RunDir(run).summary_file
    status = json.loads(summary.read_text()).get("status") if summary.is_file() else None
    if done >= epochs and int(ckpt["step_in_epoch"]) == 0 and status != "interrupted":
        raise UserError(f"--resume {run}: the run has finished its {epochs} epochs; to train it longer, "
                        f"add --set train.epochs=N with N > {epochs}")


def apply_changes(changes: list[Change], optimizer: Any, scheduler: Any) -> list[str]:
    """Make the restored optimizer and schedule follow the changed values; returns what was done, to say."""
    said = []
    for change in changes:
        if change.key == "optim.lr":
            said.append(f"{change} (each parameter group's rate x{change.new / change.old:g})")
            _scale_rates(optimizer, scheduler, change.new / change.old)
        else:
            said.append(str(change))
    return said


def _parts(scheduler: Any) -> list[Any]:
    """The scheduler and the schedulers inside it (SequentialLR's warm-up and main schedule)."""
    inner = getattr(scheduler, "_schedulers", [])
    return [scheduler, *[part for child in inner for part in _parts(child)]]


def _scale_rates(optimizer: Any, scheduler: Any, ratio: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * ratio
        if "initial_lr" in group:
            group["initial_lr"] = group["initial_lr"] * ratio
    for part in _parts(scheduler):
        part.base_lrs = [rate * ratio for rate in part.base_lrs]
        if hasattr(part, "_last_lr"):
            part._last_lr = [rate * ratio for rate in part._last_lr]
