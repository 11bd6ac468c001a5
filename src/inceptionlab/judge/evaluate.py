"""Evaluate a trained run or a pretrained model on an image split: loss, top-1, top-5, per class.

For a pretrained ImageNet model, class folders may be named by WordNet id (n01443537, as in
tiny-imagenet and ImageNet itself) or by the model's own label; their images are scored against the
model's 1000 outputs, and per-class accuracy is reported for the classes present.

A run's evaluation is planned before any image is scored (`plan_run`: the weights, the data and split,
whether it is the run's own validation split, the only one a decision rule is fitted on), so that what
cannot apply is refused first; `score_run` then scores it. The results table records whether its rows
are held out (`held_out`: false when they hold images the model trained on).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from inceptionlab import hardware
from inceptionlab.checkpoint import RunDir
from inceptionlab.config import load_recipe
from inceptionlab.data.datasets.file_list import SPLITS_FILE, read_splits_file, recorded_files_found, recorded_split
from inceptionlab.data.datasets.imagefolder import RobustImageFolder
from inceptionlab.data.loading.loaders import make_loader
from inceptionlab.data.io.image_files import images_under
from inceptionlab.data.readers import READERS, WHOLE_FOLDER, read_eval_split
from inceptionlab.engine.features import body_digest, extract
from inceptionlab.engine.loop import StepSettings, evaluate
from inceptionlab.engine.session import input_preparation
from inceptionlab.engine.task import make_task
from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_json, sha256_file
from inceptionlab.judge.unknown import bank_features
from inceptionlab.judge.results import LogitsRecorder, as_two_class, check_aligned, sample_files, write_results
from inceptionlab.infer.tta import TestTimeAugmented, with_tta
from inceptionlab.metrics import write_confusion
from inceptionlab.models.registry import RANDOM_WEIGHTS, imagenet_wnids, load_pretrained_model, load_run_model
from inceptionlab.models.penultimate import captured, head_name, mean_over_views
from inceptionlab.models.rule import FittedOn
from inceptionlab.models.tta import views_of
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
    """What the per-image results table (judge/results.py) is written from."""

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
    validation: bool = True  # the run's own validation split (a checkpoint is chosen by it): the one to fit a rule on
    fitted_on: FittedOn | None = None  # what a rule fitted on these scores is fitted on
    features: Any = None  # float32 (N, D) penultimate features (averaged over the TTA views), when taken
    plain_features: Any = None  # view 0's, with TTA

    @classmethod
    def collect(cls, rows: PerImage, runner: torch.nn.Module, tta: str, validation: bool,
                taken: list[torch.Tensor] | None = None) -> "Scores":
        plain = None
        if isinstance(runner, TestTimeAugmented) and runner.plain:
            plain = as_two_class(torch.cat(runner.plain)).cpu().numpy().astype("float32")
        fitted_on = FittedOn(str(rows.meta["split"]), int(len(rows.targets)), rows.meta.get("data"))
        features = plain_features = None
        if taken is not None:
            views = views_of(tta)
            features = mean_over_views(taken, views).cpu().numpy()
            plain_features = torch.cat(taken[0::views]).cpu().numpy() if views > 1 and taken else None
        return cls(rows.logits, rows.targets, tta, plain, validation, fitted_on, features, plain_features)

    def without_tta(self) -> "Scores":
        """The same pass's view 0 (the image itself), as if scored without test-time augmentation."""
        return Scores(self.plain_logits, self.targets, "none", None, self.validation, self.fitted_on,
                      self.plain_features)


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
    answers: Any = None  # the decision rule's answers per row (models/rule.py Answers), once the rule is decided
    unknown: dict[str, Any] | None = None  # eval.json's unknown detection: the kNN detector, the images of no class

    def not_scored(self) -> list[str]:
        """A run's classes with no image in the scored split (their accuracy is unknown); [] for a pretrained
        model, whose 1000 classes a folder of a few of them is not meant to cover."""
        if not self.names_unscored:
            return []
        present = set(self.present)
        return [label for i, label in enumerate(self.spec.labels) if i not in present]

    def without_tta(self) -> "Evaluation":
        """The evaluation as the plain model answered in the same pass (view 0): its figures, table rows and
        logits, for a rule that did not adopt the views (the files then describe the rule saved)."""
        assert self.scores is not None and self.scores.plain_logits is not None and self.per_image is not None
        plain = self.scores.without_tta()
        figures = figures_of(plain.logits, plain.targets, self.spec)
        result = {**self.result, **figures}
        rows = dataclasses.replace(self.per_image, logits=plain.logits,
                                   meta={**self.per_image.meta, "tta": "none", "tta_measured": self.scores.tta})
        return dataclasses.replace(self, result=result, per_image=rows, scores=plain)

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


def figures_of(logits: np.ndarray, targets: np.ndarray, spec: ModelSpec) -> dict[str, Any]:
    """Loss, top-1, top-5, per-class accuracy and the confusion matrix of these logits (the [0, z] form of a
    binary model's), as the evaluation loop's meter computes them."""
    task = make_task(spec.task, spec.num_classes)
    scores, labels = torch.from_numpy(np.asarray(logits, np.float32)), torch.from_numpy(np.asarray(targets, np.int64))
    if spec.task == "binary":
        scores = scores[:, 1] - scores[:, 0]  # [0, z] back to z
    meter = task.meter("cpu", confusion=True)
    meter.update(scores, labels, task.eval_loss(scores, labels))
    return meter.compute()


def run_evaluation(model: nn.Module, spec: ModelSpec, dataset: torch.utils.data.Dataset, *, device: torch.device,
                   batch_size: int, num_workers: int | None, precision: str = "fp32",
                   recorder: LogitsRecorder | None = None, progress: bool | None = False) -> dict[str, Any]:
    """The evaluation loop over `dataset`; `progress` (None: on a terminal) shows a bar of batches on stderr."""
    model = model.to(device).eval()
    loader = make_loader(dataset, batch_size=batch_size, train=False, seed=0, num_workers=num_workers,
                         pin_memory=device.type == "cuda", device=device)
    settings = StepSettings(device, precision, input_preparation(spec, False, device))
    task = make_task(spec.task, spec.num_classes)
    shown = sys.stderr.isatty() if progress is None else progress
    batches = tqdm(loader, total=len(loader), desc="scoring", unit="batch", leave=False, dynamic_ncols=True) \
        if shown else loader
    with hardware.gpu_settings(hardware.device_facts(device), precision):  # as training's validation ran
        result = evaluate(model, batches, task, settings, on_batch=recorder)
    result["skipped"] = loader.skipped
    return result


def _tta_runner(model: nn.Module, spec: ModelSpec, tta: str | None) -> tuple[nn.Module, str]:
    """The model with test-time augmentation (`tta`, else the rule's), recording its plain logits too."""
    mode = tta or spec.rule.tta
    if mode != "none" and spec.input_kind != "image":
        raise UserError(f"--tta {mode}: test-time augmentation transforms images; this model takes {spec.input_kind}")
    return with_tta(model, mode, record_plain=mode != "none"), mode


@dataclass
class RunPlan:
    """What `evaluate RUN` will score, decided before any image is: the weights, the data and split, and
    whether that split is the run's own validation split (the only one that fits a rule)."""

    run_dir: Path
    weights: Path  # the file to score
    weights_given: bool  # --weights: not the run's model.pt
    spec: ModelSpec
    recipe: Any
    split: str | None  # as asked (None: the recipe's validation split), or other data's own
    other_data: bool  # --data of other images than the run's

    @property
    def split_name(self) -> str:
        return self.split or self.recipe.data.val_split

    @property
    def validation(self) -> bool:
        """The run's own validation split: its images never trained the model, and a checkpoint was chosen by it."""
        return not self.other_data and self.split_name == self.recipe.data.val_split

    @property
    def with_training_images(self) -> bool:
        """A split of the run's own data that holds images it trained on (its training split, or all of it)."""
        return not self.other_data and self.split_name in (self.recipe.data.train_split, WHOLE_FOLDER)

    def why_not_validation(self) -> str:
        if self.other_data:
            return "other data than the run's"
        return f"--split {self.split_name}, not the run's validation split {self.recipe.data.val_split}"


def plan_run(run_dir: Path, data: Path | None, split: str | None, weights: Path | None = None) -> RunPlan:
    """The run's weights, spec and recipe, and the data and split to score, read without scoring anything."""
    run = RunDir.open(run_dir)
    spec = ModelSpec.load(run.spec_file)
    overrides, other_data = _data_to_score(Path(run_dir), data, split)
    resolved = Path(run_dir) / "recipe.resolved.yaml"
    if other_data and READERS.get(load_recipe(resolved).data.reader, READERS["imagefolder"]).makes_its_data:
        overrides.append("data.reader=imagefolder")  # the user's own photos: read them, generate nothing there
    if spec.tokenizer:  # score with the vocabulary the model was trained with
        overrides.append(f"data.text.tokenizer={Path(run_dir) / spec.tokenizer}")
    recipe = load_recipe(resolved, overrides)
    if other_data:
        split = _whole_unless_split(recipe.data, split)
    return RunPlan(Path(run_dir), weights or run.weights_for_inference(), weights is not None, spec, recipe, split,
                   other_data)


def evaluate_run(run_dir: Path, data: Path | None, split: str | None, *, device: torch.device, batch_size: int,
                 num_workers: int | None, weights: Path | None = None, tta: str | None = None,
                 progress: bool | None = False) -> Evaluation:
    return score_run(plan_run(run_dir, data, split, weights), device=device, batch_size=batch_size,
                     num_workers=num_workers, tta=tta, progress=progress)


def score_run(plan: RunPlan, *, device: torch.device, batch_size: int, num_workers: int | None,
              tta: str | None = None, progress: bool | None = False, features: bool = False) -> Evaluation:
    """Score the planned split with the run's model (under `tta`, else its rule's); with `features`, keep
    every image's penultimate features from the same pass (models/penultimate.py) for the kNN rule."""
    run, used, recipe = RunDir.open(plan.run_dir), plan.weights, plan.recipe
    model, spec = load_run_model(plan.run_dir, used)
    transform = spec.eval_transform() if spec.input_kind == "image" else None
    dataset = read_eval_split(recipe.data, transform, plan.split)
    folders = getattr(dataset, "classes", None) or dataset.class_names
    if folders != spec.class_names:
        mapping = map_folders_to_model(folders, spec, Path(getattr(dataset, "root", recipe.data.root or "")))
        dataset = TargetMap(dataset, mapping)  # type: ignore[assignment]
    runner, mode = _tta_runner(model, spec, tta)
    recorder = LogitsRecorder()
    with _features_of(model, spec, features) as taken:
        result = run_evaluation(runner, spec, dataset, device=device, batch_size=batch_size, num_workers=num_workers,
                                recorder=recorder, progress=progress)
    present = [i for i, acc in enumerate(result["per_class"]) if acc is not None]
    # The file scored and its checksum: `compare` tells a table that no longer matches its run's weights.
    meta = {"weights_file": str(Path(used).absolute()), "weights_sha256": sha256_file(used),
            "task": spec.task, "model": str(plan.run_dir), "run_dir": str(Path(plan.run_dir).absolute()),
            "recipe": recipe.name, "weights": str(used) if plan.weights_given else None,
            "data": str(getattr(dataset, "root", recipe.data.root or "")), "split": plan.split_name,
            "train_split": getattr(recipe.data, "train_split", "train"), "tta": mode}
    rows = PerImage.collect(recorder, dataset, result["skipped"], meta)
    rows.meta["held_out"] = not plan.with_training_images and not _any_trained_on(plan, rows.files)
    return Evaluation(spec, result, present, rows, Scores.collect(rows, runner, mode, plan.validation, taken),
                      str(used), _what_it_holds(run, used, spec, given=plan.weights_given))


@contextlib.contextmanager
def _features_of(model: nn.Module, spec: ModelSpec, wanted: bool) -> Iterator[list[torch.Tensor] | None]:
    """The penultimate features the pass computes (None when not wanted)."""
    if not wanted:
        yield None
        return
    with captured(model.get_submodule(head_name(model, spec.num_classes))) as taken:
        yield taken


def training_bank(plan: RunPlan, *, device: torch.device, batch_size: int, num_workers: int | None) -> Any:
    """The kNN bank of the run's training split (its eval view, the model's penultimate features), through
    the feature cache (judge/unknown.py's `bank_features`)."""
    model, spec = load_run_model(plan.run_dir, plan.weights)
    model = model.to(device).eval()
    layer = head_name(model, spec.num_classes)
    transform = spec.eval_transform() if spec.input_kind == "image" else None
    dataset = read_eval_split(plan.recipe.data, transform, plan.recipe.data.train_split)
    parts = {"arch": spec.arch, "arch_kwargs": spec.arch_kwargs, "body": body_digest(model, layer),
             "preprocessing": [spec.resize_size, spec.crop_size, spec.interpolation, spec.mean, spec.std,
                               spec.channels], "precision": "fp32", "loader": "evaluate"}

    def extract_all() -> tuple[torch.Tensor, torch.Tensor]:
        loader = make_loader(dataset, batch_size=batch_size, train=False, seed=0, num_workers=num_workers,
                             device=device)
        return extract(model, model.get_submodule(layer), loader, input_preparation(spec, False, device), device,
                       "fp32")

    return bank_features(layer, dataset, parts, extract_all, list(spec.class_names)), layer


def _any_trained_on(plan: RunPlan, files: list[str]) -> bool:
    """Whether other data's files include any the run trained on (its recorded training split's, or those
    under its train/ folder): such a table is not held out. In-memory splits have no files to tell by."""
    if not plan.other_data or not any(files):
        return False
    trained = _training_files(plan.run_dir)
    return bool(trained) and any(Path(f).resolve() in trained for f in files if f)


def _training_files(run_dir: Path) -> set[Path]:
    """The files the run trained on, resolved, as its own data lies: its splits.csv's training rows, or the
    files of its train/ class folders; empty where the data has no files (CIFAR-10 and the other arrays)."""
    recipe = load_recipe(Path(run_dir) / "recipe.resolved.yaml", recorded_split(run_dir))
    data = recipe.data
    if data.split_file:
        return {row.file.resolve() for row in read_splits_file(Path(data.split_file), Path(data.root))
                if row.split == data.train_split}
    folder = Path(data.root or "").expanduser() / data.train_split
    if data.reader not in READERS or not folder.is_dir():
        return set()
    return {path.resolve() for path in images_under(folder)}


def _data_to_score(run_dir: Path, data: Path | None, split: str | None) -> tuple[list[str], bool]:
    """--set overrides that make evaluate read what it was asked to score, and whether that is other data
    than the run's (read as it is: `_whole_unless_split`).

    Without --data: the run's own data as training read it (its recorded split, if any). With --data: the
    run's own data moved there keeps its recorded split; any other folder is read as it is: its split
    folder if it has one, else all of its class folders (a folder of new photos is a test set: splitting
    it as training does would score a fifth of it, and the run's splits.csv names files it does not hold).
    A rule is never fitted on other data: it is scored under the run's saved rule.
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
                        num_workers: int | None, tta: str | None = None, progress: bool | None = False) -> Evaluation:
    model, spec = load_pretrained_model(name, weights)
    root = data / "val" if (data / "val").is_dir() else data
    dataset = RobustImageFolder(root, transform=spec.eval_transform(), max_side=spec.resize_size)
    mapping = map_folders_to_model(dataset.classes, spec, root)
    runner, mode = _tta_runner(model, spec, tta)
    recorder = LogitsRecorder()
    mapped = TargetMap(dataset, mapping)
    result = run_evaluation(runner, spec, mapped, device=device, batch_size=batch_size, num_workers=num_workers,
                            recorder=recorder, progress=progress)
    # held_out: a pretrained model's training images are not known here; its folder counts as held out.
    meta = {"task": spec.task, "model": name, "run_dir": None, "recipe": None, "weights": weights, "data": str(Path(root).absolute()),
            "split": root.name, "train_split": None, "tta": mode, "held_out": True}
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
    atomic_write_json(paths["json"], {**evaluation.report(), **(evaluation.unknown or {}),
                                      "evaluated": time.strftime("%Y-%m-%dT%H:%M:%S")})
    write_confusion(paths["confusion_csv"], [evaluation.spec.labels[i] for i in present], confusion)
    plot_confusion(paths["confusion_csv"], paths["confusion_png"])
    if evaluation.per_image is not None:
        paths.update(save_per_image(evaluation, out_dir))
    return paths


def save_per_image(evaluation: Evaluation, out_dir: Path) -> dict[str, Path]:
    """results.csv, logits.npy and results.json: one row per scored image (judge/results.py)."""
    rows = evaluation.per_image
    assert rows is not None
    return write_results(out_dir, rows.logits, rows.targets, files=rows.files, samples=rows.samples,
                         labels=evaluation.spec.labels, meta={**rows.meta, "class_names": evaluation.spec.class_names},
                         answers=evaluation.answers)



