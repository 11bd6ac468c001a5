"""ModelSpec: what a model needs beside its weights: class names and preprocessing.

`spec.json` in a run directory holds one, so `predict`, `evaluate` and `export` rebuild the model and
its eval transform from the run alone (timm's pretrained_cfg idea: preprocessing travels with the
weights, never constants scattered through commands).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_text

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


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

    def __post_init__(self) -> None:
        if len(self.class_names) != self.num_classes:
            raise ValueError(f"spec has {len(self.class_names)} class names for {self.num_classes} classes")

    @property
    def labels(self) -> list[str]:
        return self.class_labels or self.class_names

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelSpec":
        return cls(**data)

    def save(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> "ModelSpec":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except FileNotFoundError:
            raise UserError(f"{path}: no spec.json: is this a run directory made by `inceptionlab train`?") from None
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise UserError(f"{path}: unreadable model spec ({exc}); re-create it by re-running the training") from None
