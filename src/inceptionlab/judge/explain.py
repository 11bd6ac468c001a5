"""Grad-CAM: where the model looked for a class, drawn over the image it saw.

    explainer = Explainer(model, spec, torch.device("cpu"))
    maps = explainer.maps(batch, classes)          # uint8 NCHW batch as spec.eval_transform() makes it
    explainer.explain_files(paths, classes, out)  # one overlay PNG per image

Built on Captum's `LayerGradCam` (Selvaraju et al. 2017: the target layer's activations weighted by
the spatial mean of the class score's gradient, summed over channels, ReLU) at the layer the registry
names for the architecture (`models.registry.cam_layer`: Mixed_7c for Inception v3). Captum over the
grad-cam package: it needs only torch, numpy and matplotlib, where grad-cam pulls opencv-python and
ttach into every environment that explains. tests/test_explain.py checks its maps against Grad-CAM
computed by hand on a small network.

This is the one piece after evaluation that runs the model again: it needs gradients, which the
per-image results table (judge/results.py) cannot hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image
from torch import nn

from inceptionlab.data.io.decode import load_rgb
from inceptionlab.engine.task import main_logits
from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write
from inceptionlab.infer.tta import with_tta
from inceptionlab.judge.results import as_two_class
from inceptionlab.models.registry import cam_layer
from inceptionlab.models.penultimate import WithFeatures, head_name
from inceptionlab.models.rule import Answers, DecisionRule
from inceptionlab.models.spec import ModelSpec

# How much of the overlay is the heat map: 0.45 keeps the photo readable under the colours.
OVERLAY_ALPHA = 0.45
# Overlays of small inputs (CIFAR-10's 32 px, Fashion-MNIST's 28 px) are enlarged to at least this many
# pixels a side with nearest-neighbour sampling, so a person sees the map's cells.
MIN_OVERLAY_SIDE = 128


def _captum() -> Any:
    """captum.attr, imported on first use (~1 s, and only the `trust` extra installs it)."""
    try:
        import captum.attr  # ~1 s; only explaining needs it
    except ImportError:
        raise UserError("Grad-CAM needs Captum: pip install 'inceptionlab[trust]' (or pip install captum)") from None
    return captum.attr


@dataclass
class Explainer:
    """Grad-CAM of one model at its registry layer; `layer` overrides the registry's choice."""

    model: nn.Module
    spec: ModelSpec
    device: torch.device
    layer: str | None = None
    rule: DecisionRule | None = None  # what the model answers by (a server's, with its TTA); None: the spec's
    _gradcam: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.spec.input_kind != "image":
            raise UserError(f"{self.spec.arch}: no Grad-CAM: it classifies {self.spec.input_kind}, not images")
        self.model = self.model.to(self.device).eval()
        self.rule = self.rule or self.spec.rule
        # a rule with a kNN bank reads the penultimate features beside the logits (models/penultimate.py)
        self.feature_dim = self.rule.knn.dim if self.rule.knn is not None else 0
        net = WithFeatures(self.model, head_name(self.model, self.spec.num_classes)) if self.feature_dim else self.model
        self.runner = with_tta(net, self.rule.tta)
        self.layer = self.layer or cam_layer(self.spec.arch, self.model, self.spec.input_shape)
        self.normalize = self.spec.normalizer().to(self.device)
        self.transform = self.spec.eval_transform()
        self._gradcam = _captum().LayerGradCam(self._forward, self.model.get_submodule(self.layer))

    def _forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Normalised float batch -> (N, C) logits (a binary model's z as [0, z], as the results table)."""
        return as_two_class(main_logits(self.model(pixels)))

    @torch.inference_mode()
    def answers(self, batch: torch.Tensor) -> Answers:
        """The decision rule's answers for a uint8 NCHW batch (its views averaged, its temperature and threshold:
        what predict and /v1/classify answer); Grad-CAM then explains one class of the plain image."""
        out = main_logits(self.runner(self.normalize(batch.to(self.device)))).float().cpu()
        return self.rule.decide(*WithFeatures.split(out, self.feature_dim)) if self.feature_dim else self.rule.decide(out)

    def raw_maps(self, batch: torch.Tensor, classes: Sequence[int]) -> torch.Tensor:
        """Grad-CAM at the layer's resolution, (N, h, w), ReLU applied, unscaled."""
        pixels = self.normalize(batch.to(self.device))
        with torch.enable_grad():
            maps = self._gradcam.attribute(pixels, target=list(map(int, classes)), relu_attributions=True)
        return maps.detach()[:, 0]

    def maps(self, batch: torch.Tensor, classes: Sequence[int]) -> torch.Tensor:
        """Grad-CAM upsampled (bilinear) to the input's size and scaled to [0, 1] per image, (N, H, W), on the CPU."""
        raw = self.raw_maps(batch, classes)
        size = tuple(batch.shape[-2:])
        up = nn.functional.interpolate(raw[:, None], size=size, mode="bilinear", align_corners=False)[:, 0]
        peak = up.flatten(1).amax(dim=1).clamp_min(1e-12)[:, None, None]
        return (up.clamp_min(0) / peak).cpu()

    def load(self, path: Path) -> torch.Tensor:
        """One image file -> uint8 CHW as the model sees it (spec's resize and centre crop)."""
        return torch.as_tensor(self.transform(load_rgb(path, max_side=self.spec.resize_size)))

    def explain_files(self, paths: Sequence[Path], classes: Sequence[int], out_dir: Path,
                      batch_size: int = 8, names: OverlayNames | None = None) -> list[Path]:
        """One overlay PNG per image (for the class given beside it) in out_dir; their paths, in order."""
        names = names or OverlayNames()
        written: list[Path] = []
        for start in range(0, len(paths), batch_size):
            batch = torch.stack([self.load(p) for p in paths[start:start + batch_size]])
            cams = self.maps(batch, classes[start:start + batch_size])
            for path, image, cam in zip(paths[start:start + batch_size], batch, cams):
                target = Path(out_dir) / names(path)
                picture = overlay(image, cam)
                atomic_write(target, lambda handle, picture=picture: picture.save(handle, format="PNG"))
                written.append(target)
        return written


class OverlayNames:
    """`<stem>.cam.png` per input; a stem seen before gets -2, -3, ... so no overlay replaces another."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, path: Path) -> str:
        stem = Path(path).stem
        self.seen[stem] = self.seen.get(stem, 0) + 1
        return f"{stem}.cam.png" if self.seen[stem] == 1 else f"{stem}-{self.seen[stem]}.cam.png"


def heat_colours(cam: torch.Tensor) -> np.ndarray:
    """(H, W) values in [0, 1] -> (H, W, 3) uint8 in matplotlib's `jet` (blue cold, red hot: Grad-CAM's usual map)."""
    from matplotlib import colormaps  # ~0.4 s: only when drawing

    return (colormaps["jet"](cam.numpy())[..., :3] * 255).astype(np.uint8)


def overlay(image: torch.Tensor, cam: torch.Tensor, alpha: float = OVERLAY_ALPHA) -> Image.Image:
    """uint8 CHW image (1 or 3 channels) and its (H, W) map in [0, 1] -> an RGB picture of both."""
    pixels = image.permute(1, 2, 0).numpy()
    if pixels.shape[2] == 1:
        pixels = np.repeat(pixels, 3, axis=2)
    blended = (1 - alpha) * pixels.astype(np.float32) + alpha * heat_colours(cam).astype(np.float32)
    picture = Image.fromarray(blended.round().clip(0, 255).astype(np.uint8))
    scale = -(-MIN_OVERLAY_SIDE // min(picture.size))  # ceil
    if scale > 1:
        picture = picture.resize((picture.width * scale, picture.height * scale), Image.Resampling.NEAREST)
    return picture
