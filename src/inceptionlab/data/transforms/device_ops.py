"""The operations of TrivialAugmentWide, RandAugment and AutoAugment on a uint8 batch, each sample with
its own magnitude: torchvision's per-image results, computed in one call per operation.

torchvision's functional kernels take one magnitude per call (`adjust_brightness(image, 1.3)`), so a
batch whose samples drew different magnitudes would cost one call per sample. Where a kernel has no
parameter and runs on a batch without a device sync (Equalize, Invert, the grayscale) torchvision's own
runs on the sub-batch; the others are written here with per-sample tensors in place of torchvision's
scalars (AutoContrast: with `torch.where` in place of its boolean-mask assignments), the same
arithmetic in the same order, and tests/test_device_policy.py checks each against torchvision image
by image:
- Posterize, Solarize, AutoContrast, the geometric ones (ShearX/Y, TranslateX/Y, Rotate: one `grid_sample` with a
  grid per sample, built as torchvision's `_affine_grid` builds one) give torchvision's bytes exactly;
- Brightness, Color (saturation), Contrast and Sharpness blend in float32 and truncate to uint8 as
  torchvision does: its bytes on the AMD EPYC (AVX2) this was written on; where another device's
  kernels round a multiply-add differently, within one uint8 level (what the tests allow).

Every function takes `images` (N, C, H, W) uint8 and `magnitudes` (N,) float64 on the host (the
signed magnitude torchvision's policy classes pass to `_apply_image_or_video_transform`) and returns a
new uint8 batch.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF

BOUND = 255.0  # uint8's largest value (torchvision's _max_value(torch.uint8))

Op = Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor]


def to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without making it wait: on a GPU a copy from pageable memory first
    waits for all the work queued before it (a sync per call, per operation here); from pinned memory
    (torch's caching host allocator: no new allocation per call) it is queued like a kernel."""
    if device.type != "cuda" or values.device == device:
        return values.to(device)
    return values.pin_memory().to(device, non_blocking=True)


def _per_sample(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(N,) host values as float32 (N, 1, 1, 1) on `like`'s device (the Python float -> float32 cast
    torchvision's scalar arguments get inside a kernel)."""
    return to_device(values.to(torch.float32).view(-1, 1, 1, 1), like.device)


def _blend(image: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """torchvision's `_blend` (image * ratio + other * (1 - ratio), clamped, truncated to uint8) with
    one ratio per sample. `1 - ratio` is taken in float64 before the float32 cast, as Python does with
    torchvision's `alpha=(1.0 - ratio)`. `addcmul` rounds once, like the CPU kernel of torchvision's
    `add_(other, alpha=...)` (a fused multiply-add): a multiply then an add put 31 of 0.6 M values of
    a 37 x 41 px batch of 64 one level off (AMD EPYC, AVX2)."""
    weight = _per_sample(ratio, image)
    other_weight = _per_sample(1.0 - ratio, image)
    return torch.addcmul(image.float().mul_(weight), other, other_weight).clamp_(0, BOUND).to(torch.uint8)


def brightness(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    """adjust_brightness(image, 1 + magnitude): a blend with black."""
    return images.float().mul_(_per_sample(1.0 + magnitudes, images)).clamp_(0, BOUND).to(torch.uint8)


def _grayscale(images: torch.Tensor) -> torch.Tensor:
    """torchvision's luma, floored (its uint8 path floors before blending), as float32."""
    return TF.rgb_to_grayscale(images).float()  # uint8 output: the floor of the non-negative luma


def color(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    """adjust_saturation(image, 1 + magnitude): a blend with the image's grayscale."""
    return _blend(images, _grayscale(images), 1.0 + magnitudes)


def contrast(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    """adjust_contrast(image, 1 + magnitude): a blend with the mean of the image's grayscale."""
    mean = _grayscale(images).mean(dim=(-3, -2, -1), keepdim=True)
    return _blend(images, mean, 1.0 + magnitudes)


def sharpness(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    """adjust_sharpness(image, 1 + magnitude): the interior blended with a 3x3 smoothing (1s around a
    5, over 13), rounded; the one-pixel border is left as it is."""
    channels, height, width = images.shape[-3:]
    if height <= 2 or width <= 2:
        return images.clone()
    a, b = 1.0 / 13.0, 5.0 / 13.0
    kernel = to_device(torch.tensor([[a, a, a], [a, b, a], [a, a, a]], dtype=torch.float32), images.device)
    output = images.to(torch.float32, copy=True)
    blurred = F.conv2d(output, kernel.expand(channels, 1, 3, 3), groups=channels).round_()
    view = output[..., 1:-1, 1:-1]
    view.addcmul_(blurred.sub_(view), _per_sample(1.0 - (1.0 + magnitudes), images))  # add_(..., alpha=): see _blend
    return output.clamp_(0, BOUND).to(torch.uint8)


def posterize(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    """posterize(image, bits=int(magnitude)): keep the top `bits` bits of every byte."""
    bits = magnitudes.to(torch.int64).clamp(0, 8)
    masks = ((1 << bits) - 1) << (8 - bits)  # bits = 8: 0xFF, the image unchanged as torchvision returns it
    return images & to_device(masks.to(torch.uint8).view(-1, 1, 1, 1), images.device)


def solarize(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    """solarize(image, threshold=255 * magnitude): bytes at or above the threshold inverted."""
    threshold = _per_sample(BOUND * magnitudes, images)
    return torch.where(images >= threshold, images.bitwise_not(), images)


def autocontrast(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    """autocontrast(image): each channel stretched from its min..max to 0..255 (a flat channel kept).
    torchvision's kernel, with `torch.where` for its boolean-mask assignments, which on a GPU ask the
    device how many elements they select (a sync per call)."""
    pixels = images.float()
    minimum = pixels.amin(dim=(-2, -1), keepdim=True)
    maximum = pixels.amax(dim=(-2, -1), keepdim=True)
    flat = maximum == minimum
    inv_scale = torch.where(flat, 1.0, (maximum - minimum).mul_(1.0 / BOUND))
    minimum = torch.where(flat, 0.0, minimum)
    return pixels.sub_(minimum).div_(inv_scale).clamp_(0, BOUND).to(torch.uint8)


def equalize(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    return TF.equalize(images)  # torchvision's batched histogram equalisation


def invert(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    return TF.invert(images)


def identity(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    return images


# --- geometric operations: one grid per sample ------------------------------------------------------


def inverse_affine_matrix(center: tuple[float, float], angle: float, translate: tuple[float, float],
                          shear: tuple[float, float]) -> list[float]:
    """The 2x3 matrix from output to input pixels that torchvision's `_get_inverse_affine_matrix`
    returns for scale 1 (its formula, in Python floats like it)."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    cos_sy, tan_sx, rot_minus_sy = math.cos(sy), math.tan(sx), rot - sy
    cx_plus_tx, cy_plus_ty = cx + tx, cy + ty
    a = math.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + math.sin(rot))
    c = math.sin(rot_minus_sy) / cos_sy
    d = math.cos(rot) - c * tan_sx
    matrix = [d / 1.0, -b / 1.0, 0.0, -c / 1.0, a / 1.0, 0.0]
    matrix[2] += cx - matrix[0] * cx_plus_tx - matrix[1] * cy_plus_ty
    matrix[5] += cy - matrix[3] * cx_plus_tx - matrix[4] * cy_plus_ty
    return matrix


def _warp(images: torch.Tensor, matrices: list[list[float]], interpolation: str) -> torch.Tensor:
    """torchvision's `_affine_grid` + `_apply_grid_transform` (fill None: zeros outside) with one
    matrix per sample: the same base grid, the same float32 product, one `grid_sample` for all."""
    n, _, height, width = images.shape
    device = images.device
    theta = to_device(torch.tensor(matrices, dtype=torch.float32).view(n, 2, 3), device)
    base = torch.empty(1, height, width, 3, dtype=torch.float32, device=device)
    base[..., 0].copy_(torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width, device=device))
    base[..., 1].copy_(torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height, device=device).unsqueeze_(-1))
    base[..., 2].fill_(1)
    rescaled = theta.transpose(1, 2).div_(to_device(torch.tensor([0.5 * width, 0.5 * height], dtype=torch.float32), device))
    grid = base.view(1, height * width, 3).expand(n, -1, -1).bmm(rescaled).view(n, height, width, 2)
    warped = F.grid_sample(images.float(), grid, mode=interpolation, padding_mode="zeros", align_corners=False)
    return warped.round_().to(torch.uint8)


def _shear_matrices(magnitudes: torch.Tensor, width: int, height: int, axis: int) -> list[list[float]]:
    """Shear about the top-left corner (torchvision's policies pass center=[0, 0])."""
    center = (0.0 - width * 0.5, 0.0 - height * 0.5)
    matrices = []
    for magnitude in magnitudes.tolist():
        degrees = math.degrees(math.atan(magnitude))
        shear = (degrees, 0.0) if axis == 0 else (0.0, degrees)
        matrices.append(inverse_affine_matrix(center, 0.0, (0.0, 0.0), shear))
    return matrices


def shear_x(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    return _warp(images, _shear_matrices(magnitudes, images.shape[-1], images.shape[-2], 0), interpolation)


def shear_y(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    return _warp(images, _shear_matrices(magnitudes, images.shape[-1], images.shape[-2], 1), interpolation)


def _translate(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str, axis: int) -> torch.Tensor:
    shifts = [float(int(m)) for m in magnitudes.tolist()]  # torchvision passes translate=[int(magnitude), 0]
    matrices = [inverse_affine_matrix((0.0, 0.0), 0.0, (s, 0.0) if axis == 0 else (0.0, s), (0.0, 0.0)) for s in shifts]
    return _warp(images, matrices, interpolation)


def translate_x(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    return _translate(images, magnitudes, interpolation, 0)


def translate_y(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    return _translate(images, magnitudes, interpolation, 1)


def rotate(images: torch.Tensor, magnitudes: torch.Tensor, interpolation: str) -> torch.Tensor:
    """rotate(image, angle=magnitude) about the centre, same size: torchvision's exact quarter turns
    (`rot90`, taken when the angle is 0, 180, or 90/270 on a square image) for those samples, one warp
    for the rest."""
    angles = [m % 360 for m in magnitudes.tolist()]
    square = images.shape[-1] == images.shape[-2]
    quarter_turns = {0.0: 0, 180.0: 2, **({90.0: 1, 270.0: 3} if square else {})}
    out = torch.empty_like(images)
    warped = [k for k, angle in enumerate(angles) if angle not in quarter_turns]
    for turns in set(quarter_turns.values()):
        rows = [k for k, angle in enumerate(angles) if quarter_turns.get(angle) == turns]
        if rows:
            index = to_device(torch.tensor(rows), images.device)
            out[index] = torch.rot90(images[index], k=turns, dims=(-2, -1))
    if warped:
        index = to_device(torch.tensor(warped), images.device)
        matrices = [inverse_affine_matrix((0.0, 0.0), -angles[k], (0.0, 0.0), (0.0, 0.0)) for k in warped]
        out[index] = _warp(images[index], matrices, interpolation)
    return out


# torchvision's names (the keys of its policies' augmentation spaces) -> the batched operation.
OPS: dict[str, Op] = {
    "Identity": identity,
    "ShearX": shear_x,
    "ShearY": shear_y,
    "TranslateX": translate_x,
    "TranslateY": translate_y,
    "Rotate": rotate,
    "Brightness": brightness,
    "Color": color,
    "Contrast": contrast,
    "Sharpness": sharpness,
    "Posterize": posterize,
    "Solarize": solarize,
    "AutoContrast": autocontrast,
    "Equalize": equalize,
    "Invert": invert,
}
