"""Test-time augmentation: views of a model-input batch, and their logits merged back into one per image.

A view is a function of the model's input alone (the normalised NCHW batch the spec's preprocessing
makes), so every path applies it the same way after its own preprocessing: evaluate and predict on
the device before the model, serve around whichever runtime runs the model. Flips and crops commute
with the per-channel normalisation (bilinear resampling weights sum to 1), so views of a normalised
batch equal the normalised views of the pixels.

    none        the image as preprocessed (1 view)
    flip        it and its mirror image (2 views)
    crops       it and its four corner crops, each CROP_FRACTION of the side, resized back up to the
                input size (5 views): the guide's centre crop keeps 299/342 = 0.874 of the resized
                image; these take the same share of the eval crop, at its corners
    flip-crops  those five and their mirror images (10 views)

The model's logits over the views are averaged (torchvision's ten-crop recipe averages the outputs
too); a temperature is then fitted to, and a threshold chosen on, those averaged logits.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.nn import functional as F

TTA_VIEWS: dict[str, int] = {"none": 1, "flip": 2, "crops": 5, "flip-crops": 10}
CROP_FRACTION = 0.875


def views_of(mode: str) -> int:
    """How many model inputs one image becomes under `mode`."""
    try:
        return TTA_VIEWS[mode]
    except KeyError:
        raise ValueError(f"test-time augmentation {mode!r} is not one of {', '.join(TTA_VIEWS)}") from None


def corner_crops(batch: torch.Tensor, fraction: float = CROP_FRACTION) -> list[torch.Tensor]:
    """Top-left, top-right, bottom-left and bottom-right crops of `fraction` of each side, each resized
    back to the batch's height and width (bilinear, as the eval resize)."""
    height, width = batch.shape[-2:]
    ch, cw = max(1, round(height * fraction)), max(1, round(width * fraction))
    corners = [(0, 0), (0, width - cw), (height - ch, 0), (height - ch, width - cw)]
    return [F.interpolate(batch[..., y:y + ch, x:x + cw].float(), size=(height, width), mode="bilinear",
                          align_corners=False, antialias=False) for y, x in corners]


def iter_views(batch: torch.Tensor, mode: str) -> Iterator[torch.Tensor]:
    """The views of (N, C, H, W) one at a time, each (N, C, H, W): a model runs one view per call, so
    TTA needs no more memory than a plain batch. View 0 is the batch itself (what an evaluation
    without augmentation sees), then the corner crops, then the mirror images of those before."""
    views_of(mode)
    base = [batch] if mode in ("none", "flip") else [batch, *corner_crops(batch)]
    yield from base
    if mode in ("flip", "flip-crops"):
        yield from (view.flip(-1) for view in base)


def tta_views(batch: torch.Tensor, mode: str) -> torch.Tensor:
    """All views stacked view-major, (V * N, C, H, W): view v of image i is row v * N + i."""
    views = list(iter_views(batch, mode))
    return views[0] if len(views) == 1 else torch.cat([v.float() for v in views])


def merge_views(logits: torch.Tensor, views: int) -> torch.Tensor:
    """(V * N, K) view-major logits -> (N, K), their mean over the views."""
    if views == 1:
        return logits
    return logits.reshape(views, -1, *logits.shape[1:]).mean(dim=0)
