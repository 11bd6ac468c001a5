"""`fit`: a recipe in, a run directory out. Sets up data, model, optimizer; runs epochs; saves.

The per-step work is in `loop.py`; this module owns what happens between epochs: evaluation,
metrics rows, checkpoints (atomic, every epoch), best-model tracking, early stopping, resume,
Ctrl-C and NaN handling, and rank-0-only side effects under torchrun.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from inceptionlab.checkpoint import (
    CHECKPOINT_VERSION,
    RunDir,
    atomic_torch_save,
    atomic_write_json,
    atomic_write_text,
    load_checkpoint,
    restore_rng_state,
    rng_state,
)
from inceptionlab.config import Recipe, recipe_to_dict, recipe_to_yaml
from inceptionlab.data.device_aug import pass_normalised
from inceptionlab.data.image_loader import ResidentImageOptions
from inceptionlab.data.loaders import SkipTrackingLoader, cap_samples, make_loader
from inceptionlab.data.readers import read_splits
from inceptionlab.engine.distributed import DistInfo, any_rank, init_distributed
from inceptionlab.engine.loop import EpochResult, NonFiniteLoss, StepSettings, evaluate, train_one_epoch
from inceptionlab.engine.optim import build_optimizer, build_scheduler
from inceptionlab.engine.task import make_task
from inceptionlab.errors import UserError
from inceptionlab.models.registry import build_model
from inceptionlab.models.spec import ModelSpec


class StopSignal:
    """Set by Ctrl-C (or a test); the loop finishes its step, a checkpoint is saved, the run exits."""

    def __init__(self) -> None:
        self.requested = False

    def request(self) -> None:
        self.requested = True


@contextmanager
def ctrl_c_requests_stop(stop: StopSignal, say: Callable[[str], None]) -> Iterator[None]:
    """First Ctrl-C: stop cleanly after the current step. Second: abort at once."""

    def handler(signum: int, frame: Any) -> None:
        if stop.requested:
            raise KeyboardInterrupt
        stop.request()
        say("stopping after this step and saving a checkpoint (Ctrl-C again to abort)")

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def resolve_device(name: str, dist: DistInfo | None = None) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {name!r} asked for but no GPU is visible to PyTorch; run `inceptionlab doctor`")
    if name == "cuda" and dist is not None and dist.enabled:
        return torch.device("cuda", dist.local_rank)
    return torch.device(name)


def seed_everything(seed: int, deterministic: bool) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    elif torch.cuda.is_available():
        torch.backends.cudnn.benchmark = True  # fixed input sizes: let cuDNN/MIOpen pick kernels


def environment(device: torch.device, dist: DistInfo) -> dict[str, Any]:
    import torchvision

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "world_size": dist.world_size,
        "host": platform.node(),
        "argv": sys.argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    return env


@dataclass
class Outcome:
    run_dir: Path
    status: str  # completed | early_stopped | interrupted
    summary: dict[str, Any]


@dataclass
class BestTracker:
    metric: str
    value: float | None = None
    epoch: int | None = None
    stale_epochs: int = 0
    min_delta: float = 0.0

    @property
    def minimise(self) -> bool:
        return self.metric.endswith("loss")

    def update(self, value: float, epoch: int) -> bool:
        """Record the epoch's value; True when it is the best so far."""
        better = self.value is None or (
            value < self.value - self.min_delta if self.minimise else value > self.value + self.min_delta
        )
        if better:
            self.value, self.epoch, self.stale_epochs = value, epoch, 0
        else:
            self.stale_epochs += 1
        return better

    def state(self) -> dict[str, Any]:
        return {"value": self.value, "epoch": self.epoch, "stale_epochs": self.stale_epochs}

    def load(self, state: dict[str, Any]) -> None:
        self.value, self.epoch, self.stale_epochs = state["value"], state["epoch"], state["stale_epochs"]


@dataclass
class Session:
    """Everything a run needs, built once from the recipe."""

    recipe: Recipe
    dist: DistInfo
    device: torch.device
    spec: ModelSpec
    model: nn.Module  # the plain module (its state_dict is what we save)
    runner: nn.Module  # what we call: maybe DDP- and/or compile-wrapped
    task: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    train_loader: SkipTrackingLoader
    val_loader: SkipTrackingLoader
    settings: StepSettings
    notes: list[str] = field(default_factory=list)
    splits: Any = None
    test_loader: Any = None


def _build_data(recipe: Recipe, dist: DistInfo, device: torch.device) -> tuple[Any, SkipTrackingLoader, SkipTrackingLoader]:
    cfg = recipe.data
    splits = read_splits(cfg)
    train_set = cap_samples(splits.train, cfg.max_train_samples, recipe.train.seed)
    val_set = cap_samples(splits.val, cfg.max_val_samples, recipe.train.seed)
    if len(train_set) == 0 or len(val_set) == 0:
        raise UserError(f"{cfg.root}: the train or val split is empty")
    common = dict(seed=recipe.train.seed, num_workers=cfg.num_workers, rank=dist.rank, world_size=dist.world_size,
                  pin_memory=device.type == "cuda", device=device, mode=cfg.loader,
                  images=ResidentImageOptions.from_recipe(recipe))
    train_loader = make_loader(train_set, batch_size=recipe.train.batch_size, train=True, **common)
    val_loader = make_loader(val_set, batch_size=_eval_batch(recipe), train=False, **common)
    return splits, train_loader, val_loader


def _eval_batch(recipe: Recipe) -> int:
    # No activations are kept for backward in evaluation: twice the training batch fits.
    return recipe.train.eval_batch_size or 2 * recipe.train.batch_size


def _make_spec(recipe: Recipe, splits: Any, num_classes: int, arch_kwargs: dict[str, Any]) -> ModelSpec:
    cfg = recipe.data
    inputs = getattr(splits.train, "inputs", None)
    tokens = inputs is not None and not inputs.dtype.is_floating_point and inputs.dtype != torch.uint8
    return ModelSpec(
        arch=recipe.model.name,
        num_classes=num_classes,
        class_names=list(splits.class_names),
        class_labels=splits.class_labels,
        task=recipe.task,
        crop_size=cfg.val_crop_size,
        resize_size=cfg.val_resize_size,
        interpolation=cfg.interpolation,
        mean=list(cfg.mean),
        std=list(cfg.std),
        arch_kwargs=arch_kwargs,
        input_kind="tokens" if tokens else "image",
        channels=int(inputs.shape[1]) if inputs is not None and not tokens else 3,
        tokenizer="tokenizer.json" if "tokenizer.json" in splits.artifacts else None,
    )


def build_session(recipe: Recipe) -> Session:
    device_type = "cuda" if recipe.train.device.startswith("cuda") or (
        recipe.train.device == "auto" and torch.cuda.is_available()) else "cpu"
    dist = init_distributed(device_type)
    device = resolve_device(recipe.train.device, dist)
    seed_everything(recipe.train.seed + dist.rank, recipe.train.deterministic)
    splits, train_loader, val_loader = _build_data(recipe, dist, device)
    num_classes = len(splits.class_names)
    if recipe.model.num_classes not in (None, num_classes):
        raise UserError(
            f"model.num_classes={recipe.model.num_classes} but {recipe.data.root} has {num_classes} classes; "
            "set model.num_classes=null to follow the data"
        )
    built = build_model(recipe.model.name, num_classes, recipe.model.weights, recipe.model.aux_loss_weight,
                        **{**recipe.model.kwargs, **splits.model_kwargs})
    memory_format = torch.channels_last if recipe.train.channels_last else torch.contiguous_format
    model = built.model.to(device=device, memory_format=memory_format)
    runner: nn.Module = model
    if dist.enabled:
        runner = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if recipe.train.compile:
        runner = torch.compile(runner)
    optimizer = build_optimizer(model.parameters(), recipe.optim)
    scheduler = build_scheduler(optimizer, recipe.schedule, recipe.train.epochs)
    scaler = torch.amp.GradScaler(device.type, enabled=recipe.train.precision == "fp16")
    spec = _make_spec(recipe, splits, num_classes, built.arch_kwargs)
    prepare = input_preparation(spec, recipe.train.channels_last, device)
    if any(getattr(loader, "yields_normalised", False) for loader in (train_loader, val_loader)):
        prepare = pass_normalised(prepare)  # resident image batches arrive normalised; uint8 ones still get it
    settings = StepSettings(device, recipe.train.precision, prepare, recipe.train.grad_clip_norm, recipe.train.log_every)
    task = make_task(recipe.task, num_classes, recipe.train.label_smoothing, recipe.model.aux_loss_weight)
    notes = list(splits.notes)
    notes.append(f"weights: {built.pretrained or 'random init (training from scratch)'}")
    test_loader = None
    if splits.test is not None:
        test_loader = make_loader(splits.test, batch_size=_eval_batch(recipe), train=False, seed=recipe.train.seed,
                                  num_workers=recipe.data.num_workers, rank=dist.rank, world_size=dist.world_size,
                                  device=device, mode=recipe.data.loader)
    return Session(recipe, dist, device, spec, model, runner, task, optimizer, scheduler, scaler,
                   train_loader, val_loader, settings, notes, splits, test_loader)


def _identity(inputs: torch.Tensor) -> torch.Tensor:
    return inputs


def input_preparation(spec: ModelSpec, channels_last: bool, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """uint8 images -> normalised floats on the device; token ids pass through."""
    if spec.input_kind != "image":
        return _identity
    from inceptionlab.data.transforms import Normalize

    return Normalize(spec.mean, spec.std, channels_last=channels_last).to(device)


def _checkpoint(s: Session, epoch: int, step: int, best: BestTracker, best_summary: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "version": CHECKPOINT_VERSION,
        "model": s.model.state_dict(),
        "optimizer": s.optimizer.state_dict(),
        "scheduler": s.scheduler.state_dict(),
        "scaler": s.scaler.state_dict(),
        "epoch": epoch,  # epochs fully done
        "step_in_epoch": step,  # steps done in epoch `epoch` (0 at an epoch boundary)
        "rng": rng_state(),
        "best": best.state(),
        "best_summary": json.dumps(best_summary) if best_summary else None,
        "class_names": s.spec.class_names,
        "recipe": json.dumps(recipe_to_dict(s.recipe)),
        "spec": json.dumps(s.spec.to_dict()),
    }


def _restore(s: Session, ckpt: dict[str, Any], best: BestTracker) -> tuple[int, int, dict[str, Any] | None]:
    if ckpt["class_names"] != s.spec.class_names:
        raise UserError("the checkpoint's classes differ from the dataset's: resume with the same --data")
    s.model.load_state_dict(ckpt["model"])
    s.optimizer.load_state_dict(ckpt["optimizer"])
    s.scheduler.load_state_dict(ckpt["scheduler"])
    s.scaler.load_state_dict(ckpt["scaler"])
    restore_rng_state(ckpt["rng"])
    best.load(ckpt["best"])
    best_summary = json.loads(ckpt["best_summary"]) if ckpt.get("best_summary") else None
    return int(ckpt["epoch"]), int(ckpt["step_in_epoch"]), best_summary


def _class_accuracy(spec: ModelSpec, per_class: list[float | None]) -> dict[str, float | None]:
    return {label: acc for label, acc in zip(spec.labels, per_class)}


def _epoch_row(epoch: int, s: Session, result: EpochResult, val: dict[str, Any], lr: float) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "train_loss": result.metrics["loss"],
        "train_top1": result.metrics["top1"],
        "val_loss": val["loss"],
        "val_top1": val["top1"],
        **({"val_top5": val["top5"]} if "top5" in val else {}),
        "lr": lr,
        "images_per_s": result.samples * s.dist.world_size / max(result.seconds, 1e-9),
        "epoch_seconds": result.seconds,
        "val_seconds": val["seconds"],
        "samples": result.samples * s.dist.world_size,  # padded shards repeat a few train samples
        "val_samples": val["samples"],  # unpadded shards: every val image exactly once
    }


def _eval_summary(epoch: int, s: Session, val: dict[str, Any]) -> dict[str, Any]:
    summary = {"epoch": epoch, "loss": val["loss"], "top1": val["top1"], "top5": val.get("top5"),
               "per_class": _class_accuracy(s.spec, val["per_class"])}
    return {k: v for k, v in summary.items() if v is not None}


class Reporter:
    """Progress on a terminal (tqdm), plain lines otherwise; rank 0 only."""

    def __init__(self, enabled: bool, progress: bool | None):
        self.enabled = enabled
        self.bar_enabled = enabled and (sys.stderr.isatty() if progress is None else progress)
        self.bar: Any = None

    def say(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def wrap(self, loader: Any, epoch: int, epochs: int, first_step: int) -> Any:
        if not self.bar_enabled:
            return loader
        from tqdm import tqdm

        self.bar = tqdm(loader, total=len(loader) + first_step, initial=first_step,
                        desc=f"epoch {epoch}/{epochs}", unit="step", dynamic_ncols=True, leave=False)
        return self.bar

    def on_log(self, epoch: int, epochs: int, steps: int) -> Callable[[int, float], None]:
        def log(step: int, loss: float) -> None:
            if self.bar is not None:
                self.bar.set_postfix(loss=f"{loss:.4f}")
            else:
                self.say(f"epoch {epoch}/{epochs} step {step}/{steps} loss {loss:.4f}")

        return log

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _write_run_files(run: RunDir, s: Session) -> None:
    atomic_write_text(run.path / "recipe.resolved.yaml", recipe_to_yaml(s.recipe))
    atomic_write_json(run.path / "env.json", environment(s.device, s.dist))
    s.spec.save(run.spec_file)
    for name, save in s.splits.artifacts.items():  # e.g. the text vectorizer's tokenizer.json
        save(run.path / name)
    if s.spec.input_kind == "image" and not (run.plots / "samples.png").exists():
        # Drawing a batch runs the random augmentations: keep the RNG stream training will use untouched.
        with torch.random.fork_rng(devices=[]):
            _plot_first_batch(run, s)


def _plot_first_batch(run: RunDir, s: Session) -> None:
    """plots/samples.png: what the model is fed (after augmentation), with labels."""
    from inceptionlab.plots import plot_samples

    s.train_loader.set_epoch(0)
    images, targets = next(iter(s.train_loader))
    labels = [s.spec.labels[int(t)] for t in targets[:32]]
    plot_samples(images[:32].cpu(), labels, run.plots / "samples.png")


def fit(
    recipe: Recipe,
    out: Path = Path("runs"),
    resume: Path | None = None,
    *,
    progress: bool | None = None,
    stop: StopSignal | None = None,
    on_log: Callable[[int, float], None] | None = None,
) -> Outcome:
    """Train `recipe`; returns where the run is and how it ended. Raises UserError on bad input."""
    s = build_session(recipe)
    main = s.dist.is_main
    report = Reporter(main, progress)
    stop = stop or StopSignal()
    best = BestTracker(recipe.train.best_metric, min_delta=recipe.train.early_stop_min_delta)
    start_epoch, start_step, best_summary = 0, 0, None
    if resume is not None:
        run = RunDir.open(resume)
        start_epoch, start_step, best_summary = _restore(s, load_checkpoint(run.last), best)
        if main:
            run.truncate_metrics(start_epoch)
        report.say(f"resuming {run.path} at epoch {start_epoch + 1}, step {start_step}")
    else:
        run = RunDir.create(out, recipe.name) if main else RunDir(Path(out))
    if main:
        _write_run_files(run, s)
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(run.tensorboard))
    for note in s.notes:
        report.say(note)
    report.say(f"run directory: {run.path}")

    epochs = recipe.train.epochs
    status = "completed"
    last_summary: dict[str, Any] | None = None
    wall_start = time.perf_counter()
    should_stop = lambda: any_rank(stop.requested, s.dist, s.device)  # noqa: E731
    with ctrl_c_requests_stop(stop, report.say):
        for epoch in range(start_epoch, epochs):
            first_step = start_step if epoch == start_epoch else 0
            s.train_loader.set_epoch(epoch, start=first_step * recipe.train.batch_size)
            steps_in_epoch = first_step + len(s.train_loader)
            loader = report.wrap(s.train_loader, epoch + 1, epochs, first_step)
            lr = s.optimizer.param_groups[0]["lr"]  # the rate this epoch trains with
            log = _chain(report.on_log(epoch + 1, epochs, steps_in_epoch), on_log)
            try:
                result = train_one_epoch(s.runner, loader, s.task, s.optimizer, s.scaler, s.settings,
                                         first_step=first_step, on_log=log, should_stop=should_stop)
            except NonFiniteLoss as exc:
                report.close_bar()
                raise UserError(
                    f"training diverged in epoch {epoch + 1}: {exc}; kept the last good checkpoint in "
                    f"{run.checkpoints}; try a lower optim.lr, train.precision=fp32 or train.grad_clip_norm=1.0",
                    exit_code=3,
                ) from None
            report.close_bar()
            done_steps = first_step + result.steps
            if result.stopped and done_steps < steps_in_epoch:
                if main:
                    atomic_torch_save(_checkpoint(s, epoch, done_steps, best, best_summary), run.last)
                report.say(f"stopped at epoch {epoch + 1} step {done_steps}; resume with: "
                           f"inceptionlab train --resume {run.path}")
                status = "interrupted"
                break
            s.scheduler.step()
            val = evaluate(s.runner, s.val_loader, s.task, s.settings)
            row = _epoch_row(epoch + 1, s, result, val, lr)
            last_summary = _eval_summary(epoch + 1, s, val)
            metric = row.get(recipe.train.best_metric)
            if metric is None:
                raise UserError(f"train.best_metric={recipe.train.best_metric!r} is not one of {', '.join(row)}")
            improved = best.update(float(metric), epoch + 1)
            if improved:
                best_summary = last_summary
            if main:
                _save_epoch(run, s, row, val, writer, epoch + 1, best, best_summary, improved)
                report.say(_epoch_line(row, epochs, s.train_loader.skipped))
            start_step = 0
            if result.stopped:
                status = "interrupted"
                report.say(f"stopped after epoch {epoch + 1}; resume with: inceptionlab train --resume {run.path}")
                break
            if recipe.train.early_stop_patience and best.stale_epochs >= recipe.train.early_stop_patience:
                status = "early_stopped"
                report.say(f"early stop: {best.metric} has not improved for {best.stale_epochs} epochs")
                break
    summary: dict[str, Any] = {}
    if main:
        summary = _finish(run, s, status, best, best_summary, last_summary, time.perf_counter() - wall_start)
        writer.close()
    return Outcome(run.path, status, summary)


def _chain(*callbacks: Callable[[int, float], None] | None) -> Callable[[int, float], None]:
    def call(step: int, loss: float) -> None:
        for callback in callbacks:
            if callback is not None:
                callback(step, loss)

    return call


def _epoch_line(row: dict[str, Any], epochs: int, skipped: list[str]) -> str:
    line = (
        f"epoch {row['epoch']}/{epochs}  train_loss {row['train_loss']:.4f}  val_loss {row['val_loss']:.4f}  "
        f"val_top1 {row['val_top1']:.4f}  " + (f"val_top5 {row['val_top5']:.4f}  " if "val_top5" in row else "") +
        f"lr {row['lr']:.3g}  "
        f"{row['images_per_s']:.1f} img/s  {row['epoch_seconds']:.1f}s"
    )
    if skipped:
        line += f"  (skipped {len(set(skipped))} unreadable image(s), e.g. {skipped[0]})"
    return line


def _save_epoch(run: RunDir, s: Session, row: dict[str, Any], val: dict[str, Any], writer: Any, epoch: int,
                best: BestTracker, best_summary: dict[str, Any] | None, improved: bool) -> None:
    run.append_metrics(row)
    for key, value in row.items():
        if key != "epoch":
            writer.add_scalar(key.replace("_", "/", 1), value, epoch)
    writer.flush()
    ckpt = _checkpoint(s, epoch, 0, best, best_summary)
    atomic_torch_save(ckpt, run.last)
    if improved:
        atomic_torch_save(ckpt, run.best)
    write_confusion(run.path / "confusion.csv", s.spec, val["confusion"])


def write_confusion(path: Path, spec: ModelSpec, confusion: torch.Tensor) -> None:
    """Rows are true classes, columns predicted classes (counts)."""
    import csv
    import io

    buffer = io.StringIO()
    out = csv.writer(buffer)
    out.writerow(["true\\predicted", *spec.labels])
    for label, row in zip(spec.labels, confusion.tolist()):
        out.writerow([label, *row])
    atomic_write_text(path, buffer.getvalue())


def _finish(run: RunDir, s: Session, status: str, best: BestTracker, best_summary: dict[str, Any] | None,
            last_summary: dict[str, Any] | None, seconds: float) -> dict[str, Any]:
    from inceptionlab.plots import plot_run

    test = None
    if status != "interrupted":
        # The guide's `torch.save(model.state_dict(), ...)`: the final weights, loadable anywhere.
        atomic_torch_save(s.model.state_dict(), run.model_file)
        if s.test_loader is not None:
            test = _eval_summary(0, s, evaluate(s.runner, s.test_loader, s.task, s.settings))
            test.pop("epoch")
        if s.spec.input_kind == "image" and s.spec.num_classes <= 20:
            _plot_predictions(run, s)
        if s.spec.input_kind == "tokens":
            from inceptionlab.infer.text import export_text_model

            export_text_model(run.path, s.model, s.spec)
    summary = {
        "status": status,
        "recipe": s.recipe.name,
        "run_dir": str(run.path),
        "best_metric": best.metric,
        "best": best_summary,
        "last": last_summary,
        "epochs_done": last_summary["epoch"] if last_summary else None,
        "wall_seconds": seconds,
        "skipped_files": sorted(set(s.train_loader.skipped + s.val_loader.skipped)),
        **({"test": test} if test else {}),
    }
    atomic_write_json(run.summary_file, summary)
    plot_run(run.path)
    return summary


def _spread_samples(dataset: Any, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` (image, label) pairs evenly spaced through a split: splits are often sorted by class."""
    picks = torch.linspace(0, len(dataset) - 1, min(count, len(dataset))).long().unique().tolist()
    if hasattr(dataset, "inputs"):  # an in-memory ArraySplit
        return dataset.inputs[picks], dataset.targets[picks]
    items = [dataset[i] for i in picks]
    items = [(torch.as_tensor(x), y) for x, y in items if x is not None]
    return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


@torch.inference_mode()
def _plot_predictions(run: RunDir, s: Session) -> None:
    """plots/predictions.png: validation images with predicted label, confidence and truth, plus bars."""
    from inceptionlab.plots import plot_predictions

    images, targets = _spread_samples(s.splits.val, 15)
    s.model.eval()
    with s.settings.autocast():
        logits = s.model(s.settings.prepare(images.to(s.device)))
    probs = s.task.probabilities(logits).cpu()
    plot_predictions(images.cpu(), probs, targets.cpu(), s.spec.labels, run.plots / "predictions.png")
