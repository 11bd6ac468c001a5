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

Features are cached beside the decoded image cache (`<data>/.inceptionlab-cache/features/`, or the
user cache when the data folder is read-only; in-memory datasets: `$INCEPTIONLAB_CACHE/features/`),
keyed by everything they depend on: the architecture and its builder arguments, the body's weights
(sha256 of every tensor outside the head), the preprocessing, the split's files (path, size, mtime)
or array bytes, the precision and memory format.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from inceptionlab import hardware
from inceptionlab.data.loading.decoded_cache import cache_paths
from inceptionlab.data.loading.image_options import image_folder_of
from inceptionlab.data.splits import ArraySplit
from inceptionlab.engine.task import main_logits
from inceptionlab.fileio import atomic_torch_save
from inceptionlab.runtime import autocast

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
    captured: list[torch.Tensor] = []
    hook = head.register_forward_pre_hook(lambda module, args: captured.append(args[0].detach()))
    model.eval()
    try:
        logits = main_logits(model(example)).float()
    finally:
        hook.remove()
    if len(captured) != 1:
        return False
    again = head(captured[0]).float()
    return again.shape == logits.shape and torch.allclose(again, logits, rtol=1e-4, atol=1e-5)


@torch.inference_mode()
def extract(model: nn.Module, head: nn.Module, loader: Any, prepare: Callable[[torch.Tensor], torch.Tensor],
            device: torch.device, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, targets) of every batch of `loader`: what enters `head` in `model`'s eval forward."""
    captured: list[torch.Tensor] = []
    hook = head.register_forward_pre_hook(lambda module, args: captured.append(args[0].detach().float().cpu()))
    model.eval()
    targets = []
    try:
        for inputs, batch_targets in loader:
            with autocast(device, precision):
                model(prepare(inputs.to(device, non_blocking=True)))
            targets.append(batch_targets.cpu())
    finally:
        hook.remove()
    return torch.cat([c.reshape(c.shape[0], -1) for c in captured]), torch.cat(targets)


def load_or_extract(key: str, folder: Path, compute: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                    class_names: list[str]) -> tuple[ArraySplit, bool, int]:
    """(features, loaded from the cache?, images computed) for one split."""
    path = folder / f"{key}.pt"
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
