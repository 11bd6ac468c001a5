"""Recipes: YAML files that hold data only, read into typed dataclasses.

A recipe names a dataset reader, a model from the registry and a task; the engine never forks on
which recipe it runs. Files may inherit from another with `base: other.yaml` (resolved relative to
the file), and `--set section.key=value` overrides are applied last. OmegaConf's structured configs
make the dataclasses the schema: an unknown key or a value of the wrong type is an error naming the
key; the cross-checks OmegaConf cannot express live in `__post_init__`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from inceptionlab.errors import UserError

# Shipped as package data, so a plain (non-editable) `pip install .` has them; `recipes/` at the
# repository root is a link here.
RECIPES_DIR = Path(__file__).resolve().parent / "recipes"

INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
SAMPLERS = ("shuffle", "balanced")
EMA_BUFFERS = ("average", "copy")
# augment.policy choices: torchvision's TrivialAugmentWide, RandAugment, AutoAugment (data/transforms/policies.py).
POLICIES = ("none", "trivialaugment", "randaugment", "autoaugment")
AUTOAUGMENT_POLICIES = ("imagenet", "cifar10", "svhn")  # torchvision's AutoAugmentPolicy values
POLICY_INTERPOLATIONS = ("nearest", "bilinear")  # what torchvision's tensor kernels offer for the geometric ops
# Values that pick from an engine table (optim.name, schedule.name, task, train.precision, data.reader,
# data.loader, train.best_metric) are checked against those tables by engine/choices.py.


def _check_choice(where: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{where}={value!r} is not one of {', '.join(choices)}")


def _check_positive(where: str, value: float | int | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{where}={value!r} must be {'>= 0' if allow_zero else '> 0'}")


def _auto_or_positive_int(where: str, value: Any, allow_none: bool = False) -> int | str | None:
    """`auto`, a positive integer (or the string a --set carries), or None where allowed."""
    if value is None and allow_none:
        return None
    if value == "auto":
        return value
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or number <= 0 or str(number) != str(value).strip():
        raise ValueError(f"{where}={value!r} must be a positive integer or auto")
    return number


def _auto_or_bool(where: str, value: Any) -> bool | str:
    """`auto`, or a boolean (YAML's true/false, or the strings a --set may carry)."""
    if isinstance(value, bool) or value == "auto":
        return value
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise ValueError(f"{where}={value!r} must be auto, true or false")


@dataclass
class ModelConfig:
    name: str = "inception_v3"  # registry name: any torchvision classification model, or ours
    # "imagenet" (the model's default weights), null (random init), a weights file (a state_dict, a run's
    # checkpoint, another tool's checkpoint; a sidecar NAME.json beside it may give its classes, mean and std),
    # or a run directory (its spec.json names the architecture, classes and input). The body must fit; the
    # head is kept when the classes match, replaced (rows of shared class names carried over) when they
    # differ, made new when the weights have none.
    weights: Optional[str] = "imagenet"
    num_classes: Optional[int] = None  # null: taken from the dataset's classes
    aux_loss_weight: Optional[float] = None  # null: drop Inception's aux head; else keep it, loss weight
    # Extra builder arguments (dropout, ...), checked against the chosen model's own arguments. A key set
    # to null is dropped (`--set model.kwargs.dropout=null`); `--set 'model.kwargs={}'` clears them all.
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_positive("model.num_classes", self.num_classes)
        _check_positive("model.aux_loss_weight", self.aux_loss_weight, allow_zero=True)
        self.kwargs = {key: value for key, value in self.kwargs.items() if value is not None}


@dataclass
class TextConfig:
    max_tokens: int = 10_000  # vocabulary budget: padding + out-of-vocabulary + the most frequent tokens
    sequence_length: int = 250  # pad / truncate every text to this many tokens
    tokenizer: Optional[str] = None  # a saved tokenizer.json to use as is (no fitting): fixed vocabulary

    def __post_init__(self) -> None:
        _check_positive("data.text.max_tokens", self.max_tokens)
        _check_positive("data.text.sequence_length", self.sequence_length)


@dataclass
class DataConfig:
    reader: str = "imagefolder"  # imagefolder | tiny_imagenet | digits | cifar10 | fashion_mnist | mnist | imdb
    root: Optional[str] = None  # dataset folder; `--data DIR` sets it
    download: bool = True  # readers of public datasets fetch (with checksums) into root when files are missing
    # auto: in-memory datasets and image folders that fit stay on the device (resident); bigger image folders
    # stream (decoded in workers per batch, augmented on the device); workers: per-image crops in workers
    loader: str = "auto"  # auto | resident | stream | workers
    # resident/stream image folders: the shorter side each image is kept at, px (smaller images stay exact);
    # null: the model's eval resize (or the training crop, if larger), so validation never upsamples
    cache_size: Optional[int] = None
    val_fraction: Optional[float] = None  # carve validation out of train (IMDB: 0.2), else the val/test split
    split_seed: int = 42  # seed of that carve-out (the guide's seed=42)
    # Image files without train/ + val/ folders (data/datasets/file_list.py): a CSV of file,label[,split];
    # or, with neither, one folder of class folders. Both are split per class by val_fraction (0.2 if
    # unset) and split_seed, and the split is recorded in the run's splits.csv.
    labels_csv: Optional[str] = None
    split_file: Optional[str] = None  # a run's splits.csv to read the split from as it was (set by evaluate, resume)
    text: TextConfig = field(default_factory=TextConfig)
    train_split: str = "train"
    val_split: str = "val"
    # Preprocessing: null = from the model's weights (torchvision's `weights.transforms()`: ResNet50
    # 232 -> 224, Inception v3 342 -> 299) or, for our small models, the registry's declared values;
    # filled in by `models.registry.resolve_data_config` when the session is built.
    train_crop_size: Optional[int] = None  # RandomResizedCrop output, px; null: the eval crop size
    val_resize_size: Optional[int] = None  # shorter side before the centre crop, px
    val_crop_size: Optional[int] = None
    interpolation: Optional[str] = None  # nearest | bilinear | bicubic
    mean: Optional[list[float]] = None  # per channel, of pixels scaled to [0, 1]
    std: Optional[list[float]] = None
    train_crop_scale: list[float] = field(default_factory=lambda: [0.08, 1.0])  # RandomResizedCrop area range
    hflip: bool = False  # random horizontal flip in training (the guide has none)
    num_workers: Optional[int] = None  # null: min(8, CPU cores); 0 loads in the main process
    max_train_samples: Optional[int] = None  # cap for smoke runs (a fixed random subset)
    max_val_samples: Optional[int] = None
    # shuffle: each training image once per epoch. balanced: an epoch of as many draws (with replacement),
    # image i drawn with probability proportional to n_class(i)^-balance_power (1: every class equally
    # often; 0.5: in between), a function of (seed, epoch, rank) like the shuffle, so resume stays exact.
    sampler: str = "shuffle"  # shuffle | balanced
    balance_power: float = 1.0

    def __post_init__(self) -> None:
        if self.interpolation is not None:
            _check_choice("data.interpolation", self.interpolation, INTERPOLATIONS)
        if self.val_fraction is not None and not 0 < self.val_fraction < 1:
            raise ValueError(f"data.val_fraction={self.val_fraction} must be in (0, 1)")
        for name in ("train_crop_size", "val_resize_size", "val_crop_size", "cache_size"):
            _check_positive(f"data.{name}", getattr(self, name))
        if None not in (self.val_resize_size, self.val_crop_size) and self.val_resize_size < self.val_crop_size:
            raise ValueError(
                f"data.val_resize_size={self.val_resize_size} is smaller than "
                f"data.val_crop_size={self.val_crop_size}: the centre crop would not fit"
            )
        if len(self.train_crop_scale) != 2 or not 0 < self.train_crop_scale[0] <= self.train_crop_scale[1] <= 1:
            raise ValueError(f"data.train_crop_scale={self.train_crop_scale} must be [low, high] with 0 < low <= high <= 1")
        if None not in (self.mean, self.std) and len(self.mean) != len(self.std):
            raise ValueError("data.mean and data.std must have the same length")
        _check_positive("data.num_workers", self.num_workers, allow_zero=True)
        _check_positive("data.max_train_samples", self.max_train_samples)
        _check_positive("data.max_val_samples", self.max_val_samples)
        _check_choice("data.sampler", self.sampler, SAMPLERS)
        _check_positive("data.balance_power", self.balance_power, allow_zero=True)


def needed_cache_size(data: DataConfig) -> int | None:
    """The shorter side a cached image needs so that neither the eval resize nor a whole-image training
    crop upsamples it: the larger of data.val_resize_size and data.train_crop_size (None before they are known)."""
    sizes = [size for size in (data.val_resize_size, data.train_crop_size) if size is not None]
    return max(sizes) if sizes else None


@dataclass
class AugmentConfig:
    """Training augmentation after the crop and flip (data section), described once for both data paths:
    the worker path runs torchvision's v2 transforms, the resident and stream paths the same policy batched
    on the device (data/transforms/device_policy.py); MixUp/CutMix mix device batches on both.

    Order per image, as torchvision's reference recipe: crop, flip, policy, erasing; then per batch MixUp
    or CutMix. Label smoothing (train.label_smoothing = e) applies to the mixed target q:
    (1 - e) * q + e / C, the same as mixing smoothed one-hot targets (timm), and what torch's
    cross_entropy does with probabilities (torchvision's references).
    """

    policy: str = "none"  # none | trivialaugment | randaugment | autoaugment
    num_magnitude_bins: int = 31  # trivialaugment, randaugment: magnitude levels (torchvision's default)
    num_ops: int = 2  # randaugment: operations applied one after the other
    magnitude: int = 9  # randaugment: the level every operation uses, 0 .. num_magnitude_bins - 1
    autoaugment_policy: str = "imagenet"  # autoaugment: imagenet | cifar10 | svhn (the learned policy)
    interpolation: str = "bilinear"  # shear/translate/rotate: nearest (torchvision's default) | bilinear (its references)
    random_erasing: float = 0.0  # probability per image of erasing a box to the mean colour (torchvision: 0.5)
    mixup_alpha: float = 0.0  # MixUp's Beta(alpha, alpha); 0: off (torchvision's references: 0.2)
    cutmix_alpha: float = 0.0  # CutMix's Beta(alpha, alpha); 0: off (references: 1.0). Both on: one per batch, 50:50
    mix_off_epoch: Optional[int] = None  # MixUp/CutMix stop after this many epochs (timm's --mixup-off-epoch); null: never

    def __post_init__(self) -> None:
        _check_choice("augment.policy", self.policy, POLICIES)
        _check_choice("augment.autoaugment_policy", self.autoaugment_policy, AUTOAUGMENT_POLICIES)
        _check_choice("augment.interpolation", self.interpolation, POLICY_INTERPOLATIONS)
        _check_positive("augment.num_magnitude_bins", self.num_magnitude_bins)
        if self.num_magnitude_bins < 2:
            raise ValueError(f"augment.num_magnitude_bins={self.num_magnitude_bins} must be at least 2")
        _check_positive("augment.num_ops", self.num_ops, allow_zero=True)
        if not 0 <= self.magnitude < self.num_magnitude_bins:
            raise ValueError(f"augment.magnitude={self.magnitude} must be in 0 .. num_magnitude_bins - 1 "
                             f"({self.num_magnitude_bins - 1})")
        if not 0.0 <= self.random_erasing <= 1.0:
            raise ValueError(f"augment.random_erasing={self.random_erasing} is a probability: 0 .. 1")
        _check_positive("augment.mixup_alpha", self.mixup_alpha, allow_zero=True)
        _check_positive("augment.cutmix_alpha", self.cutmix_alpha, allow_zero=True)
        _check_positive("augment.mix_off_epoch", self.mix_off_epoch, allow_zero=True)

    @property
    def mixes(self) -> bool:
        """MixUp or CutMix is on (for some epochs)."""
        return (self.mixup_alpha > 0 or self.cutmix_alpha > 0) and self.mix_off_epoch != 0

    @property
    def per_image(self) -> bool:
        """A policy or erasing runs on each training image after the crop."""
        return self.policy != "none" or self.random_erasing > 0

    def on(self) -> list[str]:
        """The augmentations asked for, as their settings: ["augment.policy=trivialaugment", ...]."""
        found = [f"augment.policy={self.policy}"] if self.policy != "none" else []
        found += [f"augment.random_erasing={self.random_erasing:g}"] if self.random_erasing > 0 else []
        if self.mixes:
            found += [f"augment.{name}_alpha={alpha:g}" for name, alpha in
                      (("mixup", self.mixup_alpha), ("cutmix", self.cutmix_alpha)) if alpha > 0]
        return found


@dataclass
class TrainConfig:
    epochs: int = 90
    # Images per optimizer step and process: the batch optim.lr is meant for. `auto` (a GPU): the largest
    # batch that fits with headroom, found by probing and cached (engine/batch_size.py), with optim.lr
    # scaled linearly from optim.lr_batch_size to it; on a CPU, auto is optim.lr_batch_size.
    batch_size: Any = 32
    # Images per forward/backward: null = batch_size; smaller accumulates batch_size / micro_batch_size
    # gradients per step (the loss of each part weighted by its share, so lr keeps its meaning; BatchNorm
    # normalises each micro-batch on its own); auto (a GPU): the largest that fits, found as above.
    micro_batch_size: Any = None
    eval_batch_size: Optional[int] = None  # null: 2 x batch_size (no activations kept for backward)
    # auto: decided on this machine by probe and a short timed calibration (inceptionlab.hardware), cached.
    precision: str = "auto"  # auto | fp32 | bf16 | fp16 (autocast; fp16 adds a GradScaler)
    channels_last: Any = "auto"  # auto | true | false: NHWC memory format for convolutions
    compile: Any = "auto"  # auto | true | false: torch.compile the model (first steps pay the compile time)
    threads: Optional[int] = None  # CPU threads for torch; null: the CPUs this process may use (affinity, cgroup)
    seed: int = 0
    deterministic: bool = False  # torch.use_deterministic_algorithms; slower on GPU
    device: str = "auto"  # auto | cpu | cuda | cuda:N (ROCm GPUs are "cuda" in PyTorch)
    log_every: int = 10  # steps between log lines (the guide prints every 10)
    label_smoothing: float = 0.0
    # Loss weight per class: null (all 1), auto (inverse class frequency in the training split to the power
    # class_weight_power, normalised to mean 1), or a list with one weight per class. Validation loss stays
    # unweighted, so runs compare on one scale.
    class_weights: Any = None
    class_weight_power: float = 1.0  # auto: 1 = inverse frequency, 0.5 = its square root (milder)
    grad_clip_norm: Optional[float] = None  # clip the global grad norm to this value
    best_metric: str = "val_top1"  # metric that picks best.pt; *_loss metrics are minimised
    early_stop_patience: Optional[int] = None  # stop after this many epochs without improvement
    early_stop_min_delta: float = 0.0

    def __post_init__(self) -> None:
        _check_positive("train.epochs", self.epochs)
        self.batch_size = _auto_or_positive_int("train.batch_size", self.batch_size)
        self.micro_batch_size = _auto_or_positive_int("train.micro_batch_size", self.micro_batch_size, allow_none=True)
        if isinstance(self.batch_size, int) and isinstance(self.micro_batch_size, int):
            if self.micro_batch_size > self.batch_size or self.batch_size % self.micro_batch_size:
                raise ValueError(f"train.micro_batch_size={self.micro_batch_size} must divide "
                                 f"train.batch_size={self.batch_size}")
        _check_class_weights(self.class_weights)
        _check_positive("train.class_weight_power", self.class_weight_power, allow_zero=True)
        _check_positive("train.eval_batch_size", self.eval_batch_size)
        _check_positive("train.log_every", self.log_every)
        _check_positive("train.grad_clip_norm", self.grad_clip_norm)
        _check_positive("train.early_stop_patience", self.early_stop_patience)
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"train.label_smoothing={self.label_smoothing} must be in [0, 1)")
        self.channels_last = _auto_or_bool("train.channels_last", self.channels_last)
        self.compile = _auto_or_bool("train.compile", self.compile)
        _check_positive("train.threads", self.threads)
        if not self.best_metric.startswith(("val_", "train_")):
            raise ValueError(f"train.best_metric={self.best_metric!r} must start with val_ or train_")


@dataclass
class OptimConfig:
    name: str = "sgd"  # sgd | adamw | adam
    lr: float = 0.1
    momentum: float = 0.9  # SGD only
    nesterov: bool = False  # SGD only
    weight_decay: float = 1e-4
    # false (the torchvision references' --norm-weight-decay 0 and timm's default): no weight decay on
    # normalisation layers' weights and on biases; true: every parameter decays (the guide's SGD).
    decay_norm_and_bias: bool = False
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # Adam(W) only
    # The batch `lr` is meant for, when train.batch_size=auto: lr x found batch / lr_batch_size (linear
    # scaling, Goyal et al. 2017). null: 32.
    lr_batch_size: Optional[int] = None

    def __post_init__(self) -> None:
        _check_positive("optim.lr", self.lr)
        _check_positive("optim.weight_decay", self.weight_decay, allow_zero=True)
        _check_positive("optim.lr_batch_size", self.lr_batch_size)


@dataclass
class ScheduleConfig:
    name: str = "steplr"  # steplr | cosine | constant: a function of the epoch, as in the guide
    step_size: int = 30  # StepLR: epochs between decays
    gamma: float = 0.1  # StepLR: decay factor
    # Linear warm-up from warmup_start_factor x lr over this many epochs, then the schedule above over the
    # epochs left. It restarts where the backbone is unfrozen (finetune.freeze_epochs).
    warmup_epochs: int = 0
    warmup_start_factor: float = 0.1
    # true (the torchvision references' and timm's default): the warm-up rises every step; false: once
    # per epoch (epoch k of the warm-up at start_factor + (1 - start_factor) x k / warmup_epochs).
    warmup_per_step: bool = True
    min_lr: float = 0.0  # cosine floor (scaled with each parameter group's multiplier)

    def __post_init__(self) -> None:
        _check_positive("schedule.step_size", self.step_size)
        _check_positive("schedule.warmup_epochs", self.warmup_epochs, allow_zero=True)
        if not 0 < self.warmup_start_factor <= 1:
            raise ValueError(f"schedule.warmup_start_factor={self.warmup_start_factor} must be in (0, 1]")


@dataclass
class FinetuneConfig:
    """Which parameters train when, at what rate. The registry says which are the head (the layers that
    output the classes), the auxiliary heads (Inception's AuxLogits, GoogLeNet's aux1/aux2) and the body."""

    # Epochs that train the head alone, the body and auxiliary heads frozen: no gradient is computed for
    # them, and the frozen part runs in eval mode (BatchNorm keeps and uses its running statistics, dropout
    # is off). The whole model trains after them. epochs <= freeze_epochs: a linear probe.
    freeze_epochs: int = 0
    # Head-only epochs on the body's pooled features, computed once per image (no augmentation: the eval
    # view) and cached beside the data, instead of images through the frozen body every epoch.
    # auto: whenever there are head-only epochs and the model's head can be split off exactly.
    feature_cache: Any = "auto"  # auto | true | false
    # The body's rate as a multiple of optim.lr once unfrozen (fastai's slice); 0: the body stays frozen for
    # the whole run, as in head-only epochs (eval mode, BatchNorm statistics kept).
    body_lr_mult: float = 1.0
    # BatchNorm while the body trains: train (batch statistics, running statistics updated) | frozen (running
    # statistics used and kept, eval mode; scale and shift still train: detection's FrozenBatchNorm2d for
    # small batches) | auto: frozen when the run starts from trained weights, train from random init (whose
    # running statistics describe nothing yet). A frozen body always keeps its statistics (engine/batchnorm.py).
    # train stays the default: measured on real Inception weights (10 tiny-imagenet classes, head 2 epochs
    # then the whole model at lr 0.01, 1 seed each) train ended at 0.910, frozen at 0.755 (benchmarks/transfer_real.py).
    bn: str = "train"
    # Layer-wise rate decay (timm's --layer-decay): the body's layers, counted from the head, get
    # lr x layer_decay^k (k = 1 for the last layer before the head); null: one rate for the body.
    layer_decay: Optional[float] = None

    def __post_init__(self) -> None:
        _check_positive("finetune.freeze_epochs", self.freeze_epochs, allow_zero=True)
        self.feature_cache = _auto_or_bool("finetune.feature_cache", self.feature_cache)
        _check_positive("finetune.body_lr_mult", self.body_lr_mult, allow_zero=True)
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            raise ValueError(f"finetune.layer_decay={self.layer_decay} must be in (0, 1]")


@dataclass
class EmaConfig:
    """An exponential moving average of the weights (torch.optim.swa_utils.AveragedModel, timm's
    ModelEmaV3 decay and warm-up). When on, it is what the run keeps: val_* metrics, best.pt's and
    model.pt's weights for inference, export and serve are the average's; val_raw_* beside them are
    the trained weights'. Checkpoints hold both."""

    decay: Optional[float] = None  # null: off; e.g. 0.9998 (timm's train.py default)
    # Warm-up (timm's use_warmup): update k (from 1) uses min(decay, 1 - (1 + (k - 1) / warmup_gamma)^-warmup_power),
    # 0 for the first (a copy), so the average is not dominated by the random start in short runs (engine/ema.py).
    warmup: bool = True
    warmup_gamma: float = 1.0
    warmup_power: float = 0.75  # timm: 3/4 for runs under ~1M steps (0.999 after 10k updates)
    buffers: str = "average"  # average (timm's default: BatchNorm statistics follow the average) | copy

    def __post_init__(self) -> None:
        if self.decay is not None and not 0 < self.decay < 1:
            raise ValueError(f"ema.decay={self.decay} must be in (0, 1)")
        _check_positive("ema.warmup_gamma", self.warmup_gamma)
        _check_positive("ema.warmup_power", self.warmup_power)
        _check_choice("ema.buffers", self.buffers, EMA_BUFFERS)

    @property
    def enabled(self) -> bool:
        return self.decay is not None


@dataclass
class Recipe:
    name: str = "unnamed"
    description: str = ""
    task: str = "multiclass"  # fixes the loss, the prediction rule and the metrics
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)

    def __post_init__(self) -> None:
        crop = self.data.train_crop_size
        if self.model.aux_loss_weight is not None and crop is not None and crop < 299:
            # Inception's aux head pools 5x5/3 over Mixed_6e then applies a 5x5 conv: Mixed_6e must be
            # 17x17, which it is only from 299 px up (measured: 298 px fails).
            raise ValueError(
                f"model.aux_loss_weight needs data.train_crop_size >= 299, got {crop}"
            )


def _check_class_weights(value: Any) -> None:
    if value is None or value == "auto":
        return
    if not isinstance(value, (list, tuple)) or not value or any(
            isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0 for w in value):
        raise ValueError(f"train.class_weights={value!r} must be null, auto or a list of weights >= 0 (one per class)")


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: recipe not found (list them with `inceptionlab recipes`)") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}:{where} is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a recipe must be a mapping of sections, got {type(data).__name__}")
    return data


def _load_layers(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[Path, dict[str, Any]]]:
    """The chain of YAML mappings from the root base down to `path`, base first."""
    path = path.resolve()
    if path in seen:
        raise UserError(f"{path}: `base:` inheritance loops back to itself")
    data = _read_yaml(path)
    base = data.pop("base", None)
    if base is None:
        return [(path, data)]
    return _load_layers((path.parent / base), seen + (path,)) + [(path, data)]


def resolve_recipe_path(name_or_path: str | Path) -> Path:
    """A path to a YAML file, or a recipe name like `inception_v3/tiny_imagenet`."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    candidate = RECIPES_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    raise UserError(f"{name_or_path}: no such recipe file or name (list them with `inceptionlab recipes`)")


def _merge(where: Path | str, cfg: Any, layer: Any) -> Any:
    try:
        return OmegaConf.merge(cfg, layer)
    except OmegaConfBaseException as exc:
        raise UserError(f"{where}: {_describe(exc)}") from None


def _describe(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None) or ""
    msg = str(exc).splitlines()[0]
    if "not in" in msg and key:
        return f"unknown key `{key}` (check the spelling; `inceptionlab recipes --show NAME` prints every key)"
    return f"`{key}`: {msg}" if key else msg


def _apply_override(cfg: Any, item: str) -> Any:
    """`key=value` merged into `cfg`; a mapping value replaces the mapping there (`model.kwargs={}`
    clears it), where a merge would only add keys."""
    if "=" not in item:
        raise UserError(f"--set {item!r}: expected key=value, e.g. --set optim.lr=0.01")
    layer = OmegaConf.from_dotlist([item])
    key = item.split("=", 1)[0].strip()
    value = OmegaConf.select(layer, key)
    if isinstance(value, DictConfig) and OmegaConf.select(cfg, key, default=None) is not None:
        try:
            OmegaConf.update(cfg, key, OmegaConf.to_container(value), merge=False)
        except OmegaConfBaseException as exc:
            raise UserError(f"--set {item}: {_describe(exc)}") from None
        return cfg
    return _merge(f"--set {item}", cfg, layer)


def load_recipe(name_or_path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Read a recipe (with its `base:` chain), apply `key=value` overrides, validate, return it."""
    path = resolve_recipe_path(name_or_path)
    cfg = OmegaConf.structured(Recipe)
    for layer_path, layer in _load_layers(path):
        cfg = _merge(layer_path, cfg, layer)
    for item in overrides:
        cfg = _apply_override(cfg, item)
    try:
        return OmegaConf.to_object(cfg)
    except ValueError as exc:  # the dataclasses' own checks: "<key>=<value> must be ..."
        raise UserError(f"{blame(path, overrides, str(exc).split('=', 1)[0])}: {exc}") from None
    except OmegaConfBaseException as exc:
        raise UserError(f"{blame(path, overrides, getattr(exc, 'full_key', None) or '')}: {_describe(exc)}") from None


def blame(path: Path | str, overrides: list[str] | tuple[str, ...], key: str | tuple[str, ...]) -> str:
    """Where a bad value of `key` came from: the last `--set KEY=...` that set it, else the recipe file.
    Several keys (values that conflict): the last --set that gave any of them."""
    keys = (key,) if isinstance(key, str) else key
    for item in reversed(overrides):
        if item.split("=", 1)[0].strip() in keys:
            return f"--set {item}"
    return str(path)


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(recipe), resolve=True)


def recipe_to_yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe_to_dict(recipe), sort_keys=False)


def list_recipes() -> list[tuple[str, str]]:
    """(name, description) for every recipe file shipped in recipes/."""
    rows = []
    for path in sorted(RECIPES_DIR.rglob("*.yaml")):
        name = path.relative_to(RECIPES_DIR).with_suffix("").as_posix()
        rows.append((name, load_recipe(path).description))
    return rows
