"""Augmentation on the device, one batched call per step: RandomResizedCrop + flip, eval resize + crop.

Why: the guide's path crops each image in a worker process with PIL (365-445 img/s on a 2-core
AMD EPYC); here a whole uint8 batch is resampled with per-sample interpolation matrices that encode
the crop box, the scale and the flip: one batched matmul along the width, then, on a CPU, a weighted
sum of each output row's two source rows (`banded_matmul`) along the height. `DeviceAugment` for
64 px -> 299 px, batch 64, fp32, channels_last, on an AMD EPYC capped to AVX2 (2 cores, three runs
in one process each): two dense matmuls 1,160-1,190 img/s; with the heap keeping freed blocks
(host.keep_freed_memory) 2,750-2,770; with the banded second stage too, 4,670-4,790.
`affine_grid` + `grid_sample` measured 510-595 img/s (DESIGN.md point 11).

Semantics are torchvision's, and tests/test_device_aug.py checks them:
- `sample_crop_params` draws boxes from `RandomResizedCrop.get_params`'s distribution (area scale
  and log-ratio uniform, up to 10 attempts, first success, the same central-crop fallback);
- `resample` equals `resized_crop(..., bilinear, antialias=False)` on uint8 tensors (align_corners
  False, sampling clamped to the crop box) within one uint8 level; when a box is larger than the
  output (downscaling) the weights become torchvision's antialiased triangle filter, as
  `antialias=True` does in the worker path;
- the recipe's `data.interpolation` is honoured as torchvision resizes uint8 tensors (the worker
  path's transforms and `evaluate`'s): bicubic is its antialiased bicubic, nearest torch's nearest,
  both checked against torchvision.

Sources may differ in size: they are stored top-left in a padded (N, C, S, S) tensor with their
true heights and widths; boxes never leave the true image, so padding never gets any weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from inceptionlab.data.transforms.device_ops import to_device

MAX_ATTEMPTS = 10  # torchvision's RandomResizedCrop.get_params tries 10 boxes before its fallback
DEFAULT_RATIO = (3.0 / 4.0, 4.0 / 3.0)


@dataclass(frozen=True)
class Boxes:
    """Per-sample crop boxes in source pixels: top, left, height, width (int64, shape (N,))."""

    top: torch.Tensor
    left: torch.Tensor
    height: torch.Tensor
    width: torch.Tensor


def sample_crop_params(
    generator: torch.Generator,
    heights: torch.Tensor,
    widths: torch.Tensor,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = DEFAULT_RATIO,
) -> Boxes:
    """RandomResizedCrop.get_params for a batch of images of sizes (heights[n], widths[n]).

    All 10 attempts are drawn at once; each sample keeps its first box that fits, exactly as the
    loop in torchvision returns on its first success. Samples with no fitting box get the central
    crop clamped to the ratio range. Sizes are rounded like Python's round() (half to even).
    """
    device = heights.device
    n = heights.shape[0]
    h_src, w_src = heights.to(torch.float64), widths.to(torch.float64)
    area = (h_src * w_src)[:, None]
    uniform = lambda: torch.rand(n, MAX_ATTEMPTS, generator=generator, device=device, dtype=torch.float64)  # noqa: E731
    target_area = area * (scale[0] + (scale[1] - scale[0]) * uniform())
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * uniform())
    w = torch.round(torch.sqrt(target_area * aspect))
    h = torch.round(torch.sqrt(target_area / aspect))
    fits = (w > 0) & (w <= w_src[:, None]) & (h > 0) & (h <= h_src[:, None])
    first = fits.to(torch.int8).argmax(dim=1, keepdim=True)  # index of the first True (0 if none)
    found = fits.any(dim=1)
    h_pick, w_pick = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
    h_fb, w_fb = _central_fallback(h_src, w_src, ratio)
    h_box = torch.where(found, h_pick, h_fb).long()
    w_box = torch.where(found, w_pick, w_fb).long()
    # Position: uniform over the (H - h + 1) x (W - w + 1) placements, like torch.randint in the loop.
    pos = torch.rand(n, 2, generator=generator, device=device, dtype=torch.float64)
    top_rand = torch.floor(pos[:, 0] * (heights - h_box + 1)).long()
    left_rand = torch.floor(pos[:, 1] * (widths - w_box + 1)).long()
    top = torch.where(found, top_rand, torch.div(heights - h_box, 2, rounding_mode="floor"))
    left = torch.where(found, left_rand, torch.div(widths - w_box, 2, rounding_mode="floor"))
    return Boxes(top, left, h_box, w_box)


def _central_fallback(h_src: torch.Tensor, w_src: torch.Tensor, ratio: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's fallback: the whole image, narrowed to the nearest allowed aspect ratio."""
    in_ratio = w_src / h_src
    lo, hi = min(ratio), max(ratio)
    too_tall, too_wide = in_ratio < lo, in_ratio > hi
    w = torch.where(too_wide, torch.round(h_src * hi), w_src)
    h = torch.where(too_tall, torch.round(w_src / lo), h_src)
    return h, w


def center_crop_boxes(heights: torch.Tensor, widths: torch.Tensor, resize_size: int, crop_size: int) -> tuple[Boxes, torch.Tensor, torch.Tensor]:
    """Eval's Resize(shorter side -> resize_size) + CenterCrop(crop_size) as a box on the resized image.

    Returns (box on the resized image, resized heights, resized widths). Resized sizes follow
    torchvision: the longer side is int(resize_size * long / short) (truncated).
    """
    short = torch.minimum(heights, widths)
    long_ = torch.maximum(heights, widths)
    long_new = (resize_size * long_) // short  # int(size * long / short) for positive ints
    tall = heights >= widths
    new_h = torch.where(tall, long_new, torch.full_like(heights, resize_size))
    new_w = torch.where(tall, torch.full_like(widths, resize_size), long_new)
    new_h = torch.where(heights == widths, torch.full_like(heights, resize_size), new_h)
    new_w = torch.where(heights == widths, torch.full_like(widths, resize_size), new_w)
    # CenterCrop: top = int(round((H - crop) / 2.0)) (torchvision pads when crop > H; never here,
    # DataConfig checks resize_size >= crop_size).
    top = torch.round((new_h - crop_size).double() / 2).long()
    left = torch.round((new_w - crop_size).double() / 2).long()
    size = torch.full_like(heights, crop_size)
    return Boxes(top, left, size, size), new_h, new_w


def axis_weights(
    start: torch.Tensor,
    extent: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    out_size: int,
    src_size: int,
    antialias: bool,
    interpolation: str = "bilinear",
) -> torch.Tensor:
    """(N, out_size, src_size) interpolation weights along one axis, float32.

    Output pixel k samples source coordinate (k + offset + 0.5) * scale - 0.5 + start (PyTorch's
    align_corners=False), clamped to the box [start, start + extent - 1]: pixels outside the box
    (the rest of the image, the padding) get no weight. With `antialias` and scale > 1 the
    weights are the filter stretched `scale` pixels wide, normalised, as torchvision's antialias
    does. `interpolation`, as torchvision resizes uint8 tensors (the worker path and `evaluate`):
    bilinear (a triangle filter), bicubic (Keys' cubic with a = -0.5, torch's antialiased bicubic,
    always antialiased), nearest (torch's: source pixel floor(k x scale), in float32).
    """
    if interpolation not in FILTERS:
        raise ValueError(f"interpolation {interpolation!r} is not one of {', '.join(FILTERS)}")
    # Coordinates relative to the box start, so float32 keeps them to ~4e-6 px (boxes <= a few hundred
    # px); float64 over the whole (N, out, src) grid cost 70 ms of CPU per 64-image batch.
    k = torch.arange(out_size, device=start.device, dtype=torch.float64)
    if interpolation == "nearest":
        return _nearest_weights(k, start, extent, scale, offset, src_size)
    center = ((k[None, :] + offset.double()[:, None] + 0.5) * scale.double()[:, None]).float()[:, :, None]
    if (antialias or interpolation != "bilinear") and start.device.type == "cpu" and bool((scale <= 1).all()):
        return _upscale_weights(center, start, extent, src_size, interpolation)  # the check is free on a CPU
    return _dense_weights(center, start, extent, scale, src_size, antialias, interpolation)


def _triangle(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(1 - x.abs(), min=0)


def _keys_cubic(x: torch.Tensor, a: float = -0.5) -> torch.Tensor:
    """Keys' cubic convolution kernel; a = -0.5 is PIL's BICUBIC and torch's antialiased bicubic."""
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


# interpolation -> (filter of the distance in source pixels at scale 1, its radius in source pixels).
FILTERS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor] | None, int]] = {
    "nearest": (None, 0),
    "bilinear": (_triangle, 1),
    "bicubic": (_keys_cubic, 2),
}


def _dense_weights(center: torch.Tensor, start: torch.Tensor, extent: torch.Tensor, scale: torch.Tensor,
                   src_size: int, antialias: bool, interpolation: str = "bilinear") -> torch.Tensor:
    """`axis_weights` evaluated at every source pixel of every output pixel."""
    j = torch.arange(src_size, device=start.device, dtype=torch.float32)[None, None, :] - start.float()[:, None, None]
    extent = extent.float()[:, None, None]
    inside = (j >= 0) & (j < extent)
    if antialias or interpolation != "bilinear":
        kernel, _ = FILTERS[interpolation]
        support = torch.clamp(scale.float(), min=1.0)[:, None, None]
        weights = kernel((j + 0.5 - center) / support) * inside
        weights = weights / weights.sum(dim=2, keepdim=True)
    else:
        src = torch.minimum(torch.clamp(center - 0.5, min=0), extent - 1)
        weights = torch.clamp(1 - (j - src).abs(), min=0) * inside
    return weights


def _upscale_weights(center: torch.Tensor, start: torch.Tensor, extent: torch.Tensor, src_size: int,
                     interpolation: str = "bilinear") -> torch.Tensor:
    """`axis_weights` when every scale <= 1 (the filter keeps its own width): the dense values.

    A filter of radius r is non-zero on at most 2r source pixels around each centre, so it is
    evaluated on 2r + 1 candidates per output pixel and scattered into the zero matrix, instead of on
    all src_size of them: upscaling 64 px crops to 299 px, the bilinear weights of a 64-image batch
    took ~10 ms of CPU densely. The arithmetic per candidate is the dense one, and a row's sum adds
    only exact zeros besides its taps: bilinear weights (two taps) are identical bit for bit, bicubic
    ones (four taps, summed in another order) within float32 rounding.
    """
    kernel, radius = FILTERS[interpolation]
    base = torch.floor(center - 0.5).long()  # (N, out, 1): the tap left of the centre
    j = base + torch.arange(-radius, radius + 1, device=center.device)  # (N, out, 2r + 1) candidates, box-relative
    inside = (j >= 0) & (j < extent[:, None, None])
    weights = kernel((j.float() + 0.5 - center) / 1.0) * inside
    weights = weights / weights.sum(dim=2, keepdim=True)
    index = (j + start[:, None, None]).clamp(0, src_size - 1)  # taps outside the box carry weight 0
    dense = torch.zeros(center.shape[0], center.shape[1], src_size, dtype=weights.dtype, device=center.device)
    return dense.scatter_add_(2, index, weights)


def _nearest_weights(k: torch.Tensor, start: torch.Tensor, extent: torch.Tensor, scale: torch.Tensor,
                     offset: torch.Tensor, src_size: int) -> torch.Tensor:
    """Weight 1 on source pixel floor((k + offset) x scale) of the box, clamped to it: torch's nearest
    (`interpolate(mode="nearest")`, what torchvision's NEAREST does to tensors), in float32 as torch computes it."""
    position = (k[None, :] + offset.double()[:, None]).float() * scale.float()[:, None]
    tap = torch.minimum(torch.floor(position).long(), extent[:, None] - 1).clamp(min=0) + start[:, None]
    dense = torch.zeros(len(start), len(k), src_size, dtype=torch.float32, device=start.device)
    return dense.scatter_(2, tap.clamp(max=src_size - 1)[:, :, None], 1.0)


def stored(image: torch.Tensor) -> torch.Tensor:
    """How the image caches store an upright CHW image: a portrait (height > width) turned on its side."""
    return image.transpose(1, 2) if image.shape[1] > image.shape[2] else image


def upright(images: torch.Tensor, heights: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
    """A padded batch whose portrait images (height > width) are stored turned on their side -> a square
    (N, C, S, S) batch with every image upright, top-left.

    The image caches store portraits transposed so that every stored image is landscape: a folder
    of 4:3 photos in both orientations then pads to 342 x 456 per image instead of 456 x 456. Called
    only for batches that hold a portrait (the loaders know it on the host); one pass over the uint8
    batch, no host sync.
    """
    n, channels, height, width = images.shape
    side = max(height, width)
    square = F.pad(images, (0, side - width, 0, side - height))
    portrait = (heights > widths)[:, None, None, None]
    return torch.where(portrait, square.transpose(2, 3), square)


def resample(
    images: torch.Tensor,
    boxes: Boxes,
    out_size: int,
    *,
    flip: torch.Tensor | None = None,
    resized: tuple[torch.Tensor, torch.Tensor] | None = None,
    source_sizes: tuple[torch.Tensor, torch.Tensor] | None = None,
    antialias: bool = True,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = True,
    interpolation: str = "bilinear",
    normalise: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Crop each box and resize it to out_size x out_size; (N, C, S, S) -> (N, C, out, out).

    `interpolation` is the recipe's (`axis_weights`): bilinear, bicubic or nearest. `normalise`:
    (mean, 1 / std) in the input's units, (1, C, 1, 1), applied while the input is converted to `dtype`
    (rows of the interpolation matrices sum to 1, so the result is the same up to rounding).

    Without `resized`, box n of the source is stretched to the output (RandomResizedCrop). With
    `resized=(heights, widths)`, the source is first resized to those sizes and the box is a crop
    of that resized image (Resize + CenterCrop): the offset moves into the sampling coordinates;
    `source_sizes=(heights, widths)` are then the true sizes of padded sources (default: S x S).
    `flip[n]` mirrors sample n left-right (the horizontal matrix's rows reversed). Values keep the
    input's units (0..255 for uint8 input) in `dtype`; the matmuls run in `dtype`. The result is
    in channels_last memory order, or contiguous NCHW with `channels_last=False`: either written by
    the second matmul itself, never converted afterwards (a 299 px fp32 batch of 64 is 68 MB: one
    more copy cost 0.9x -> 1.5x the guide's images/s on an AVX2-only AMD EPYC, where fp32 is the
    training dtype and NCHW often the faster layout).
    """
    n, _, src_h, src_w = images.shape
    zeros = torch.zeros_like(boxes.top)
    if resized is None:
        start_y, start_x, extent_y, extent_x = boxes.top, boxes.left, boxes.height, boxes.width
        scale_y, scale_x = boxes.height.double() / out_size, boxes.width.double() / out_size
        off_y = off_x = zeros
    else:  # full image resized to (new_h, new_w), then the box cut from it
        heights, widths = source_sizes or _full_sizes(images)
        start_y = start_x = zeros
        extent_y, extent_x = heights, widths
        scale_y, scale_x = heights.double() / resized[0], widths.double() / resized[1]
        off_y, off_x = boxes.top, boxes.left
    rows = axis_weights(start_y, extent_y, scale_y, off_y, out_size, src_h, antialias, interpolation)
    cols = axis_weights(start_x, extent_x, scale_x, off_x, out_size, src_w, antialias, interpolation)
    if flip is not None:
        cols = torch.where(flip[:, None, None], cols.flip(1), cols)
    channels = images.shape[1]
    # Two batched products, nothing per image. Widths first (N, C*H, W) @ (N, W, out): the small one
    # for sources smaller than the output, whose result is permuted (3.7 M values for 64 x 64 px
    # sources) so that the large one, (N, out, H) @ (N, H, out*C), writes NHWC: channels_last without
    # another copy of the output. There only the large one skips its zeros: skipping the small one's
    # too leaves its result as (N, out, C, H), and the copy into the large one's operand cost what the
    # zeros had (both stages over per-block bands, AVX2-capped AMD EPYC, one run: 15.3-16.2 ms per
    # 64-image batch against 14.2-15.2 channels_last, 16.3-16.9 against 15.6-15.9 NCHW). Photos cached
    # at 342 x 456 are wider than the output: there the width product is the large one and skips its
    # zeros too (`_banded_widths`).
    banded = images.device.type == "cpu" and bool((extent_x > out_size).any())  # a host read only on a CPU
    narrow = _widths_first(_operand(images, dtype, normalise, banded), cols.to(dtype), out_size, banded)
    if not channels_last:  # (N, 1, out, H) @ (N, C, H, out): NCHW; the rows are shared by the channels
        return banded_matmul(rows.to(dtype), narrow)
    narrow = narrow.permute(0, 2, 3, 1).reshape(n, 1, src_h, out_size * channels)
    out = banded_matmul(rows.to(dtype), narrow).view(n, out_size, out_size, channels)
    return out.permute(0, 3, 1, 2)  # (N, C, out, out) in channels_last memory order


def _operand(images: torch.Tensor, dtype: torch.dtype, normalise: tuple[torch.Tensor, torch.Tensor] | None,
             columns_first: bool) -> torch.Tensor:
    """The input as `dtype` (normalised when asked), in one pass: (N, C, H, W), or (N, W, C, H) for the
    banded width product, whose table rows are the source's columns."""
    view = images.permute(0, 3, 1, 2) if columns_first else images
    out = torch.empty(view.shape, dtype=dtype, device=images.device)
    if normalise is None:
        return out.copy_(view)
    mean, inv_std = (t.permute(0, 3, 1, 2) if columns_first else t for t in normalise)
    return torch.addcmul(-mean * inv_std, view, inv_std, out=out)  # (x - mean) / std, computed in float32


def _widths_first(x: torch.Tensor, cols: torch.Tensor, out_size: int, banded: bool) -> torch.Tensor:
    """x @ cols^T (N, W, out) -> (N, C, H, out); x is (N, C, H, W), or (N, W, C, H) when `banded`.

    Dense, except on a CPU where some source is wider than the output (photos cached at 342 x 456): an
    output column has 3-4 taps there, not 456, and the dense product was half of DeviceAugment's CPU
    time on such batches (one profile, AVX2-capped AMD EPYC); so each output column is a bag of its
    source columns (`embedding_bag`). Decided from the boxes, never from the padding, so a resident
    batch and a streamed one (other padding) take the same path."""
    if not banded:
        n, channels, src_h, src_w = x.shape
        return torch.bmm(x.reshape(n, channels * src_h, src_w), cols.transpose(1, 2)).view(n, channels, src_h, out_size)
    n, src_w, channels, src_h = x.shape
    start, span = row_taps(cols, bounded=False)
    index = start[:, :, None] + torch.arange(span, device=x.device)  # (N, out, span) source columns
    weights = cols.gather(2, index)
    rows = index + (torch.arange(n, device=x.device) * src_w)[:, None, None]
    summed = F.embedding_bag(rows.reshape(-1, span), x.reshape(n * src_w, channels * src_h), mode="sum",
                             per_sample_weights=weights.reshape(-1, span))
    return summed.view(n, out_size, channels, src_h).permute(0, 2, 3, 1)  # (N, C, H, out), a view


def banded_matmul(weights: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
    """weights (N, out, src) @ data (N, E, src, L) -> (N, E, out, L), the same weights for all E.

    Interpolation weights are banded: upscaling gives each output row two adjacent non-zero taps,
    so the dense product of a 64 px crop resized to 299 px multiplies zeros 62 times in 64 (2.2
    GFLOP per 64-image batch). On a CPU each output row is instead a weighted sum of its few source
    rows, one `embedding_bag` (a gather-and-sum kernel) over all rows: the skipped terms are exact
    zeros. On an AVX2-only AMD EPYC (2 cores, fp32) this product of the resident loader's 64-image
    batch took 17-23 ms dense, 7.9 ms as per-block matmuls over 7-row bands, and 4.7 ms as bags
    (finding the taps included).
    The dense product stays where a row's taps span more than half the source (strong downscaling)
    and on GPUs, where it is cheap and reading the taps' span would stall the stream.
    """
    n, out, src = weights.shape
    taps = row_taps(weights) if weights.device.type == "cpu" else None
    if taps is None:
        return torch.matmul(weights[:, None], data)
    start, span = taps
    extra, length = data.shape[1], data.shape[3]
    index = start[:, :, None] + torch.arange(span, device=weights.device)  # (N, out, span)
    bag_weights = weights.gather(2, index)
    rows = index[:, None] + torch.arange(n * extra, device=data.device).view(n, extra, 1, 1) * src
    summed = F.embedding_bag(rows.reshape(-1, span), data.reshape(n * extra * src, length), mode="sum",
                             per_sample_weights=bag_weights[:, None].expand(n, extra, out, span).reshape(-1, span))
    return summed.view(n, extra, out, length)


def row_taps(weights: torch.Tensor, bounded: bool = True) -> tuple[torch.Tensor, int] | None:
    """Per output row, the first of `span` consecutive source rows that hold all its non-zero
    weights, (N, out), and that span; None where the span is more than half the source (`bounded`)."""
    n, out, src = weights.shape
    used = (weights != 0).to(torch.int8)
    first = used.argmax(dim=2)
    last = src - 1 - used.flip(2).argmax(dim=2)
    span = int((last - first + 1).max())
    if bounded and 2 * span > src:
        return None
    return torch.clamp(first, max=src - span), span  # near the edge the window slides in, still covering the taps


def _full_sizes(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n, _, h, w = images.shape
    return (torch.full((n,), h, dtype=torch.long, device=images.device),
            torch.full((n,), w, dtype=torch.long, device=images.device))


@dataclass
class DeviceAugment:
    """A uint8 batch -> normalised `dtype` batch for the model, in one batched call.

    train: RandomResizedCrop(out_size, scale, ratio) + optional horizontal flip, per sample;
    eval: Resize(shorter side -> resize_size) + CenterCrop(out_size). `mean`/`std` are the
    ModelSpec's (0..1 units); `interpolation` the recipe's. Bicubic training crops are not clipped to
    0..255 (torchvision's float path does not clip either); evaluation rounds and clips like the
    worker path's uint8 output.
    """

    out_size: int
    mean: Sequence[float]
    std: Sequence[float]
    train: bool = True
    scale: Sequence[float] = (0.08, 1.0)
    ratio: Sequence[float] = DEFAULT_RATIO
    hflip: bool = False
    resize_size: int | None = None
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    interpolation: str = "bilinear"
    # mean x 255 and 1 / (std x 255) per device, made once: a tensor built from Python numbers on a GPU
    # is a blocking copy from pageable memory, which made every step wait for the one before.
    _constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def normalisation(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean x 255, 1 / (std x 255)) as (1, C, 1, 1) float32 tensors on `device`, built on first use."""
        if device not in self._constants:
            mean = torch.tensor(self.mean, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
            inv_std = 1.0 / (torch.tensor(self.std, dtype=torch.float32).view(1, -1, 1, 1) * 255.0)
            # Queued, not waited for: built lazily inside the first epoch, a blocking copy there was the one
            # sync the H200's sync-debug epochs caught (2026-12-04).
            self._constants[device] = (to_device(mean, device), to_device(inv_std, device))
        return self._constants[device]

    def __call__(self, images: torch.Tensor, heights: torch.Tensor, widths: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        mean, inv_std = self.normalisation(images.device)
        if self.train:
            if generator is None:
                raise ValueError("training augmentation needs a torch.Generator")
            boxes = sample_crop_params(generator, heights, widths, self.scale, self.ratio)
            flip = None
            if self.hflip:
                flip = torch.rand(len(heights), generator=generator, device=images.device) < 0.5
            # Normalising the 64 px source, not the 299 px output, is 22x fewer elements, and it happens
            # in the pass that converts the uint8 source anyway.
            out = resample(images, boxes, self.out_size, flip=flip, dtype=self.dtype, channels_last=self.channels_last,
                           interpolation=self.interpolation, normalise=(mean, inv_std))
        else:
            boxes, new_h, new_w = center_crop_boxes(heights, widths, self.resize_size or self.out_size, self.out_size)
            pixels = resample(images, boxes, self.out_size, resized=(new_h, new_w), source_sizes=(heights, widths),
                              interpolation=self.interpolation)
            # Rounded to uint8 levels like the worker path's uint8 output, so `evaluate` agrees with it.
            out = ((pixels.round().clamp(0, 255) - mean) * inv_std).to(self.dtype)
        return out.contiguous(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)


def pass_normalised(prepare: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """`prepare` for uint8 batches; floating batches come normalised from a resident image loader."""

    def maybe_prepare(inputs: torch.Tensor) -> torch.Tensor:
        return inputs if inputs.is_floating_point() else prepare(inputs)

    return maybe_prepare
