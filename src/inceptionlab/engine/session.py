"""A session: everything one training run needs, assembled once from a recipe.

Data (readers -> loaders, which choose the data path), the model (registry), its spec, the task
(loss and metrics), optimizer, schedule and scaler, on the device `runtime.resolve_device` picks.
`fit` then only runs epochs; nothing here writes files.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
import torch.distributed
from torch import nn

from inceptionlab import hardware
from inceptionlab.config import DataConfig, Recipe, needed_cache_size
from inceptionlab.data.loading.image_options import DeviceImageOptions
from inceptionlab.data.loading.loaders import Loader, cap_samples, make_loader
from inceptionlab.data.loading.sampler import balanced_sample_weights, class_counts, inverse_frequency, split_targets
from inceptionlab.data.readers import READERS, read_splits
from inceptionlab.data.transforms.device import pass_normalised
from inceptionlab.engine.batch_size import resolve_batch_sizes
from inceptionlab.engine.distributed import DistInfo, broadcast_state, init_distributed
from inceptionlab.engine.ema import ModelEma
from inceptionlab.engine.loop import StepSettings
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
    train_loader: Loader
    val_loader: Loader
    settings: StepSettings
    notes: list[str] = field(default_factory=list)
    splits: Any = None
    test_loader: Loader | None = None
    speed: hardware.Decision | None = None  # what `auto` chose for precision, memory format and compile
    threads: hardware.ThreadGovernor | None = None
    weights_notes: list[str] = field(default_factory=list)  # the notes saying where a new run's weights come
    # from (among `notes`): a resumed run's come from its checkpoint, and it says so instead
    parts: ModelParts | None = None  # head, auxiliary heads, body (models/parts.py)
    ema: ModelEma | None = None  # the weights' average, when ema.decay is set
    train_set: Any = None  # the (capped) splits the loaders serve, for the frozen-body features
    val_set: Any = None
    val_set_transform: Any = None  # the eval view of an image (the spec's), for those features
    image_options: DeviceImageOptions | None = None
    sample_weights: torch.Tensor | None = None  # data.sampler=balanced: per training sample
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
    """Everything a run needs. `auto` speed settings are decided here, after the model exists and
    before the loaders (whose augmentation dtype and layout follow the decision) are built."""
    # Preprocessing fields a recipe leaves empty come from the model's weights (timm's resolve_data_config):
    # what a run or a sidecar records with them, else the architecture's defaults.
    weights = starting_weights(recipe.model.name, recipe.model.weights)
    recipe = replace(recipe, data=resolve_data_config(recipe.data, recipe.model.name, weights))
    _check_augment(recipe)
    dist = init_distributed(_device_type(recipe.train.device))
    device = resolve_device(recipe.train.device, dist.local_rank if dist.enabled else None)
    threads = start_threads(recipe.train.threads, dist, device, recipe.train.deterministic)
    seed_everything(recipe.train.seed + dist.rank, recipe.train.deterministic)
    splits, train_set, val_set = _read_data(recipe)
    num_classes = _num_classes(recipe, splits)
    normalisation = (recipe.data.mean, recipe.data.std) if recipe.data.mean is not None else None
    built = build_model(recipe.model.name, num_classes, weights, recipe.model.aux_loss_weight,
                        list(splits.class_names), normalisation=normalisation,
                        **{**recipe.model.kwargs, **splits.model_kwargs})
    targets = split_targets(train_set)
    task = make_task(recipe.task, num_classes, recipe.train.label_smoothing, recipe.model.aux_loss_weight,
                     _class_weights(recipe, targets, num_classes, device))
    shape = _run_shape(recipe, splits, num_classes, len(train_set), dist)
    recipe, speed = resolve_speed_settings(recipe, built.model, task, device, shape, broadcast=_broadcaster(dist),
                                           fresh=fresh_speed, is_main=dist.is_main)
    recipe, found_batch_notes = resolve_batch_sizes(recipe, built.model, task, device, shape,
                                                    broadcast=_broadcaster_of(dist))
    recipe, fitted_batch_notes = fit_batch_to_split(recipe, len(train_set), dist.world_size)  # after `auto` is found
    batch_notes = [*found_batch_notes, *fitted_batch_notes]
    sample_weights = _sample_weights(recipe, targets, num_classes)
    train_loader, val_loader, test_loader = _build_loaders(recipe, splits, train_set, val_set, dist, device,
                                                           sample_weights)
    model = place_model(built.model, recipe, device)
    broadcast_state(model, dist)  # every rank starts from rank 0's weights, whatever the first stage wraps
    parts = model_parts(model, num_classes)
    # The whole model's wrapper now only when the first epochs train it all (engine/finetune.py builds the rest).
    runner = wrap_model(model, recipe, dist, device) if recipe.finetune.freeze_epochs == 0 else model
    optimizer = build_optimizer(model, recipe.optim, parts=parts, finetune=recipe.finetune)
    scheduler = build_scheduler(optimizer, recipe.schedule, recipe.train.epochs, steps_per_epoch=len(train_loader),
                                freeze_epochs=recipe.finetune.freeze_epochs, lr=recipe.optim.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=recipe.train.precision == "fp16")
    ema = ModelEma(model, recipe.ema) if recipe.ema.enabled else None
    spec = _make_spec(recipe, splits, num_classes, built.arch_kwargs)
    prepare = input_preparation(spec, recipe.train.channels_last, device)
    if any(loader.yields_normalised for loader in (train_loader, val_loader)):
        prepare = pass_normalised(prepare)  # resident image batches arrive normalised; uint8 ones still get it
    settings = StepSettings(device, recipe.train.precision, prepare, recipe.train.grad_clip_norm, recipe.train.log_every,
                            mix=_batch_mix(recipe, spec, num_classes, dist), micro_batch=_micro_batch(recipe))
    weights_notes = built.report or ["weights: random init (training from scratch)"]
    notes = [*splits.notes, *weights_notes,
             f"parameters: {parts.describe()}", *_optimizer_notes(recipe, optimizer), *batch_notes,
             *(cache_size_notes(recipe.data) if recipe.data.reader in READERS else []),
             *_imbalance_notes(recipe, task, targets, num_classes),
             speed.line("speed settings"), *speed_warnings(recipe, device), threads.describe()]
    session = TrainingSession(recipe, dist, device, spec, model, runner, task, optimizer, scheduler, scaler,
                              train_loader, val_loader, settings, notes, splits, test_loader, speed, threads,
                              list(weights_notes))
    session.parts, session.ema, session.sample_weights = parts, ema, sample_weights
    session.weights_record = built.record
    session.train_set, session.val_set, session.image_options = train_set, val_set, _device_image_options(recipe)
    session.val_set_transform = getattr(val_set, "transform", None) or getattr(getattr(val_set, "dataset", None),
                                                                              "transform", None)
    return session


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


def _sample_weights(recipe: Recipe, targets: torch.Tensor, num_classes: int) -> torch.Tensor | None:
    if recipe.data.sampler != "balanced":
        return None
    return balanced_sample_weights(targets, num_classes, recipe.data.balance_power)


def _imbalance_notes(recipe: Recipe, task: Any, targets: torch.Tensor, num_classes: int) -> list[str]:
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
                     if recipe.train.class_weights == "auto" else "class weights: as listed in the recipe")
    if recipe.data.sampler == "balanced":
        power = recipe.data.balance_power
        notes.append("sampler: balanced (" + ("every class drawn equally often" if power == 1 else
                     f"class drawn in proportion to its count^{1 - power:g}") + ", as many draws per epoch as images)")
    return notes


def _optimizer_notes(recipe: Recipe, optimizer: torch.optim.Optimizer) -> list[str]:
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


def cache_size_notes(data: DataConfig) -> list[str]:
    """A warning when data.cache_size keeps images smaller than the eval resize or the training crop
    needs (validation would upsample what `evaluate` resizes from the file)."""
    needed = needed_cache_size(data)
    if data.cache_size is None or needed is None or data.cache_size >= needed:
        return []
    return [f"warning: data.cache_size={data.cache_size} keeps a photo's shorter side at {data.cache_size} px, "
            f"below the {needed} px the model resizes to (data.val_resize_size, data.train_crop_size): validation "
            f"upsamples such images and differs from `evaluate`; set data.cache_size=null (or {needed})"]


def _check_augment(recipe: Recipe) -> None:
    """Before any data is read: a policy or erasing needs per-image transforms (image folders have them,
    array datasets not); MixUp/CutMix mix the targets of a multiclass task."""
    if recipe.augment.per_image and recipe.data.reader not in READERS:
        raise UserError(f"augment.policy and augment.random_erasing act on image folders; data.reader="
                        f"{recipe.data.reader} is served as arrays without per-image transforms: "
                        "set augment.policy=none and augment.random_erasing=0")
    if recipe.augment.mixes and recipe.task != "multiclass":
        raise UserError(f"augment.mixup_alpha and augment.cutmix_alpha mix the targets of a multiclass task, "
                        f"not task={recipe.task}: set both to 0")


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


def speed_warnings(recipe: Recipe, device: torch.device) -> list[str]:
    """Said at once when a set precision can only be emulated on this device."""
    warning = hardware.emulation_warning(hardware.device_facts(device), recipe.train.precision)
    return [f"warning: {warning}"] if warning else []


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
