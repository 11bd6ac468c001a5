"""timm as a model source: `model.name=timm/<name>` builds any timm model (the optional `timm` extra).

What timm knows about its weights becomes the run's: the pretrained config's mean, std, interpolation, input
size and crop_pct are the preprocessing a recipe's empty fields take (`preprocessing`); the classifier
`get_classifier()` names is the head, and `group_matcher()`'s groups are the body's layers for freezing and
layer-wise rates (models/parts.py). Pretrained weights (`model.weights=imagenet`) come from the Hugging Face
cache timm reads; when they are not there, the download is said before it is tried (and refused offline with
the fix); or from a file (`model.weights=PATH`, e.g. a converted one: models/real_weights.py).
"""

from __future__ import annotations

import difflib
import logging
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from inceptionlab.errors import UserError
from inceptionlab.models.spec import Preprocessing

PREFIX = "timm/"
log = logging.getLogger(__name__)


def is_timm(name: str) -> bool:
    return name.startswith(PREFIX)


def _timm() -> Any:
    try:
        import timm  # the optional extra, imported only for timm/ models (~0.6 s)
    except ImportError:
        raise UserError("model.name=timm/...: timm is not installed: pip install 'inceptionlab[timm]'") from None
    return timm


def timm_name(name: str) -> str:
    return name[len(PREFIX):]


def check_known(name: str) -> None:
    timm = _timm()
    inner = timm_name(name)
    if not timm.is_model(inner):
        close = difflib.get_close_matches(inner, timm.list_models(), n=5, cutoff=0.7)
        raise UserError(f"unknown model {name!r}: no timm model {inner!r}"
                        + (f" (close: {', '.join(PREFIX + c for c in close)})" if close else "")
                        + "; timm.list_models() lists them")


def create(name: str, num_classes: int, **kwargs: Any) -> nn.Module:
    """A timm model with `num_classes` outputs and random weights (weights are fitted by the registry)."""
    return _timm().create_model(timm_name(name), pretrained=False, num_classes=num_classes, **kwargs)


def pretrained_cfg(name: str) -> Any:
    cfg = _timm().models.get_pretrained_cfg(timm_name(name))
    if cfg is None:
        raise UserError(f"{name}: timm has no pretrained config for it (no default preprocessing, no weights)")
    return cfg


def preprocessing(name: str) -> Preprocessing:
    """The eval preprocessing of the model's pretrained config, as timm's own transforms apply it: the shorter
    side resized to floor(crop / crop_pct), then a centre crop (tf_efficientnet_lite0: 256 -> 224 bicubic)."""
    cfg = pretrained_cfg(name)
    crop = int(cfg.input_size[-1])
    return Preprocessing(resize_size=int(math.floor(crop / (cfg.crop_pct or 0.875))), crop_size=crop,
                         interpolation=str(cfg.interpolation or "bilinear"), mean=tuple(cfg.mean), std=tuple(cfg.std))


def class_names(name: str) -> tuple[list[str], list[str]] | None:
    """(WordNet ids, descriptions) of the pretrained head's rows, when they are ImageNet's; else None. For
    ImageNet-1k the registry shows torchvision's shorter labels ("Samoyed", not "Samoyed, Samoyede")."""
    timm = _timm()
    cfg = pretrained_cfg(name)
    subset = {1000: "imagenet-1k", 11821: "imagenet-12k", 21841: "imagenet-22k"}.get(int(cfg.num_classes or 0))
    if subset is None:
        return None
    info = timm.data.ImageNetInfo(subset)
    return list(info.label_names()), list(info.label_descriptions())


def _cached_file(cfg: Any) -> Path | None:
    """The pretrained file in the Hugging Face cache, without reaching the network."""
    if not cfg.hf_hub_id:
        return None
    from huggingface_hub import constants, try_to_load_from_cache  # timm's own dependency

    repo = cfg.hf_hub_id.split("@")[0]
    for filename in (cfg.hf_hub_filename, "model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin"):
        if filename:
            found = try_to_load_from_cache(repo, filename, cache_dir=constants.HF_HUB_CACHE)
            if isinstance(found, str):
                return Path(found)
    return None


def is_cached(name: str) -> bool:
    return cached_file(name) is not None


def cached_file(name: str) -> Path | None:
    """The model's pretrained file in the Hugging Face cache (None: not downloaded)."""
    return _cached_file(pretrained_cfg(name))


def pretrained_state(name: str) -> dict[str, torch.Tensor]:
    """The pretrained weights (timm's own filtering applied): from the cache; when absent, downloaded by
    timm after saying so."""
    timm = _timm()
    cfg = pretrained_cfg(name)
    cached = _cached_file(cfg)
    overlay = {"file": str(cached)} if cached is not None else None
    if cached is None:
        log.warning(f"{name} pretrained weights ({cfg.hf_hub_id or cfg.url}) are not in the Hugging Face cache: "
                    "downloading them")
    try:
        model = timm.create_model(timm_name(name), pretrained=True, pretrained_cfg_overlay=overlay)
    except Exception as exc:  # any network or file error: the fix is the same
        raise UserError(f"{name} pretrained weights not found and not downloadable ({type(exc).__name__}): run once "
                        f"with network to fill the Hugging Face cache, or give a file: --set model.weights=PATH "
                        "(train) / --weights PATH") from None
    return model.state_dict()


def classifier_name(model: nn.Module) -> str | None:
    """The name of the module timm's `get_classifier()` returns (None: not a timm model, or no head)."""
    get = getattr(model, "get_classifier", None)
    if get is None or getattr(model, "group_matcher", None) is None:
        return None
    head = get()
    if isinstance(head, nn.Identity):
        return None
    return next((n for n, m in model.named_modules() if m is head and n), None)


def parameter_groups(model: nn.Module) -> list[list[str]] | None:
    """timm's layer groups (`group_matcher(coarse=False)`), input side first; None for other models."""
    if classifier_name(model) is None:
        return None
    from timm.models import group_parameters  # only models timm built reach here

    groups = group_parameters(model, model.group_matcher(coarse=False))
    return [list(groups[key]) for key in sorted(groups)]
