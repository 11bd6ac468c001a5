"""A session: everything one training run needs, assembled once from a recipe.

Data (readers -> loaders, which choose the data path), the model (registry), its spec, the task
(loss and metrics), optimizer, schedule and scaler, on the device `runtime.resolve_device` picks.
`SessionBuilder` assembles it step by step and hands over a finished `TrainingSession`; the lines it
prints are worded in `engine/notes.py`. `fit` then only runs epochs; nothing here writes files.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
import torch.distributed
from torch import nn

from inceptionlab import hardware
from inceptionlab.config import Recipe
from inceptionlab.data.loading.image_options import DeviceImageOptions
from inceptionlab.data.loading.loaders import Loader, cap_samples, device_bytes, make_loader
from inceptionlab.data.loading.sampler import class_counts, draw_weights, inverse_frequency, split_targets
from inceptionlab.data.readers import READERS, read_splits
from inceptionlab.data.transforms.device import pass_normalised
from inceptionlab.engine import batchnorm
from inceptionlab.engine.batch_size import resolve_batch_sizes
from inceptionlab.engine.choices import check_recipe
from inceptionlab.engine.distributed import DistInfo, broadcast_state, init_distributed, normaliser_over_ranks
from inceptionlab.engine.ema import ModelEma
from inceptionlab.engine.loop import StepSettings
from inceptionlab.engine.notes import (RANDOM_INIT, cache_size_notes, few_probe_steps_notes, from_scratch_recipe,
                                      from_scratch_warning, imbalance_notes, optimizer_notes,
                                      random_body_freeze_skipped, random_body_probe_refused, speed_warnings)
from inceptionlab.engine.optim import build_optimizer, build_scheduler
from inceptionlab.engine.speed import RunShape, resolve_speed_settings
from inceptionlab.engine.task import make_task
from inceptionlab.errors import UserError
from inceptionlab.models.parts import ModelParts, model_parts
from inceptionlab.models.registry import build_model, resolve_data_config, starting_weights
from inceptionlab.models.spec import ModelSpec
from inceptionlab.runtime import resolve_device, seed_everything


@dataclass
class TrainingSession:
    """Everything a run needs, finished: built once from the recipe by `SessionBuilder`."""

    recipe: Recipe  # as resolved: preprocessing from the weights, `auto` sizes found
    dist: DistInfo
    device: torch.device
    spec: ModelSpec
    model: nn.Module  # the plain module (its state_dict is what we save); each stage wraps it (engine/finetune.py)
    task: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    train_loader: Loader
    val_loader: Loader
    settings: StepSettings
    notes: list[str]
    splits: Any
    test_loader: Loader | None
    speed: hardware.Decision | None  # what `auto` chose for precision, memory format and compile
    threads: hardware.ThreadGovernor | None
    # The notes saying where a new run's weights come from (among `notes`): a resumed run's come from its
    # checkpoint, and it says so instead.
    weights_notes: list[str]
    parts: ModelParts  # head, auxiliary heads, body (models/parts.py)
    ema: ModelEma | None  # the weights' average, when ema.decay is set
    train_set: Any  # the (capped) splits the loaders serve, for the frozen-body features
    val_set: Any
    val_set_transform: Any  # the eval view of an image (the spec's), for those features
    image_options: DeviceImageOptions | None
    sample_weights: torch.Tensor | None  # data.sampler=balanced: per training sample
    steps_per_epoch: int  # the schedule's unit: the image loader's steps in a whole epoch
    pretrained: str | None  # what the starting weights are (imagenet, a file, a run), None: random init
    weights_record: dict[str, Any] | None = None  # where the starting weights came from, every decision (weights.json)

    def resumable_parts(self) -> dict[str, Any]:
        """What a checkpoint saves and restores (see checkpoint.training_checkpoint)."""
        parts = {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler, "scaler": self.scaler}
        return parts | ({"ema": self.ema} if self.ema is not None else {})

    def inference_model(self) -> nn.Module:
        """The weights the run keeps (model.pt, exports): the average when EMA is on, else the trained ones."""
        return self.ema.module if self.ema is not None else self.model

    def wrap(self, model: nn.Module) -> nn.Module:
        """What the loop calls for `model` (its parameters that require gradients as they are now)."""
        return wrap_model(model, self.recipe, self.dist, self.device)

    def after_step(self) -> None:
        """After every optimizer step: the per-step schedule, then the weights' average."""
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.model)

    @property
    def skipped_files(self) -> list[str]:
        """Every file skipped so far, sorted, once each (UnreadableFile: the path, with its reason)."""
        return list({str(path): path for path in sorted(self.train_loader.skipped + self.val_loader.skipped)}.values())


def build_training_session(recipe: Recipe, *, fresh_speed: bool = False) -> TrainingSession:
    """Everything a run needs (see SessionBuilder for the order and why)."""
    return SessionBuilder(recipe, fresh_speed=fresh_speed).build()


class SessionBuilder:
    """Assembles a TrainingSession, one step per method, each step using what the steps before it set.

    The order is forced by what each part needs: the process group and device before anything is
    placed; the data before the model (its classes size the head); the model and task before `auto`
    speed settings and batch sizes (decided by timing and probing that model); those before the loaders
    (whose batch, augmentation dtype and layout follow them); the loaders before the schedule (its
    steps per epoch). The recipe the builder holds is updated as each `auto` is resolved, and the
    finished session carries the resolved one (recipe.resolved.yaml)."""

    def __init__(self, recipe: Recipe, *, fresh_speed: bool = False):
        # Preprocessing fields a recipe leaves empty come from the model's weights (timm's resolve_data_config):
        # what a run or a sidecar records with them, else the architecture's defaults.
        self.weights = starting_weights(recipe.model.name, recipe.model.weights)
        self.recipe = replace(recipe, data=resolve_data_config(recipe.data, recipe.model.name, self.weights))
        self.fresh_speed = fresh_speed
        self.size_notes: list[str] = []

    def build(self) -> TrainingSession:
        check_recipe(self.recipe, self.recipe.name)  # every combination, before any data is read
        self._start_process()
        self._read_data()
        self._build_model_and_task()
        self._fine_tuning_policy()
        self._resolve_sizes()
        self._build_loaders()
        self._build_optimisation()
        return self._finish()

    def _start_process(self) -> None:
        """The process group, this rank's device, its CPU threads and its seed."""
        train = self.recipe.train
        self.dist = init_distributed(_device_type(train.device))
        self.device = resolve_device(train.device, self.dist.local_rank if self.dist.enabled else None)
        self.threads = start_threads(train.threads, self.dist, self.device, train.deterministic)
        seed_everything(train.seed + self.dist.rank, train.deterministic)

    def _read_data(self) -> None:
        self.splits, self.train_set, self.val_set = _read_data(self.recipe)
        self.num_classes = _num_classes(self.recipe, self.splits)
        self.targets = split_targets(self.train_set)

    def _build_model_and_task(self) -> None:
        recipe = self.recipe
        normalisation = (recipe.data.mean, recipe.data.std) if recipe.data.mean is not None else None
        self.built = build_model(recipe.model.name, self.num_classes, self.weights, recipe.model.aux_loss_weight,
                                 list(self.splits.class_names), normalisation=normalisation,
                                 **{**recipe.model.kwargs, **self.splits.model_kwargs})
        self.task = make_task(recipe.task, self.num_classes, recipe.train.label_smoothing, recipe.model.aux_loss_weight,
                              _class_weights(recipe, self.targets, self.num_classes, self.device))

    def _fine_tuning_policy(self) -> None:
        """What fine-tuning does given where the weights come from. A random body is never frozen: the
        head-only epochs are skipped (a linear probe of one is refused); trained weights given to a recipe
        written for training from scratch are warned about by name (fit validates them as epoch 0)."""
        recipe, self.policy_notes = self.recipe, []
        bn = batchnorm.resolve_auto(recipe.finetune.bn, self.built.pretrained is not None)
        recipe = self.recipe = replace(recipe, finetune=replace(recipe.finetune, bn=bn))  # recipe.resolved.yaml
        freeze = recipe.finetune.freeze_epochs
        probe = freeze >= recipe.train.epochs or recipe.finetune.body_lr_mult == 0  # the body never trains
        if self.built.pretrained is None and probe:
            raise UserError(random_body_probe_refused(recipe))
        if self.built.pretrained is None and freeze:
            self.policy_notes.append(random_body_freeze_skipped(recipe))
            self.recipe = replace(recipe, finetune=replace(recipe.finetune, freeze_epochs=0))
        elif self.built.pretrained is not None and from_scratch_recipe(recipe):
            self.policy_notes.append(from_scratch_warning(recipe))

    def _resolve_sizes(self) -> None:
        """`auto` speed settings, then `auto` batch sizes, then the batch fitted to the split."""
        recipe, dist = self.recipe, self.dist
        shape = _run_shape(recipe, self.splits, self.num_classes, len(self.train_set), dist)
        recipe, self.speed = resolve_speed_settings(recipe, self.built.model, self.task, self.device, shape,
                                                    broadcast=_broadcaster(dist), fresh=self.fresh_speed,
                                                    is_main=dist.is_main)
        recipe, found = resolve_batch_sizes(recipe, self.built.model, self.task, self.device, shape,
                                            broadcast=_broadcaster_of(dist),
                                            reserved=lambda: self._kept_on_device(recipe))
        self.recipe, fitted = fit_batch_to_split(recipe, len(self.train_set), dist.world_size)  # after `auto` is found
        self.size_notes = [*found, *fitted]

    def _kept_on_device(self, recipe: Recipe) -> dict[str, int]:
        """Bytes the run will keep on its GPU beside a training step, placed after `auto` batch sizes are
        probed: the loaders' resident data, the weights' average, DistributedDataParallel's gradient buckets
        (one per trainable parameter's gradient). The probe's step holds the weights, gradients, optimizer
        state and activations itself."""
        model, options = self.built.model, _device_image_options(recipe)
        data = sum(device_bytes(split, device=self.device, mode=recipe.data.loader, images=options,
                                local_world_size=self.dist.local_world_size)
                   for split in (self.train_set, self.val_set, self.splits.test) if split is not None)
        weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        gradients = sum(p.numel() * p.element_size() for p in model.parameters())
        return {"the resident data": data, "the weights' average (EMA)": weights if recipe.ema.enabled else 0,
                "DDP's gradient buckets": gradients if self.dist.enabled else 0}

    def _build_loaders(self) -> None:
        self.sample_weights = draw_weights(self.recipe.data.sampler, self.targets, self.num_classes,
                                           self.recipe.data.balance_power)
        self.train_loader, self.val_loader, self.test_loader = _build_loaders(
            self.recipe, self.splits, self.train_set, self.val_set, self.dist, self.device, self.sample_weights)

    def _build_optimisation(self) -> None:
        """The model on the device (rank 0's weights on every rank), its parts, optimizer, schedule, scaler, EMA."""
        recipe, dist = self.recipe, self.dist
        self.model = place_model(self.built.model, recipe, self.device)
        broadcast_state(self.model, dist)  # every rank starts from rank 0's weights, whatever the first stage wraps
        self.parts = model_parts(self.model, self.num_classes)
        self.optimizer = build_optimizer(self.model, recipe.optim, parts=self.parts, finetune=recipe.finetune)
        self.steps_per_epoch = len(self.train_loader)  # before any set_epoch(start=...) shortens it
        self.scheduler = build_scheduler(self.optimizer, recipe.schedule, recipe.train.epochs,
                                         steps_per_epoch=self.steps_per_epoch,
                                         freeze_epochs=recipe.finetune.freeze_epochs, lr=recipe.optim.lr)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=recipe.train.precision == "fp16")
        self.ema = ModelEma(self.model, recipe.ema) if recipe.ema.enabled else None

    def _step_settings(self, spec: ModelSpec) -> StepSettings:
        recipe = self.recipe
        prepare = input_preparation(spec, recipe.train.channels_last, self.device)
        if any(loader.yields_normalised for loader in (self.train_loader, self.val_loader)):
            prepare = pass_normalised(prepare)  # resident image batches arrive normalised; uint8 ones still get it
        return StepSettings(self.device, recipe.train.precision, prepare, recipe.train.grad_clip_norm,
                            recipe.train.log_every, mix=_batch_mix(recipe, spec, self.num_classes, self.dist),
                            micro_batch=_micro_batch(recipe),
                            normaliser_over_ranks=normaliser_over_ranks(self.task, self.dist))

    def _notes(self, weights_notes: list[str]) -> list[str]:
        recipe = self.recipe
        return [*self.splits.notes, *weights_notes,
                f"parameters: {self.parts.describe()}", *optimizer_notes(recipe, self.optimizer), *self.size_notes,
                *(cache_size_notes(recipe.data) if recipe.data.reader in READERS else []),
                *imbalance_notes(recipe, self.task, self.targets, self.num_classes),
                *few_probe_steps_notes(recipe, self.steps_per_epoch),
                self.speed.line("speed settings"), *speed_warnings(recipe, self.device), self.threads.describe()]

    def _finish(self) -> TrainingSession:
        spec = _make_spec(self.recipe, self.splits, self.num_classes, self.built.arch_kwargs)
        settings = self._step_settings(spec)
        weights_notes = [*(self.built.report or [RANDOM_INIT]), *self.policy_notes]
        val_set_transform = getattr(self.val_set, "transform", None) or getattr(
            getattr(self.val_set, "dataset", None), "transform", None)
        return TrainingSession(
            recipe=self.recipe, dist=self.dist, device=self.device, spec=spec, model=self.model,
            task=self.task, optimizer=self.optimizer, scheduler=self.scheduler, scaler=self.scaler,
            train_loader=self.train_loader, val_loader=self.val_loader, settings=settings,
            notes=self._notes(weights_notes), splits=self.splits, test_loader=self.test_loader, speed=self.speed,
            threads=self.threads, weights_notes=list(weights_notes), parts=self.parts, ema=self.ema,
            train_set=self.train_set, val_set=self.val_set, val_set_transform=val_set_transform,
            image_options=_device_image_options(self.recipe), sample_weights=self.sample_weights,
            steps_per_epoch=self.steps_per_epoch, pretrained=self.built.pretrained, weights_record=self.built.record)


def _micro_batch(recipe: Recipe) -> int | None:
    micro = recipe.train.micro_batch_size
    return micro if isinstance(micro, int) and micro < recipe.train.batch_size else None


def _class_weights(recipe: Recipe, targets: torch.Tensor, num_classes: int, device: torch.device) -> torch.Tensor | None:
    chosen = recipe.train.class_weights
    if chosen is None:
        return None
    if chosen == "auto":
        weights = inverse_frequency(class_counts(targets, num_classes), recipe.train.class_weight_power)
    else:
        if len(chosen) != num_classes:
            raise UserError(f"train.class_weights has {len(chosen)} weights for {num_classes} classes")
        weights = torch.tensor(chosen, dtype=torch.float64)
    return weights.to(device=device, dtype=torch.float32)


def fit_batch_to_split(recipe: Recipe, train_size: int, world_size: int) -> tuple[Recipe, list[str]]:
    """The recipe with train.batch_size at most the training images per process, and what was changed.

    Training drops the last partial batch (every step a full one), so a split smaller than one batch
    would train no step at all: it trains on one smaller batch of all its images instead, and
    recipe.resolved.yaml says so. One image per process is refused: BatchNorm in training mode needs
    two values per channel."""
    per_rank = -(-train_size // world_size)  # EpochSampler pads so every rank has this many
    batch = recipe.train.batch_size
    if per_rank < 2:
        raise UserError(f"{recipe.data.root}: {per_rank} training image per process: training needs at least 2 "
                        "per batch (BatchNorm); add images or run fewer processes")
    if per_rank >= batch:
        return recipe, []
    note = (f"the training split has {per_rank} training images per process, fewer than train.batch_size={batch}: "
            f"each epoch is one batch of {per_rank}")
    return replace(recipe, train=replace(recipe.train, batch_size=per_rank)), [note]


def _batch_mix(recipe: Recipe, spec: ModelSpec, num_classes: int, dist: DistInfo) -> Any:
    """The step's MixUp/CutMix (None when off); the inputs must be images, which only the data says."""
    if not recipe.augment.mixes:
        return None
    if spec.input_kind != "image":
        raise UserError(f"augment.mixup_alpha and augment.cutmix_alpha mix images; data.reader={recipe.data.reader} "
                        f"gives {spec.input_kind}: set both to 0")
    from inceptionlab.data.transforms.mixing import batch_mix  # start-up time: torchvision (~1.3 s), only when mixing

    return batch_mix(recipe.augment, num_classes, recipe.train.seed, dist.rank)


def start_threads(requested: int | None, dist: DistInfo, device: torch.device,
                  deterministic: bool = False) -> hardware.ThreadGovernor:
    """torch's thread pool sized to the CPUs this process may use, shared with the other local ranks."""
    limit, fixed = hardware.thread_limit(requested)
    if dist.enabled and not fixed:
        limit = max(1, limit // dist.local_world_size)
    # On a GPU the CPU threads only feed it: no governing, no re-sizing mid-run. A deterministic run keeps
    # its count too: a reduction split over 1 thread instead of 2 sums in another order (other weights).
    return hardware.ThreadGovernor(limit, fixed=fixed or deterministic or device.type != "cpu")


def _run_shape(recipe: Recipe, splits: Any, num_classes: int, train_size: int, dist: DistInfo) -> RunShape:
    inputs = getattr(splits.train, "inputs", None)
    tokens = inputs is not None and not inputs.dtype.is_floating_point and inputs.dtype != torch.uint8
    batch = recipe.train.batch_size if isinstance(recipe.train.batch_size, int) else recipe.optim.lr_batch_size or 32
    steps = recipe.train.epochs * -(-train_size // (batch * dist.world_size))
    if tokens:
        return RunShape((int(inputs.shape[1]),), True, num_classes, recipe.data.text.max_tokens + 1, steps)
    channels = int(inputs.shape[1]) if inputs is not None else 3
    size = recipe.data.train_crop_size or (int(inputs.shape[-1]) if inputs is not None else 299)
    return RunShape((channels, size, size), False, num_classes, steps=steps)


def _broadcaster(dist: DistInfo) -> Callable[[Any], Any]:
    """Rank 0's speed decision for every rank: ranks must train alike (and calibrate once)."""
    if not dist.enabled:
        return lambda decision: decision

    def broadcast(decision: Any) -> Any:
        box = [decision.to_dict() if decision is not None else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return hardware.Decision.from_dict(box[0])

    return broadcast


def _broadcaster_of(dist: DistInfo) -> Callable[[Any], Any]:
    """Rank 0's value (picklable) for every rank."""
    if not dist.enabled:
        return lambda value: value

    def broadcast(value: Any) -> Any:
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    return broadcast


def _device_type(name: str) -> str:
    # Decided before the process group exists: NCCL/RCCL for GPUs, gloo otherwise.
    return "cuda" if name.startswith("cuda") or (name == "auto" and torch.cuda.is_available()) else "cpu"


def _num_classes(recipe: Recipe, splits: Any) -> int:
    num_classes = len(splits.class_names)
    if recipe.model.num_classes not in (None, num_classes):
        raise UserError(
            f"model.num_classes={recipe.model.num_classes} but {recipe.data.root} has {num_classes} classes; "
            "set model.num_classes=null to follow the data"
        )
    return num_classes


def place_model(model: nn.Module, recipe: Recipe, device: torch.device) -> nn.Module:
    """The plain module on the device, in the run's memory format (its state_dict is what we save)."""
    memory_format = torch.channels_last if recipe.train.channels_last else torch.contiguous_format
    return model.to(device=device, memory_format=memory_format)


def wrap_model(model: nn.Module, recipe: Recipe, dist: DistInfo, device: torch.device) -> nn.Module:
    """What the loop calls: DDP- and/or compile-wrapped. DDP registers the parameters that require
    gradients now: a change of what trains needs a new wrapper (engine/finetune.py)."""
    runner: nn.Module = model
    if dist.enabled:
        runner = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if recipe.train.compile:
        runner = torch.compile(runner)
    return runner


def _read_data(recipe: Recipe) -> tuple[Any, Any, Any]:
    """(splits, train set, val set): read, capped for smoke runs, checked non-empty."""
    cfg = recipe.data
    importing = _import_in_background()
    splits = read_splits(cfg, recipe.augment)
    importing.join()  # before any DataLoader worker forks: a fork mid-import would copy a held import lock
    train_set = cap_samples(splits.train, cfg.max_train_samples, recipe.train.seed)
    val_set = cap_samples(splits.val, cfg.max_val_samples, recipe.train.seed)
    if len(train_set) == 0 or len(val_set) == 0:
        raise UserError(f"{cfg.root}: the train or val split is empty")
    if len(splits.class_names) < 2:
        named = f" ({splits.class_names[0]})" if splits.class_names else ""
        raise UserError(f"{cfg.root}: the data has one class{named}; a classifier needs two or more (with one, "
                        "it answers that class for every picture): add a folder per class")
    return splits, train_set, val_set


def _build_loaders(recipe: Recipe, splits: Any, train_set: Any, val_set: Any, dist: DistInfo,
                   device: torch.device, sample_weights: torch.Tensor | None = None) -> tuple[Any, Any, Any]:
    cfg = recipe.data
    common = dict(seed=recipe.train.seed, num_workers=cfg.num_workers, rank=dist.rank, world_size=dist.world_size,
                  pin_memory=device.type == "cuda", device=device, mode=cfg.loader,
                  images=_device_image_options(recipe), local_world_size=dist.local_world_size)
    train_loader = make_loader(train_set, batch_size=recipe.train.batch_size, train=True, weights=sample_weights,
                               **common)
    val_loader = make_loader(val_set, batch_size=_eval_batch(recipe), train=False, **common)
    test_loader = None
    if splits.test is not None:
        test_loader = make_loader(splits.test, batch_size=_eval_batch(recipe), train=False, **common)
    return train_loader, val_loader, test_loader


# What a run imports after its data is read, in the order it needs them (AMD EPYC, one core):
BACKGROUND_IMPORTS = (
    "torch._dynamo",  # every torch.optim optimizer's constructor imports it: 1.3-1.8 s
    "torch.utils.tensorboard",  # the run's event writer: 0.3 s
    "inceptionlab.plots",  # matplotlib, for the plots at the end: 0.4-0.5 s
)


def _import_in_background(modules: tuple[str, ...] = BACKGROUND_IMPORTS) -> threading.Thread:
    """Import `modules` in a thread while the reader works.

    Readers spend most of their time in code that releases the GIL (PIL, zlib, the tokenizer's
    Rust) or in a child process (IMDB, `data/text/child_reader.py`), so the imports run beside them
    instead of after them: 2-2.5 s of the IMDB recipe's whole command.
    """
    def import_all() -> None:
        for module in modules:
            with contextlib.suppress(ImportError):  # the import where it is used says what is missing
                importlib.import_module(module)

    thread = threading.Thread(target=import_all, name="background-imports", daemon=True)
    thread.start()
    return thread


def _device_image_options(recipe: Recipe) -> DeviceImageOptions | None:
    """How the loader may keep an image folder on the device; None for array and text datasets."""
    return DeviceImageOptions.from_recipe(recipe) if recipe.data.reader in READERS else None


def _eval_batch(recipe: Recipe) -> int:
    # No activations are kept for backward in evaluation: twice the training batch fits.
    return recipe.train.eval_batch_size or 2 * recipe.train.batch_size


def _make_spec(recipe: Recipe, splits: Any, num_classes: int, arch_kwargs: dict[str, Any]) -> ModelSpec:
    cfg = recipe.data
    inputs = getattr(splits.train, "inputs", None)
    tokens = inputs is not None and not inputs.dtype.is_floating_point and inputs.dtype != torch.uint8
    # Text models take token ids: the image fields keep ModelSpec's defaults (resolve_data_config fills none).
    image = {} if tokens else dict(crop_size=cfg.val_crop_size, resize_size=cfg.val_resize_size,
                                   interpolation=cfg.interpolation, mean=list(cfg.mean), std=list(cfg.std))
    return ModelSpec(
        arch=recipe.model.name,
        num_classes=num_classes,
        class_names=list(splits.class_names),
        class_labels=splits.class_labels,
        task=recipe.task,
        **image,
        arch_kwargs=arch_kwargs,
        input_kind="tokens" if tokens else "image",
        channels=int(inputs.shape[1]) if inputs is not None and not tokens else 3,
        tokenizer="tokenizer.json" if "tokenizer.json" in splits.artifacts else None,
        sequence_length=int(inputs.shape[1]) if tokens else None,
        weights="ema" if recipe.ema.enabled else "raw",
    )


def _identity(inputs: torch.Tensor) -> torch.Tensor:
    return inputs


def input_preparation(spec: ModelSpec, channels_last: bool, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """uint8 images -> normalised floats on the device; token ids pass through."""
    if spec.input_kind != "image":
        return _identity
    return spec.normalizer(channels_last).to(device)
