"""Images -> top-k labels with probabilities, for a pretrained model or a trained run.

The model, its preprocessing and its decision rule come from one place: the run's spec.json, or the
pretrained weights' own metadata (for torchvision's Inception v3: resize 342, centre crop 299,
bilinear, ImageNet mean/std; the guide resizes to 299, the weights were evaluated at 342 -> 299).
The rule (models/rule.py) answers: its test-time augmentation's views averaged, probabilities at its
temperature, "unknown" when the top one is below its threshold or, with a kNN bank, when the image's
penultimate features (models/penultimate.py, averaged over the same views) lie beyond its distance
threshold. Another `tta=` than a fitted rule's is refused.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch
from torch import nn

from inceptionlab.data.io.decode import ImageReadError, load_rgb
from inceptionlab.data.io.image_files import expand_image_paths
from inceptionlab.data.loading.sampler import default_num_workers
from inceptionlab.engine.task import main_logits
from inceptionlab.errors import UserError
from inceptionlab.infer.tta import with_tta
from inceptionlab.models.penultimate import WithFeatures, head_name
from inceptionlab.models.rule import Answers
from inceptionlab.models.spec import ModelSpec, Normalize


@dataclass
class Predictor:
    model: nn.Module
    spec: ModelSpec
    device: torch.device
    tta: str | None = None  # None: the rule's (a fitted rule refuses another)
    where: str = "the model"  # the run directory, for messages
    # Files decoded side by side per batch (None: the loaders' default, one per core up to 8). Pillow
    # releases the GIL while it decodes, so threads suffice: a 12 MP phone JPEG takes ~43 ms even at
    # 1/8 scale on one AMD EPYC Zen 3 core, more than a small model or a GPU takes to classify it.
    decode_threads: int | None = None

    def __post_init__(self) -> None:
        if self.spec.input_kind != "image":
            raise UserError(f"this {self.spec.arch} model classifies text: use --text or --text-file, not image files")
        self.rule = self.spec.rule.under(self.tta, self.where)
        self.tta = self.rule.tta
        self.model = self.model.to(self.device).eval()
        # self.model stays the plain network (Grad-CAM reads it); a rule with a kNN bank reads the features too
        self.feature_dim = self.rule.knn.dim if self.rule.knn is not None else 0
        net = WithFeatures(self.model, head_name(self.model, self.spec.num_classes)) if self.feature_dim else self.model
        self.runner = with_tta(net, self.tta)
        self.transform = self.spec.eval_transform()
        self.normalize: Normalize = self.spec.normalizer().to(self.device)
        self._decoders: ThreadPoolExecutor | None = None

    @torch.inference_mode()
    def outputs(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """uint8 NCHW batch (already resized and cropped) -> float32 logits on the CPU, averaged over the rule's
        views, and the penultimate features (None unless the rule has a kNN bank)."""
        out = main_logits(self.runner(self.normalize(batch.to(self.device)))).float().cpu()
        return WithFeatures.split(out, self.feature_dim) if self.feature_dim else (out, None)

    def logits(self, batch: torch.Tensor) -> torch.Tensor:
        return self.outputs(batch)[0]

    def answers(self, batch: torch.Tensor) -> Answers:
        """The rule's answers for a uint8 NCHW batch: classes, calibrated probabilities, unknown and why."""
        return self.rule.decide(*self.outputs(batch))

    def score_files(self, files: list[Path], batch_size: int = 16) -> tuple[np.ndarray, np.ndarray | None, int]:
        """(logits, features or None, images read) of the readable files: what evaluate compares the unknown
        scores on (unreadable files are left out)."""
        logits, features = [], []
        for start in range(0, len(files), batch_size):
            images = [torch.as_tensor(x) for x in self._load_all(files[start:start + batch_size]) if not isinstance(x, str)]
            if images:
                out, feats = self.outputs(torch.stack(images))
                logits.append(out.numpy())
                if feats is not None:
                    features.append(feats.numpy())
        if not logits:
            return np.zeros((0, 0)), None, 0
        return np.concatenate(logits), (np.concatenate(features) if features else None), sum(map(len, logits))

    def topk(self, probs: np.ndarray, k: int) -> list[dict[str, Any]]:
        """[{"label", "index", "prob"}] of one image's calibrated probabilities, most probable first (ties
        in index order)."""
        order = np.argsort(-np.asarray(probs), kind="stable")[: min(k, len(probs))]
        labels = self.spec.labels
        return [{"label": labels[i], "index": int(i), "prob": round(float(probs[i]), 6)} for i in order]

    def predict_files(self, inputs: Iterable[str | Path], topk: int = 5, batch_size: int = 16) -> Iterator[dict[str, Any]]:
        """One result per file, in input order (a folder's files in their sorted place): {"file", "answer",
        "score", "unknown", "topk"}, or {"file", "error"} for a file that cannot be read and for an input
        that names no image."""
        pending: list[Path] = []  # files waiting for a full batch
        for item in inputs:
            files, errors = expand_image_paths([item])
            pending.extend(files)
            if errors:  # missing, no images, or a sub-folder that cannot be listed: after what came before
                yield from self._predict_batches(pending, topk, batch_size)
                pending = []
                yield from ({"file": str(source), "error": message} for source, message in errors)
            while len(pending) >= batch_size:
                yield from self._predict_batch(pending[:batch_size], topk)
                pending = pending[batch_size:]
        yield from self._predict_batches(pending, topk, batch_size)

    def _predict_batches(self, files: list[Path], topk: int, batch_size: int) -> Iterator[dict[str, Any]]:
        for start in range(0, len(files), batch_size):
            yield from self._predict_batch(files[start : start + batch_size], topk)

    def _load(self, path: Path) -> Any:
        """The model's input for one file, or the one-line reason it has none."""
        try:
            # Decode huge JPEGs at reduced size: the model sees resize_size px anyway.
            return self.transform(load_rgb(path, max_side=self.spec.resize_size))
        except (ImageReadError, OSError, ValueError) as exc:
            return str(exc).splitlines()[0]

    def _load_all(self, files: list[Path]) -> list[Any]:
        threads = self.decode_threads or default_num_workers()
        if threads <= 1 or len(files) <= 1:
            return [self._load(path) for path in files]
        if self._decoders is None:
            self._decoders = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="predict-decode")
        return list(self._decoders.map(self._load, files))  # in the order of `files`

    def _predict_batch(self, files: list[Path], topk: int) -> Iterator[dict[str, Any]]:
        images: list[torch.Tensor] = []
        results: list[dict[str, Any]] = []
        for path, loaded in zip(files, self._load_all(files)):
            if isinstance(loaded, str):
                results.append({"file": str(path), "error": loaded})
            else:
                images.append(loaded)
                results.append({"file": str(path)})
        if images:
            answers = self.answers(torch.stack([torch.as_tensor(i) for i in images]))
            row = 0
            for result in results:
                if "error" not in result:
                    result.update(answers.row(row, self.spec.labels))
                    result["topk"] = self.topk(answers.probabilities[row], topk)
                    row += 1
        yield from results
