"""The frozen-backbone fast path: the body's pooled features computed once, the head trained on them.

While the body is frozen (finetune.freeze_epochs) it runs in eval mode, so it maps an image to the same
features every epoch; only augmentation would change them. This path feeds each training and
validation image once, in the eval view (the spec's resize and centre crop, no augmentation), through
the model, keeps what enters the head (a forward pre-hook on the head layer: after pooling, flattening
and the body's eval-mode dropout), and trains the head on those vectors: on a CPU an Inception v3
linear probe costs about one forward pass over the data instead of one per epoch.

The path is exact or not taken: on a probe input, the head applied to the captured features must give
the model's own logits (it does not for a model whose output layer feeds more layers: SqueezeNet's
ReLU and pooling), else the run says so and trains the head through the frozen body.

This module holds the whole wiring: the exactness check, the extraction through the session's eval
view of each split, the cache, and the loaders that serve the vectors; `engine/finetune.py` only
decides which epochs use it.

Features are cached beside the decoded image cache (`<data>/.inceptionlab-cache/features/`, or the
user cache when the data folder is read-only; in-memory datasets: `$INCEPTIONLAB_CACHE/features/`),
keyed by everything they depend on: the architecture and its builder arguments, the body's weights
(sha256 of every tensor outside the head), the preprocessing, the split's files (path, size, mtime)
or array bytes, the precision and memory format.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn
from torch.utils.data import Subset
from tqdm import tqdm

from inceptionlab import hardware
from inceptionlab.data.loading.decoded_cache import cache_paths, one_at_a_time
from inceptionlab.data.loading.image_options import image_folder_of
from inceptionlab.data.loading.loaders import make_loader
from inceptionlab.data.loading.sampler import draw_weights
from inceptionlab.data.splits import ArraySplit
from inceptionlab.engine.loop import StepSettings
from inceptionlab.engine.task import main_logits
from inceptionlab.fileio import atomic_torch_save
from inceptionlab.models.penultimate import captured
from inceptionlab.runtime import autocast

if TYPE_CHECKING:
    from inceptionlab.config import Recipe
    from inceptionlab.engine.session import TrainingSession

FEATURES_VERSION = 1


@dataclass
class Features:
    train: ArraySplit  # float features (N, D) and targets
    val: ArraySplit
    seconds: float  # what computing (or loading) them took
    images: int  # images pushed through the body (0 when loaded from the cache)
    cached: Path | None  # where they are kept
    loaded: bool  # True: read from the cache, not computed


def body_digest(model: nn.Module, head: str) -> str:
    """sha256 over every tensor of the state_dict outside the head (names, shapes, bytes)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if name.startswith(head + "."):
            continue
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest.hexdigest()


def split_identity(dataset: Any) -> str:
    """What a split's features depend on besides the model: its files (path, size, mtime) or array bytes."""
    digest = hashlib.sha256()
    if isinstance(dataset, ArraySplit):
        digest.update(dataset.inputs.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        digest.update(dataset.targets.numpy().tobytes())
        return digest.hexdigest()
    found = image_folder_of(dataset)
    if found is None:
        raise TypeError(f"no feature cache key for a {type(dataset).__name__}")
    folder, indices = found
    for index in indices:
        path, target = folder.samples[index]
        stat = os.stat(path)
        digest.update(f"{path}\0{target}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def cache_folder(dataset: Any) -> Path:
    """Beside the decoded image cache for image folders; the user cache for in-memory datasets."""
    found = None if isinstance(dataset, ArraySplit) else image_folder_of(dataset)
    if found is not None:
        folder = cache_paths(Path(found[0].root), 0)[0].parent / "features"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                return folder
        except OSError:
            pass
    return hardware.cache_root() / "features"


def feature_key(parts: dict[str, Any], dataset: Any) -> str:
    text = json.dumps({**parts, "split": split_identity(dataset), "version": FEATURES_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@torch.inference_mode()
def head_is_exact(model: nn.Module, head: nn.Module, example: torch.Tensor) -> bool:
    """True when `head` applied to what enters it gives `model`'s own (eval-mode) output for `example`."""
    model.eval()
    with captured(head, flat=False) as taken:
        logits = main_logits(model(example)).float()
    if len(taken) != 1:
        return False
    again = head(taken[0]).float()
    return again.shape == logits.shape and torch.allclose(again, logits, rtol=1e-4, atol=1e-5)


@torch.inference_mode()
def extract(model: nn.Module, head: nn.Module, loader: Any, prepare: Callable[[torch.Tensor], torch.Tensor],
            device: torch.device, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, targets) of every batch of `loader`: what enters `head` in `model`'s eval forward
    (models/penultimate.py's hook, the one every reader of features uses)."""
    model.eval()
    targets = []
    with captured(head, to_cpu=True) as taken:
        for inputs, batch_targets in loader:
            with autocast(device, precision):
                model(prepare(inputs.to(device, non_blocking=True)))
            targets.append(batch_targets.cpu())
    return (torch.cat(taken) if taken else torch.zeros(0, 0)), (torch.cat(targets) if targets else torch.zeros(0))


def load_or_extract(key: str, folder: Path, compute: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                    class_names: list[str]) -> tuple[ArraySplit, bool, int]:
    """(features, loaded from the cache?, images computed) for one split, under the split's lock: of the
    processes that ask at once, one computes and saves, the others wait and load (decoded_cache's pattern)."""
    path = folder / f"{key}.pt"
    with one_at_a_time(path):
        if path.is_file():
            try:
                payload = torch.load(path, map_location="cpu", weights_only=True)
                if payload.get("key") == key:
                    return ArraySplit(payload["features"], payload["targets"], class_names), True, 0
            except Exception:  # noqa: BLE001 - a damaged cache is recomputed, never trusted
                pass
        features, targets = compute()
        try:
            atomic_torch_save({"key": key, "features": features, "targets": targets}, path)
        except OSError:  # a read-only cache: compute again next time
            pass
        return ArraySplit(features, targets, class_names), False, len(targets)


def timed(function: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


# --------------------------------------------------------------------------- a session's features


def exact_head(s: TrainingSession) -> str | None:
    """The session's head module, when the head applied to what enters it gives the model's own output (the
    same answer on every rank: the probe input is the same everywhere); None when it does not."""
    head_name = s.parts.head_modules[0]
    return head_name if head_is_exact(s.model, s.model.get_submodule(head_name), probe_input(s)) else None


def allowed(recipe: Recipe) -> bool:
    """Whether the head-only epochs may train on cached features: finetune.feature_cache is not false, and
    under auto no augmentation was asked for (the cache holds one unaugmented view of each image and its
    step never mixes; =true with augmentation is refused by engine/choices)."""
    wanted = recipe.finetune.feature_cache
    return wanted is True or (wanted == "auto" and not recipe.augment.on())


def augmented_line(recipe: Recipe) -> str:
    return (f"features: not cached: {', '.join(recipe.augment.on())} changes each training image every epoch, and "
            "the cache holds one unaugmented view; the head trains through the frozen body")


def not_used_line(s: TrainingSession) -> str:
    return (f"features: not used ({s.parts.head_modules[0]} of {s.recipe.model.name} does not make the model's "
            "output from what enters it): the head trains through the frozen body")


def feature_settings(s: TrainingSession) -> StepSettings:
    """The step's settings on feature vectors: nothing to prepare, and no MixUp/CutMix (they mix images; the
    head trains on the eval view's features without per-image augmentation too), no micro-batching."""
    return replace(s.settings, prepare=_identity, micro_batch=None, mix=None)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def probe_input(s: TrainingSession) -> torch.Tensor:
    """Two inputs of the model's shape from a private generator (the run's RNG stream is untouched)."""
    generator = torch.Generator().manual_seed(0)
    if s.spec.input_kind == "tokens":
        return torch.randint(0, 2, (2, *s.spec.input_shape), generator=generator).to(s.device)
    return torch.randn(2, *s.spec.input_shape, generator=generator).to(s.device)


def feature_loaders(s: TrainingSession, features: Features) -> tuple[Any, Any]:
    """Loaders of the cached vectors, as the session's image loaders serve images. The sampler's weights are
    those of the rows there are: an unreadable file has no features (nor a place in the image loaders)."""
    common = dict(seed=s.recipe.train.seed, num_workers=0, rank=s.dist.rank, world_size=s.dist.world_size,
                  device=s.device, mode="resident")
    weights = draw_weights(s.recipe.data.sampler, features.train.targets, s.spec.num_classes,
                           s.recipe.data.balance_power)
    train = make_loader(features.train, batch_size=s.recipe.train.batch_size, train=True, weights=weights, **common)
    val = make_loader(features.val, batch_size=s.recipe.train.eval_batch_size or 2 * s.recipe.train.batch_size,
                      train=False, **common)
    return train, val


def compute_features(s: TrainingSession, head_name: str) -> Features:
    """Both splits' features: from the cache, or computed. Under torchrun the ranks take turns on a lock
    beside each split's file (load_or_extract): the first extracts and saves, the others wait there and
    load it, with no collective to time out however long the extraction takes."""
    head = s.model.get_submodule(head_name)
    key_parts = {"arch": s.spec.arch, "arch_kwargs": s.spec.arch_kwargs, "head": head_name,
                 "body": body_digest(s.model, head_name),
                 "preprocessing": [s.spec.resize_size, s.spec.crop_size, s.spec.interpolation, s.spec.mean,
                                   s.spec.std, s.spec.channels, s.recipe.data.cache_size, s.recipe.data.loader],
                 "precision": s.recipe.train.precision, "channels_last": bool(s.recipe.train.channels_last)}
    start_rng = torch.random.get_rng_state()
    splits, seconds, images, loaded, where = {}, 0.0, 0, True, None
    for name, dataset in (("train", s.train_set), ("val", s.val_set)):
        key = feature_key({**key_parts, "split": name}, dataset)
        folder = cache_folder(dataset)
        where = folder
        compute = _extractor(s, head, dataset)
        (split, was_cached, count), took = timed(
            functools.partial(load_or_extract, key, folder, compute, list(s.spec.class_names)))
        splits[name] = split
        seconds, images, loaded = seconds + took, images + count, loaded and was_cached
    torch.random.set_rng_state(start_rng)  # the eval loaders draw nothing, but keep the run's stream exact
    return Features(splits["train"], splits["val"], seconds, images, where, loaded)


def _extractor(s: TrainingSession, head: nn.Module, dataset: Any) -> Callable[[], Any]:
    def compute() -> tuple[torch.Tensor, torch.Tensor]:
        loader = make_loader(_eval_view(dataset, s), batch_size=s.recipe.train.eval_batch_size or
                             2 * s.recipe.train.batch_size, train=False, seed=s.recipe.train.seed,
                             num_workers=s.recipe.data.num_workers, device=s.device, mode=s.recipe.data.loader,
                             images=s.image_options)
        prepare = s.settings.prepare
        return extract(s.model, head, _progress(loader, s), prepare, s.device, s.recipe.train.precision)

    return compute


def _progress(loader: Any, s: TrainingSession) -> Any:
    """Batches with a progress bar on rank 0 when a terminal shows it."""
    # disable=None: no bar where stderr is not a terminal (logs, tests), as the run's own bars.
    return tqdm(loader, total=len(loader), desc="features", disable=None if s.dist.is_main else True, leave=False,
                unit="batch")


def _eval_view(dataset: Any, s: TrainingSession) -> Any:
    """The split with the eval transform (the worker path applies a dataset's own transform)."""
    if isinstance(dataset, Subset):
        inner = copy.copy(dataset.dataset)
        inner.transform = s.val_set_transform
        return Subset(inner, dataset.indices)
    if hasattr(dataset, "transform"):
        view = copy.copy(dataset)
        view.transform = s.val_set_transform
        return view
    return dataset


def describe_cost(features: Features, head_epochs: int) -> str:
    """The features line: where they came from, and what they save, once and in all: each head-only epoch
    would pass both splits through the frozen body; computing the features is one such pass (so one
    head-only epoch saves nothing), reading them from the cache is none."""
    epochs = "the head-only epoch trains" if head_epochs == 1 else f"the {head_epochs} head-only epochs train"
    saved = head_epochs if features.loaded else head_epochs - 1
    passes = f"{saved} pass{'es' if saved > 1 else ''} of the frozen body over both splits"
    if features.loaded:
        return (f"features: {len(features.train):,} train + {len(features.val):,} val vectors of "
                f"{features.train.inputs.shape[1]} read from {features.cached} in {features.seconds:.1f} s; "
                f"{epochs} on them, which saves {passes}")
    rate = features.images / max(features.seconds, 1e-9)
    line = (f"features: {features.images:,} images through the frozen body once in {features.seconds:.1f} s "
            f"({rate:.0f} img/s), cached in {features.cached}; {epochs} on them")
    if saved < 1:
        return line
    seconds = saved * (len(features.train) + len(features.val)) / max(rate, 1e-9)
    return f"{line}, which saves {passes} (about {seconds:.0f} s in all at this rate)"


def describe_range_test(features: Features) -> str:
    """lr-find's features line: the head's range test steps on them, and a run's head-only epochs read them."""
    where = (f"read from {features.cached} in {features.seconds:.1f} s" if features.loaded else
             f"{features.images:,} images through the frozen body once in {features.seconds:.1f} s, cached in "
             f"{features.cached}")
    return (f"features: {where}; the head's range test steps on them, and the head-only epochs of a run with "
            "these weights and settings read them from there")
