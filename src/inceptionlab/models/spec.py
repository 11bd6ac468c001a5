"""ModelSpec: what a model needs beside its weights: class names, preprocessing and its decision rule.

`spec.json` in a run directory holds one, so `predict`, `evaluate` and `export` rebuild the model, its
eval transform and its decision rule (models/rule.py) from the run alone (timm's pretrained_cfg idea:
preprocessing travels with the weights, never constants scattered through commands; the rule does too).

The spec is the only place that turns an image into the model's input, in two halves:
`preprocess(image)` (decoded image -> uint8 CHW tensor of `input_shape`: channel conversion, resize of
the shorter side, centre crop; in a worker or on the host) and `normalizer()` (uint8 or float batch ->
normalised floats, on the device). Training's eval transform, predict, evaluate, export, quantize and
bench all use these two.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_text
from inceptionlab.models.rule import LEGACY_KEYS, DecisionRule

if TYPE_CHECKING:
    from torchvision.transforms import v2

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Preprocessing:
    """A model's eval preprocessing: what torchvision's `weights.transforms()` describes."""

    resize_size: int  # shorter side, px
    crop_size: int  # centre crop, px
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]


@dataclass
class ModelSpec:
    arch: str  # registry name, e.g. "inception_v3"
    num_classes: int
    class_names: list[str]  # index -> folder name / wnid (what the dataset calls the class)
    class_labels: list[str] | None = None  # index -> human label ("goldfish"); None: class_names
    task: str = "multiclass"
    input_kind: str = "image"
    crop_size: int = 299  # eval centre crop, px
    resize_size: int = 342  # eval resize of the shorter side, px
    interpolation: str = "bilinear"
    mean: list[float] = field(default_factory=lambda: list(IMAGENET_MEAN))
    std: list[float] = field(default_factory=lambda: list(IMAGENET_STD))
    arch_kwargs: dict[str, Any] = field(default_factory=dict)  # builder args needed to rebuild it
    channels: int = 3  # image channels the model takes (1 for Fashion-MNIST)
    tokenizer: str | None = None  # for input_kind "tokens": the run's tokenizer file (raw text -> ids)
    sequence_length: int | None = None  # for input_kind "tokens": token ids per text
    # Which weights the run keeps (model.pt, best.pt for inference, exports): "raw" (the optimizer's)
    # or "ema" (their exponential moving average, ema.decay set: engine/ema.py).
    weights: str = "raw"
    # The decision rule (test-time augmentation, temperature, reject threshold, what it was fitted on),
    # fitted by `evaluate` on the run's validation split and applied by predict, export (the graph's
    # metadata, Triton's config) and serve: models/rule.py.
    rule: DecisionRule = field(default_factory=DecisionRule)

    def __post_init__(self) -> None:
        if len(self.class_names) != self.num_classes:
            raise ValueError(f"spec has {len(self.class_names)} class names for {self.num_classes} classes")

    @property
    def labels(self) -> list[str]:
        return self.class_labels or self.class_names

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One sample as the model takes it: (channels, crop, crop), or (sequence_length,) for text."""
        if self.input_kind == "tokens":
            if self.sequence_length is None:
                raise UserError(f"this {self.arch} text spec has no sequence_length: re-run the training to record it")
            return (self.sequence_length,)
        return (self.channels, self.crop_size, self.crop_size)

    def eval_transform(self) -> v2.Compose:
        """Decoded image (PIL or uint8 tensor, any channel count) -> uint8 CHW tensor of `input_shape`."""
        self._require_image("preprocess images")
        return eval_transform(self.resize_size, self.crop_size, self.interpolation, self.channels)

    def preprocess(self, image: Any) -> torch.Tensor:
        """One decoded image -> uint8 CHW tensor of `input_shape` (build `eval_transform()` once for many)."""
        return torch.as_tensor(self.eval_transform()(image))

    def normalizer(self, channels_last: bool = False) -> Normalize:
        """The on-device half: uint8/float NCHW batch -> (x / 255 - mean) / std as float32."""
        self._require_image("normalise images")
        return Normalize(self.mean, self.std, channels_last)

    def _require_image(self, what: str) -> None:
        if self.input_kind != "image":
            raise UserError(f"this {self.arch} model takes {self.input_kind}, not images: cannot {what}")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rule": self.rule.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelSpec":
        data = dict(data)
        if "rule" in data:
            data["rule"] = DecisionRule.from_dict(data["rule"])
        elif any(key in data for key in LEGACY_KEYS):  # a spec.json written before the rule was one object
            data["rule"] = DecisionRule.from_legacy(data)
        return cls(**data)

    def save(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> "ModelSpec":
        try:
            spec = cls.from_dict(json.loads(Path(path).read_text()))
        except FileNotFoundError:
            raise UserError(f"{path}: no spec.json: is this a run directory made by `inceptionlab train`?") from None
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise UserError(f"{path}: unreadable model spec ({exc}); re-create it by re-running the training") from None
        spec.rule = spec.rule.located(Path(path).parent)  # a kNN bank lies beside spec.json
        return spec


# Channel conversion by the model's channel count: PIL's/torchvision's ITU-R 601 luma for one grey
# channel (Fashion-MNIST), grey replicated to RGB for three.
SUPPORTED_CHANNELS = (1, 3)


def eval_transform(resize_size: int, crop_size: int, interpolation: str, channels: int = 3) -> v2.Compose:
    """Convert channels, resize the shorter side to resize_size, centre-crop crop_size (the guide's
    342 -> 299); stops at uint8 so workers ship 4x fewer bytes than float32 to the device."""
    # torchvision is imported on first use: it adds ~1.3 s to start-up, and text runs never need it.
    from torchvision.transforms import InterpolationMode, v2

    if channels not in SUPPORTED_CHANNELS:
        raise UserError(f"models with {channels} image channels are not supported (1: grey, 3: RGB)")
    convert = v2.Grayscale(1) if channels == 1 else v2.RGB()
    return v2.Compose(
        [
            v2.ToImage(),
            convert,
            v2.Resize(resize_size, interpolation=InterpolationMode(interpolation), antialias=True),
            v2.CenterCrop(crop_size),
        ]
    )


class Normalize(nn.Module):
    """uint8 (or float 0..255) NCHW batch -> float, scaled to [0, 1], minus mean, over std; optional
    channels_last. Runs once per batch on the device instead of per image in a worker."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], channels_last: bool = False):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1) * 255.0)
        self.register_buffer("inv_std", 1.0 / (torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1) * 255.0))
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        images = images.to(memory_format=self.memory_format)
        return (images.float() - self.mean) * self.inv_std
