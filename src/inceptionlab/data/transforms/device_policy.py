"""The device path's executor of `augment.policy` and `augment.random_erasing`: crop and flip as
`DeviceAugment` does, then the policy and erasing batched on the device, then normalisation.

The worker path runs torchvision's transforms on each uint8 crop (data/transforms/host.py); here the
same steps run on the whole batch, in the same order:
1. `DeviceAugment`'s RandomResizedCrop + flip (the same boxes and flips for the same generator as
   without a policy), as 0..255 floats, rounded to uint8 levels: the worker path's uint8 crop, within
   the one level the resampling already differs by (device.py);
2. the policy (`BatchPolicy` draws, device_ops.py applies: one call per operation drawn in the batch);
3. erasing to the mean colour's uint8 level (policies.mean_levels);
4. normalisation to the model's dtype and memory format.
Steps 2-3 draw on the host from a generator seeded from the batch's own generator seed (the loaders
seed it from (seed, epoch, rank, batch)), so a resumed run draws what an uninterrupted one draws.

Cost: the crop is normalised at the output size instead of the source size, and one pass per
operation; benchmarks/augment_cost.py measures it beside a 299 px Inception v3 step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from inceptionlab.data.transforms.device import DeviceAugment
from inceptionlab.data.transforms.device_ops import OPS, to_device
from inceptionlab.data.transforms.policies import BatchPolicy, ErasingBoxes, derived_seed, mean_levels, sample_erasing


def apply_rounds(images: torch.Tensor, policy: BatchPolicy, generator: torch.Generator,
                 per_image: bool | None = None) -> torch.Tensor:
    """Draw the policy for every image of a uint8 batch and apply it: per operation, one call for all the
    images that drew it on a GPU; one call per image on a CPU (`per_image`, default: the device is a CPU).

    Why per image on a CPU: each operation makes a few passes over its input (a float copy, a blend,
    a clamp), and one 299 px image (268 KB as uint8, 1 MB as float) stays in cache through them while a
    batch streams through memory on every pass. 16 images of 299 px, one call against 16 (best of 3,
    a shared 2-core AMD EPYC at load 13, one run): Color 249 vs 69 ms, Contrast 181 vs 51, Sharpness 442
    vs 124, Equalize 232 vs 148; the geometric ones (~25 ms per image, grid_sample) about even.
    """
    n, _, height, width = images.shape
    images = images.clone()
    per_image = images.device.type == "cpu" if per_image is None else per_image
    for step in policy.draw(n, height, width, generator):
        for name in sorted(set(step.ops) - {"Identity"}):
            rows = [k for k, op in enumerate(step.ops) if op == name]
            for group in ([k] for k in rows) if per_image else [rows]:
                index = to_device(torch.tensor(group), images.device)
                images[index] = OPS[name](images[index], step.magnitudes[group], policy.interpolation)
    return images


def erase(images: torch.Tensor, boxes: ErasingBoxes, fill: torch.Tensor) -> torch.Tensor:
    """Set each chosen box of a (N, C, H, W) batch to `fill` (C,) (torchvision's `F.erase`, batched)."""
    device = images.device
    on = lambda t: to_device(t, device).view(-1, 1, 1, 1)  # noqa: E731
    rows = torch.arange(images.shape[-2], device=device).view(1, 1, -1, 1)
    cols = torch.arange(images.shape[-1], device=device).view(1, 1, 1, -1)
    top, left = on(boxes.top), on(boxes.left)
    inside = ((rows >= top) & (rows < top + on(boxes.height)) & (cols >= left) & (cols < left + on(boxes.width))
              & on(boxes.erase))
    return torch.where(inside, to_device(fill.to(images.dtype), device).view(1, -1, 1, 1), images)


@dataclass
class PolicyAugment:
    """`DeviceAugment`'s training call with a policy and/or erasing after the crop; the same signature,
    so the resident and stream loaders need not know."""

    crop: DeviceAugment  # the training augmentation the loader would use without a policy
    policy: BatchPolicy | None = None
    random_erasing: float = 0.0
    _raw: DeviceAugment = field(init=False, repr=False)
    # The fill and normalisation constants per device, made once (a tensor from Python numbers on a GPU is
    # a blocking copy): (fill levels (C,) uint8, mean x 255, 1 / (std x 255)).
    _constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        channels = len(self.crop.mean)
        # Mean 0 and std 1/255 make the crop's normalisation the identity: its output is pixel values.
        self._raw = replace(self.crop, mean=(0.0,) * channels, std=(1.0 / 255.0,) * channels,
                            dtype=torch.float32, channels_last=False)

    def __call__(self, images: torch.Tensor, heights: torch.Tensor, widths: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        if generator is None:
            raise ValueError("training augmentation needs a torch.Generator")
        pixels = self._raw(images, heights, widths, generator).round_().clamp_(0, 255).to(torch.uint8)
        host = torch.Generator().manual_seed(derived_seed("augment", generator.initial_seed()))
        if self.policy is not None:
            pixels = apply_rounds(pixels, self.policy, host)
        fill, mean, inv_std = self.constants(pixels.device)
        if self.random_erasing > 0:
            n, _, height, width = pixels.shape
            pixels = erase(pixels, sample_erasing(n, height, width, self.random_erasing, host), fill)
        layout = torch.channels_last if self.crop.channels_last else torch.contiguous_format
        return ((pixels.float() - mean) * inv_std).to(self.crop.dtype).contiguous(memory_format=layout)

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if device not in self._constants:
            fill = torch.tensor(mean_levels(self.crop.mean)).to(torch.uint8)
            mean = torch.tensor(self.crop.mean, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
            inv_std = 1.0 / (torch.tensor(self.crop.std, dtype=torch.float32).view(1, -1, 1, 1) * 255.0)
            self._constants[device] = (fill.to(device), mean.to(device), inv_std.to(device))
        return self._constants[device]
