"""What each image of a batch draws from an augmentation policy: torchvision's draws, made for a whole
batch at once on the host.

TrivialAugmentWide, RandAugment and AutoAugment (torchvision.transforms.v2) draw, per image, which
operations run and with which signed magnitude; `BatchPolicy.draw` makes the same draws for N images
at once, from torchvision's own tables (the classes' `_AUGMENTATION_SPACE` and AutoAugment's
`_policies`: private attributes, read rather than copied so the two paths cannot drift apart; the
distribution tests fail loudly if torchvision reshapes them). tests/test_device_policy.py checks the draws'
distribution against torchvision's classes with a chi-square test, and that the test rejects a
policy drawn slightly wrong.

The draws run on the host from a `torch.Generator`: a few numbers per image, and the batch can then
be split by operation without asking the device which samples drew what (a sync per step on a GPU).
`RandomErasing`'s boxes are drawn here too (`sample_erasing`).

The per-image orders of draws differ from torchvision's (a batch draws each quantity for all its images
at once), so the same seed gives other images other operations; the distribution is the same.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torchvision.transforms import v2

from inceptionlab.config import AugmentConfig

# RandomErasing's defaults (Zhong et al. 2017, torchvision): box area 2-33% of the image, aspect 0.3-3.3.
ERASING_SCALE = (0.02, 0.33)
ERASING_RATIO = (0.3, 3.3)
ERASING_ATTEMPTS = 10  # torchvision tries 10 boxes, then leaves the image as it is

# AutoAugment's learned policies index magnitudes 0..9 of a 10-level table (torchvision's forward).
AUTOAUGMENT_BINS = 10


def derived_seed(*parts: Any) -> int:
    """A 63-bit seed from (stream name, seed, epoch, rank, step, ...): independent, replayable streams."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # manual_seed takes [0, 2**63) on every device


@dataclass(frozen=True)
class Round:
    """One operation per image: `ops[k]` names torchvision's operation for image k (Identity: none),
    `magnitudes[k]` its signed magnitude (float64, on the host), as torchvision passes them to
    `_apply_image_or_video_transform`."""

    ops: list[str]
    magnitudes: torch.Tensor


def torchvision_policy(cfg: AugmentConfig) -> v2.Transform | None:
    """The worker path's transform for `cfg.policy` (None for `none`); the device path draws from its tables."""
    interpolation = v2.InterpolationMode(cfg.interpolation)
    if cfg.policy == "trivialaugment":
        return v2.TrivialAugmentWide(num_magnitude_bins=cfg.num_magnitude_bins, interpolation=interpolation)
    if cfg.policy == "randaugment":
        return v2.RandAugment(num_ops=cfg.num_ops, magnitude=cfg.magnitude,
                              num_magnitude_bins=cfg.num_magnitude_bins, interpolation=interpolation)
    if cfg.policy == "autoaugment":
        return v2.AutoAugment(v2.AutoAugmentPolicy(cfg.autoaugment_policy), interpolation=interpolation)
    return None


def _magnitude_table(space: dict[str, Any], names: list[str], bins: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(len(names), bins) float64 magnitudes (0 where an operation has none) and which are signed,
    from a torchvision augmentation space: name -> (magnitudes(bins, height, width) or None, signed)."""
    table = torch.zeros(len(names), bins, dtype=torch.float64)
    signed = torch.zeros(len(names), dtype=torch.bool)
    for row, name in enumerate(names):
        magnitudes, is_signed = space[name]
        values = magnitudes(bins, height, width)
        if values is not None:  # torchvision reads them one at a time with float(); the same values here
            table[row] = torch.tensor([float(v) for v in values], dtype=torch.float64)
        signed[row] = is_signed
    return table, signed


def _signed(magnitudes: torch.Tensor, signed: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """torchvision: `if signed and torch.rand(()) <= 0.5: magnitude *= -1`."""
    flip = torch.rand(magnitudes.shape, generator=generator) <= 0.5
    return torch.where(signed & flip, -magnitudes, magnitudes)


@dataclass(frozen=True)
class BatchPolicy:
    """A torchvision policy's draws for a batch of `height` x `width` images."""

    transform: v2.Transform  # TrivialAugmentWide, RandAugment or AutoAugment: its tables and settings

    @property
    def interpolation(self) -> str:
        return v2.InterpolationMode(self.transform.interpolation).value

    def draw(self, n: int, height: int, width: int, generator: torch.Generator) -> list[Round]:
        if isinstance(self.transform, v2.TrivialAugmentWide):
            return [self._trivial(n, height, width, generator)]
        if isinstance(self.transform, v2.RandAugment):
            return [self._rand_round(n, height, width, generator) for _ in range(self.transform.num_ops)]
        if isinstance(self.transform, v2.AutoAugment):
            return self._auto(n, height, width, generator)
        raise TypeError(f"no batched draws for {type(self.transform).__name__}")

    def _trivial(self, n: int, height: int, width: int, generator: torch.Generator) -> Round:
        """One operation, uniform; its magnitude level uniform over the bins; a sign if signed."""
        space = self.transform._AUGMENTATION_SPACE
        names, bins = list(space), self.transform.num_magnitude_bins
        table, signed = _magnitude_table(space, names, bins, height, width)
        op = torch.randint(len(names), (n,), generator=generator)
        level = torch.randint(bins, (n,), generator=generator)
        return Round([names[k] for k in op.tolist()], _signed(table[op, level], signed[op], generator))

    def _rand_round(self, n: int, height: int, width: int, generator: torch.Generator) -> Round:
        """One of `num_ops` rounds: an operation, uniform, at the fixed magnitude level; a sign if signed."""
        space = self.transform._AUGMENTATION_SPACE
        names, bins = list(space), self.transform.num_magnitude_bins
        table, signed = _magnitude_table(space, names, bins, height, width)
        op = torch.randint(len(names), (n,), generator=generator)
        return Round([names[k] for k in op.tolist()], _signed(table[op, self.transform.magnitude], signed[op], generator))

    def _auto(self, n: int, height: int, width: int, generator: torch.Generator) -> list[Round]:
        """A learned sub-policy, uniform; each of its two operations runs with its own probability, at
        its own magnitude level; a sign if signed."""
        space, policies = self.transform._AUGMENTATION_SPACE, self.transform._policies
        names = list(space)
        table, signed = _magnitude_table(space, names, AUTOAUGMENT_BINS, height, width)
        chosen = torch.randint(len(policies), (n,), generator=generator).tolist()
        rounds = []
        for slot in range(2):
            steps = [policies[k][slot] for k in chosen]  # (name, probability, level or None)
            runs = torch.rand(n, dtype=torch.float32, generator=generator) <= torch.tensor([p for _, p, _ in steps])
            op = torch.tensor([names.index(name) for name, _, _ in steps])
            level = torch.tensor([lvl or 0 for _, _, lvl in steps])
            magnitudes = _signed(table[op, level], signed[op], generator)
            ops = [name if run else "Identity" for (name, _, _), run in zip(steps, runs.tolist())]
            rounds.append(Round(ops, torch.where(runs, magnitudes, torch.zeros_like(magnitudes))))
        return rounds


def batch_policy(cfg: AugmentConfig) -> BatchPolicy | None:
    transform = torchvision_policy(cfg)
    return BatchPolicy(transform) if transform is not None else None


@dataclass(frozen=True)
class ErasingBoxes:
    """Per image: whether to erase, and the box (top, left, height, width), int64 (N,) each."""

    erase: torch.Tensor
    top: torch.Tensor
    left: torch.Tensor
    height: torch.Tensor
    width: torch.Tensor


def sample_erasing(n: int, height: int, width: int, p: float, generator: torch.Generator,
                   scale: Sequence[float] = ERASING_SCALE, ratio: Sequence[float] = ERASING_RATIO) -> ErasingBoxes:
    """RandomErasing's draws for N images of height x width: erase with probability p (torchvision:
    skip when rand >= p); up to 10 boxes of area scale x H x W and log-uniform aspect h / w, the first
    with h < H and w < W; its top-left uniform over the placements. No box fits: no erasing."""
    erase = torch.rand(n, generator=generator) < p
    area = float(height * width)
    target = area * (scale[0] + (scale[1] - scale[0]) * torch.rand(n, ERASING_ATTEMPTS, generator=generator, dtype=torch.float64))
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * torch.rand(n, ERASING_ATTEMPTS, generator=generator, dtype=torch.float64))
    h = torch.round(torch.sqrt(target * aspect)).long()
    w = torch.round(torch.sqrt(target / aspect)).long()
    fits = (h < height) & (w < width)
    first = fits.to(torch.int8).argmax(dim=1, keepdim=True)
    h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
    position = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    top = torch.floor(position[:, 0] * (height - h + 1)).long()
    left = torch.floor(position[:, 1] * (width - w + 1)).long()
    return ErasingBoxes(erase & fits.any(dim=1), top, left, h, w)


def mean_levels(mean: Sequence[float]) -> list[float]:
    """The mean colour as uint8 levels: what erasing fills in before normalisation, so that the box is
    ~0 after it (torchvision erases normalised images with 0; the level is within half a level of it)."""
    return [float(round(m * 255)) for m in mean]
