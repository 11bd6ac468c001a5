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
from torch import nn

from inceptionlab import hardware
from inceptionlab.config import Recipe
from inceptionlab.data.loading.image_options import DeviceImageOptions
from inceptionlab.data.loading.loaders import Loader, cap_samples, make_loader
from inceptionlab.data.readers import READERS, read_splits
from inceptionlab.data.transforms.device import pass_normalised
from inceptionlab.engine.distributed import DistInfo, init_distributed
from inceptionlab.engine.loop import StepSettings
from inceptionlab.engine.optim import build_optimizer, build_scheduler
from inceptionlab.engine.speed import RunShape, resolve_speed_settings
from inceptionlab.engine.task import make_task
from inceptionlab.errors import UserError
from inceptionlab.models.registry import build_model, resolve_data_config
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

    def resumable_parts(self) -> dict[str, Any]:
        """What a checkpoint saves and restores (see checkpoint.training_checkpoint)."""
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler, "scaler": self.scaler}

    @property
    def skipped_files(self) -> list[str]:
        return sorted(set(self.train_loader.skipped + self.val_loader.skipped))


def build_training_session(recipe: Recipe, *, fresh_speed: bool = False) -> TrainingSession:
    """Everything a run needs. `auto` speed settings are decided here, after the model exists and
    before the loaders (whose augmentation dtype and layout follow the decision) are built."""
    # Preprocessing fields a recipe leaves empty come from the model's weights (timm's resolve_data_config).
    recipe = replace(recipe, data=resolve_data_config(recipe.data, recipe.model.name))
    _check_augment(recipe)
    dist = init_distributed(_device_type(recipe.train.device))
    device = resolve_device(recipe.train.device, dist.local_rank if dist.enabled else None)
    threads = start_threads(recipe.train.threads, dist, device)
    seed_everything(recipe.train.seed + dist.rank, recipe.train.deterministic)
    splits, train_set, val_set = _read_data(recipe)
    num_classes = _num_classes(recipe, splits)
    built = build_model(recipe.model.name, num_classes, recipe.model.weights, recipe.model.aux_loss_weight,
                        **{**recipe.model.kwargs, **splits.model_kwargs})
    task = make_task(recipe.task, num_classes, recipe.train.label_smoothing, recipe.model.aux_loss_weight)
    recipe, speed = resolve_speed_settings(recipe, built.model, task, device, _run_shape(recipe, splits, num_classes,
                                           len(train_set), dist), broadcast=_broadcaster(dist), fresh=fresh_speed,
                                           is_main=dist.is_main)
    train_loader, val_loader, test_loader = _build_loaders(recipe, splits, train_set, val_set, dist, device)
    model, runner = _place_model(built.model, recipe, dist, device)
    optimizer = build_optimizer(model.parameters(), recipe.optim)
    scheduler = build_scheduler(optimizer, recipe.schedule, recipe.train.epochs)
    scaler = torch.amp.GradScaler(device.type, enabled=recipe.train.precision == "fp16")
    spec = _make_spec(recipe, splits, num_classes, built.arch_kwargs)
    prepare = input_preparation(spec, recipe.train.channels_last, device)
    if any(loader.yields_normalised for loader in (train_loader, val_loader)):
        prepare = pass_normalised(prepare)  # resident image batches arrive normalised; uint8 ones still get it
    settings = StepSettings(device, recipe.train.precision, prepare, recipe.train.grad_clip_norm, recipe.train.log_every,
                            _batch_mix(recipe, spec, num_classes, dist))
    notes = [*splits.notes, f"weights: {built.pretrained or 'random init (training from scratch)'}",
             speed.line("speed settings"), *speed_warnings(recipe, device), threads.describe()]
    return TrainingSession(recipe, dist, device, spec, model, runner, task, optimizer, scheduler, scaler,
                           train_loader, val_loader, settings, notes, splits, test_loader, speed, threads)


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


def start_threads(requested: int | None, dist: DistInfo, device: torch.device) -> hardware.ThreadGovernor:
    """torch's thread pool sized to the CPUs this process may use, shared with the other local ranks."""
    limit, fixed = hardware.thread_limit(requested)
    if dist.enabled and not fixed:
        limit = max(1, limit // dist.local_world_size)
    # On a GPU the CPU threads only feed it: no governing, no re-sizing mid-run.
    return hardware.ThreadGovernor(limit, fixed=fixed or device.type != "cpu")


def speed_warnings(recipe: Recipe, device: torch.device) -> list[str]:
    """Said at once when a set precision can only be emulated on this device."""
    warning = hardware.emulation_warning(hardware.device_facts(device), recipe.train.precision)
    return [f"warning: {warning}"] if warning else []


def _run_shape(recipe: Recipe, splits: Any, num_classes: int, train_size: int, dist: DistInfo) -> RunShape:
    inputs = getattr(splits.train, "inputs", None)
    tokens = inputs is not None and not inputs.dtype.is_floating_point and inputs.dtype != torch.uint8
    steps = recipe.train.epochs * -(-train_size // (recipe.train.batch_size * dist.world_size))
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
        import torch.distributed

        box = [decision.to_dict() if decision is not None else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return hardware.Decision.from_dict(box[0])

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


def _place_model(model: nn.Module, recipe: Recipe, dist: DistInfo, device: torch.device) -> tuple[nn.Module, nn.Module]:
    """(the plain module on the device, what the loop calls: DDP- and/or compile-wrapped)."""
    memory_format = torch.channels_last if recipe.train.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=memory_format)
    runner: nn.Module = model
    if dist.enabled:
        runner = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if recipe.train.compile:
        runner = torch.compile(runner)
    return model, runner


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
    return splits, train_set, val_set


def _build_loaders(recipe: Recipe, splits: Any, train_set: Any, val_set: Any, dist: DistInfo,
                   device: torch.device) -> tuple[Any, Any, Any]:
    cfg = recipe.data
    common = dict(seed=recipe.train.seed, num_workers=cfg.num_workers, rank=dist.rank, world_size=dist.world_size,
                  pin_memory=device.type == "cuda", device=device, mode=cfg.loader,
                  images=_device_image_options(recipe))
    train_loader = make_loader(train_set, batch_size=recipe.train.batch_size, train=True, **common)
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
    )


def _identity(inputs: torch.Tensor) -> torch.Tensor:
    return inputs


def input_preparation(spec: ModelSpec, channels_last: bool, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """uint8 images -> normalised floats on the device; token ids pass through."""
    if spec.input_kind != "image":
        return _identity
    return spec.normalizer(channels_last).to(device)
