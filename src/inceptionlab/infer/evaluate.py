"""Evaluate a trained run or a pretrained model on an image split: loss, top-1, top-5, per class.

For a pretrained ImageNet model, class folders may be named by WordNet id (n01443537, as in
tiny-imagenet and ImageNet itself) or by the model's own label; their images are scored against the
model's 1000 outputs, and per-class accuracy is reported for the classes present.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from inceptionlab import hardware
from inceptionlab.checkpoint import RunDir
from inceptionlab.config import load_recipe
from inceptionlab.data.datasets.file_list import SPLITS_FILE, recorded_files_found, recorded_split
from inceptionlab.data.datasets.imagefolder import RobustImageFolder
from inceptionlab.data.loading.loaders import make_loader
from inceptionlab.data.readers import WHOLE_FOLDER, read_eval_split
from inceptionlab.engine.loop import StepSettings, evaluate
from inceptionlab.engine.session import input_preparation
from inceptionlab.engine.task import make_task
from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_json, sha256_file
from inceptionlab.infer.results import LogitsRecorder, as_two_class, check_aligned, sample_files, write_results
from inceptionlab.infer.tta import TestTimeAugmented, with_tta
from inceptionlab.metrics import write_confusion
from inceptionlab.models.registry import RANDOM_WEIGHTS, imagenet_wnids, load_pretrained_model, load_run_model
from inceptionlab.models.spec import ModelSpec


class TargetMap(torch.utils.data.Dataset):
    """Relabel a dataset's folder indices to model output indices."""

    def __init__(self, dataset: RobustImageFolder, mapping: list[int]):
        self.dataset, self.mapping = dataset, mapping

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        image, target = self.dataset[index]
        return (image, self.mapping[target]) if image is not None else (image, target)


def map_folders_to_model(folders: list[str], spec: ModelSpec, root: Path) -> list[int]:
    """Model output index for each class folder, by class name, WordNet id (1000-class) or label."""
    lookups = [{name: i for i, name in enumerate(spec.class_names)}, {label: i for i, label in enumerate(spec.labels)}]
    if spec.num_classes == 1000:
        lookups.append({wnid: i for i, wnid in enumerate(imagenet_wnids())})
    mapping = []
    for folder in folders:
        index = next((lookup[folder] for lookup in lookups if folder in lookup), None)
        if index is None:
            raise UserError(
                f"{root / folder}: class folder matches none of the model's classes "
                f"(name it by class name{' or ImageNet wnid' if spec.num_classes == 1000 else ''})"
            )
        mapping.append(index)
    return mapping


@dataclass
class PerImage:
    """What the per-image results table (infer/results.py) is written from."""

    logits: Any  # float32 (N, C) numpy array, binary tasks as [0, z]
    targets: Any  # int64 (N,) numpy array
    samples: list[int]  # index of each row's sample in the split
    files: list[str]  # each row's image file ("" for in-memory splits)
    meta: dict[str, Any]  # model, data, split: where the rows came from

    @classmethod
    def collect(cls, recorder: LogitsRecorder, dataset: Any, skipped: list[str], meta: dict[str, Any]) -> "PerImage":
        logits, targets = recorder.result()
        rows = sample_files(dataset, skipped)
        check_aligned(rows, targets)
        return cls(logits, targets, rows.samples, rows.files, meta)


@dataclass
class Scores:
    """Every scored image's logits, for calibration: the per-image table's (as the model answered,
    averaged over the TTA views if any) and, with TTA, those of view 0 of the same pass (the image
    itself) to measure what TTA gained."""

    logits: Any  # float32 (N, C) numpy array, a binary model's z as [0, z]: the table's logits.npy
    targets: Any  # int64 (N,)
    tta: str = "none"
    plain_logits: Any = None  # float32 (N, C) without TTA; None when tta is none
    validation: bool = True  # scored on the split a checkpoint is chosen by: the one to fit a rule on

    @classmethod
    def collect(cls, rows: PerImage, runner: torch.nn.Module, tta: str, validation: bool) -> "Scores":
        plain = None
        if isinstance(runner, TestTimeAugmented) and runner.plain:
            plain = as_two_class(torch.cat(runner.plain)).cpu().numpy().astype("float32")
        return cls(rows.logits, rows.targets, tta, plain, validation)


@dataclass
class Evaluation:
    spec: ModelSpec
    result: dict[str, Any]
    present: list[int]  # model class indices that have samples
    per_image: PerImage | None = None
    scores: Scores | None = None
    weights: str = ""  # the file scored (a run's), or the pretrained weights' name
    weights_note: str = ""  # what that file holds, for the first line
    names_unscored: bool = True  # a run's classes are all meant to be scored; a pretrained model's are not

    def not_scored(self) -> list[str]:
        """A run's classes with no image in the scored split (their accuracy is unknown); [] for a pretrained
        model, whose 1000 classes a folder of a few of them is not meant to cover."""
        if not self.names_unscored:
            return []
        present = set(self.present)
        return [label for i, label in enumerate(self.spec.labels) if i not in present]

    def report(self) -> dict[str, Any]:
        per_class = self.result["per_class"]
        return {
            "weights": self.weights,
            "loss": self.result["loss"],
            "top1": self.result["top1"],
            **({"top5": self.result["top5"]} if "top5" in self.result else {}),
            "samples": self.result["samples"],
            "per_class": {self.spec.labels[i]: per_class[i] for i in self.present},
            "per_class_samples": {self.spec.labels[i]: int(self.result["confusion"][i].sum()) for i in self.present},
            "not_scored": self.not_scored(),
            # Files that could not be read are not in `samples`: named here with the reason.
            "skipped": [{"file": str(path), "problem": getattr(path, "problem", "")}
                        for path in sorted(set(self.result.get("skipped", [])))],
        }


def run_evaluation(model: nn.Module, spec: ModelSpec, dataset: torch.utils.data.Dataset, *, device: torch.device,
                   batch_size: int, num_workers: int | None, precision: str = "fp32",
                   recorder: LogitsRecorder | None = None) -> dict[str, Any]:
    model = model.to(device).eval()
    loader = make_loader(dataset, batch_size=batch_size, train=False, seed=0, num_workers=num_workers,
                         pin_memory=device.type == "cuda", device=device)
    settings = StepSettings(device, precision, input_preparation(spec, False, device))
    task = make_task(spec.task, spec.num_classes)
    with hardware.gpu_settings(hardware.device_facts(device), precision):  # as training's validation ran
        result = evaluate(model, loader, task, settings, on_batch=recorder)
    result["skipped"] = loader.skipped
    return result


def _tta_runner(model: nn.Module, spec: ModelSpec, tta: str | None) -> tuple[nn.Module, str]:
    """The model with test-time augmentation (`tta`, else the spec's), recording its plain logits too."""
    mode = tta or spec.tta
    if mode != "none" and spec.input_kind != "image":
        raise UserError(f"--tta {mode}: test-time augmentation transforms images; this model takes {spec.input_kind}")
    return with_tta(model, mode, record_plain=mode != "none"), mode


def evaluate_run(run_dir: Path, data: Path | None, split: str | None, *, device: torch.device, batch_size: int,
                 num_workers: int | None, weights: Path | None = None, tta: str | None = None) -> Evaluation:
    run = RunDir.open(run_dir)
    used = weights or run.weights_for_inference()
    model, spec = load_run_model(run_dir, used)
    overrides, other_data = _data_to_score(Path(run_dir), data, split)
    if spec.tokenizer:  # score with the vocabulary the model was trained with
        overrides.append(f"data.text.tokenizer={Path(run_dir) / spec.tokenizer}")
    recipe = load_recipe(Path(run_dir) / "recipe.resolved.yaml", overrides)
    if other_data:
        split = _whole_unless_split(recipe.data, split)
    transform = spec.eval_transform() if spec.input_kind == "image" else None
    dataset = read_eval_split(recipe.data, transform, split)
    folders = getattr(dataset, "classes", None) or dataset.class_names
    if folders != spec.class_names:
        mapping = map_folders_to_model(folders, spec, Path(getattr(dataset, "root", recipe.data.root or "")))
        dataset = TargetMap(dataset, mapping)  # type: ignore[assignment]
    runner, mode = _tta_runner(model, spec, tta)
    recorder = LogitsRecorder()
    result = run_evaluation(runner, spec, dataset, device=device, batch_size=batch_size, num_workers=num_workers,
                            recorder=recorder)
    present = [i for i, acc in enumerate(result["per_class"]) if acc is not None]
    # The file scored and its checksum: `compare` tells a table that no longer matches its run's weights.
    meta = {"weights_file": str(Path(used).absolute()), "weights_sha256": sha256_file(used),
            "task": spec.task, "model": str(run_dir), "run_dir": str(Path(run_dir).absolute()), "recipe": recipe.name,
            "weights": str(weights) if weights else None, "data": str(getattr(dataset, "root", recipe.data.root or "")),
            "split": split or getattr(recipe.data, "val_split", "val"), "train_split": getattr(recipe.data, "train_split", "train"),
            "tta": mode}
    rows = PerImage.collect(recorder, dataset, result["skipped"], meta)
    validation = split is None or split == recipe.data.val_split
    return Evaluation(spec, result, present, rows, Scores.collect(rows, runner, mode, validation), str(used),
                      _what_it_holds(run, used, spec, given=weights is not None))


def _data_to_score(run_dir: Path, data: Path | None, split: str | None) -> tuple[list[str], bool]:
    """--set overrides that make evaluate read what it was asked to score, and whether that is other data
    than the run's (read as it is: `_whole_unless_split`).

    Without --data: the run's own data as training read it (its recorded split, if any). With --data: the
    run's own data moved there keeps its recorded split; any other folder is read as it is: its split
    folder if it has one, else all of its class folders (a folder of new photos is a test set: splitting
    it as training does would score a fifth of it, and the run's splits.csv names files it does not hold).
    """
    recorded = recorded_split(run_dir)
    if data is None:
        return recorded, False
    other = ["data.split_file=null", "data.labels_csv=null", f"data.root={data}"]
    if split == WHOLE_FOLDER or not recorded:
        return other, True
    found, listed = recorded_files_found(run_dir / SPLITS_FILE, data)
    if found == listed:
        return [*recorded, f"data.root={data}"], False
    if found:
        raise UserError(f"{data}: {found} of the {listed} images {run_dir / SPLITS_FILE} records lie there, the rest "
                        f"do not: to score every image in {data}, give --split {WHOLE_FOLDER}; to score the run's "
                        "validation images, give --data the folder it was trained on")
    return other, True


def _whole_unless_split(cfg: Any, split: str | None) -> str | None:
    """The split to score in other data: the one asked for; for class folders of one's own (the
    imagefolder reader), the recipe's validation folder when there is one, else all of them; for the
    other readers, their default."""
    if split is not None or cfg.reader != "imagefolder":
        return split
    return cfg.val_split if (Path(cfg.root).expanduser() / cfg.val_split).is_dir() else WHOLE_FOLDER


def _what_it_holds(run: RunDir, used: Path, spec: ModelSpec, given: bool) -> str:
    """model.pt is the weights training ended with (its EMA average with EMA on), not the best epoch's:
    said, since training's last line names the best epoch."""
    if given:
        return "--weights"
    if used == run.model_file:
        held = ("the average (EMA) of the weights training ended with" if spec.weights == "ema"
                else "the weights training ended with")
        return held + _best_elsewhere(run)
    return "the best epoch's checkpoint so far (no model.pt: training has not finished)" if used == run.best \
        else "the last checkpoint (no model.pt or best.pt yet)"


def _best_elsewhere(run: RunDir) -> str:
    """' (epoch N; the best by METRIC was epoch B: --weights RUN/checkpoints/best.pt)' when training's best
    epoch was not its last and best.pt holds it; '' otherwise (or when summary.json cannot say)."""
    try:
        summary = json.loads(run.summary_file.read_text())
        best, done = int(summary["best"]["epoch"]), int(summary["epochs_done"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    if best == done or not run.best.is_file():
        return ""
    return f" (epoch {done}; the best by {summary.get('best_metric', 'its metric')} was epoch {best}: --weights {run.best})"


def evaluate_pretrained(name: str, weights: str, data: Path, *, device: torch.device, batch_size: int,
                        num_workers: int | None, tta: str | None = None) -> Evaluation:
    model, spec = load_pretrained_model(name, weights)
    root = data / "val" if (data / "val").is_dir() else data
    dataset = RobustImageFolder(root, transform=spec.eval_transform(), max_side=spec.resize_size)
    mapping = map_folders_to_model(dataset.classes, spec, root)
    runner, mode = _tta_runner(model, spec, tta)
    recorder = LogitsRecorder()
    mapped = TargetMap(dataset, mapping)
    result = run_evaluation(runner, spec, mapped, device=device, batch_size=batch_size, num_workers=num_workers,
                            recorder=recorder)
    meta = {"task": spec.task, "model": name, "run_dir": None, "recipe": None, "weights": weights, "data": str(Path(root).absolute()),
            "split": root.name, "train_split": None, "tta": mode}
    rows = PerImage.collect(recorder, mapped, result["skipped"], meta)
    return Evaluation(spec, result, sorted(set(mapping)), rows, Scores.collect(rows, runner, mode, True), weights,
                      f"{name}'s {weights} weights" if weights in ("imagenet", RANDOM_WEIGHTS) else "--weights",
                      names_unscored=False)


def save_evaluation(evaluation: Evaluation, out_dir: Path) -> dict[str, Path]:
    """eval.json, confusion.csv and plots/confusion.png (present classes only) under out_dir."""
    from inceptionlab.plots import plot_confusion  # matplotlib (~0.4 s): only when drawing

    present = evaluation.present
    confusion = evaluation.result["confusion"][present][:, present]
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "eval.json", "confusion_csv": out_dir / "confusion.csv",
             "confusion_png": out_dir / "plots" / "confusion.png"}
    atomic_write_json(paths["json"], {**evaluation.report(), "evaluated": time.strftime("%Y-%m-%dT%H:%M:%S")})
    write_confusion(paths["confusion_csv"], [evaluation.spec.labels[i] for i in present], confusion)
    plot_confusion(paths["confusion_csv"], paths["confusion_png"])
    if evaluation.per_image is not None:
        paths.update(save_per_image(evaluation, out_dir))
    return paths


def save_per_image(evaluation: Evaluation, out_dir: Path) -> dict[str, Path]:
    """results.csv, logits.npy and results.json: one row per scored image (infer/results.py)."""
    rows = evaluation.per_image
    assert rows is not None
    return write_results(out_dir, rows.logits, rows.targets, files=rows.files, samples=rows.samples,
                         labels=evaluation.spec.labels, meta={**rows.meta, "class_names": evaluation.spec.class_names})



