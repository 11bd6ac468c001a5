"""Export is checked, not assumed: the exported graph against PyTorch on the same real images.

`check_parity` runs both on up to PARITY_IMAGES real pictures (the sample photos first, then a
run's validation images spread over its classes; random inputs only when there are none) and
`compare_logits` judges the difference: the largest error relative to the largest logit within
PARITY_RTOL, and top-1 agreement except where PyTorch's own top-1/top-2 margin is inside that error.
`compare_decisions` then checks the decision rule travelled: the spec stamped into the exported
file, applied to ONNX Runtime's logits, gives the calibrated probabilities and "unknown" answers that
the model's own spec gives PyTorch's (a threshold flip passes only within the probabilities' error).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from inceptionlab.data.io.image_files import sample_image_dir
from inceptionlab.engine.task import main_logits
from inceptionlab.infer.inputs import image_files, load_images, normalize, random_inputs, spread
from inceptionlab.infer.onnx_graph import onnx_logits, stamped_spec
from inceptionlab.infer.source import ModelSource
from inceptionlab.models.spec import ModelSpec

# Parity: fp32 ONNX Runtime (MLAS) and PyTorch (oneDNN) sum in different orders; on Inception v3 at
# 299 px they differ by ~1e-6 of the largest logit. 1e-3 of it is far above that noise and far below
# a real conversion bug (a wrong op, a missing normalisation, a dropped layer: errors of order 1).
PARITY_RTOL = 1e-3
PARITY_IMAGES = 32  # Inception v3 at 299 px: ~5 s for both runtimes on 2 cores


@dataclass
class Parity:
    images: int
    real: bool  # False: no real images were found and random inputs were used
    max_abs: float
    max_rel: float  # max |onnx - torch| / max |torch|
    top1_agree: int
    top1_flips_explained: int  # flips where torch's top-1/top-2 margin is below max_abs
    ok: bool
    rtol: float = PARITY_RTOL
    decision: dict[str, Any] | None = None  # compare_decisions' figures: the rule read back from the file

    @property
    def agreement(self) -> float:
        return self.top1_agree / max(self.images, 1)

    def describe(self) -> str:
        what = f"{self.images} real images" if self.real else f"{self.images} random inputs (no real images found)"
        line = (f"parity on {what}: max abs err {self.max_abs:.2e}, max rel err {self.max_rel:.2e}, "
                f"top-1 agreement {self.agreement:.1%} ({self.top1_agree}/{self.images}) "
                f"[tolerance: rel err <= {self.rtol:g}; top-1 must agree unless within max abs err]")
        if self.decision is not None:
            d = self.decision
            line += (f"; decision rule read back from the file: temperature {d['temperature']:.4g}"
                     + (f", unknown below {d['reject_threshold']:.4f}" if d["reject_threshold"] is not None else "")
                     + f", calibrated probabilities max abs err {d['probabilities_max_abs_err']:.2e}, "
                     f"unknown answers agree {d['unknown_agree']}/{self.images}"
                     + ("" if d["ok"] else f" [FAILED: {d['problem']}]"))
        return line

    def to_dict(self) -> dict[str, Any]:
        return {"images": self.images, "real_images": self.real, "max_abs_err": self.max_abs,
                "max_rel_err": self.max_rel, "top1_agreement": self.agreement, "rtol": self.rtol, "ok": self.ok,
                **({"decision": self.decision} if self.decision is not None else {})}


def compare_logits(reference: np.ndarray, candidate: np.ndarray, real: bool, rtol: float = PARITY_RTOL) -> Parity:
    """Max abs/rel error and top-1 agreement; a top-1 flip only passes when torch's own top-1/top-2
    margin is smaller than the error seen (a near tie that fp32 rounding can legitimately flip)."""
    diff = np.abs(reference.astype(np.float64) - candidate.astype(np.float64))
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = max_abs / max(float(np.abs(reference).max()) if reference.size else 0.0, 1e-12)
    agree = reference.argmax(axis=1) == candidate.argmax(axis=1)
    top2 = np.sort(reference, axis=1)[:, -2:] if reference.shape[1] > 1 else np.zeros((len(reference), 2))
    near_tie = (top2[:, 1] - top2[:, 0]) <= max_abs
    explained = int((~agree & near_tie).sum())
    ok = max_rel <= rtol and bool(np.all(agree | near_tie))
    return Parity(len(reference), real, max_abs, max_rel, int(agree.sum()), explained, ok, rtol)


def compare_decisions(reference: np.ndarray, candidate: np.ndarray, spec: ModelSpec,
                      exported: ModelSpec | None, rtol: float = PARITY_RTOL) -> dict[str, Any]:
    """The exported file's decision rule against the model's: the same rule (temperature, threshold, target,
    TTA, what it was fitted on), and on these inputs calibrated probabilities within `rtol` and the same
    "unknown" answers (a flip passes only where PyTorch's top probability is within that error of the
    threshold)."""
    out: dict[str, Any] = {"temperature": None, "reject_threshold": None, "probabilities_max_abs_err": float("nan"),
                           "unknown_agree": 0, "ok": False, "problem": ""}
    if exported is None:
        out["problem"] = "the exported file carries no model spec"
        return out
    rule, theirs_rule = spec.rule, exported.rule
    out.update(temperature=theirs_rule.temperature, reject_threshold=theirs_rule.threshold)
    if theirs_rule != rule:
        out["problem"] = f"the file's decision rule is {theirs_rule.describe()}; the model's {rule.describe()}"
        return out
    # the graph outputs logits: its runtime answers by the softmax rule (a kNN bank needs features)
    ours, theirs = rule.softmax_only().decide(reference), theirs_rule.softmax_only().decide(candidate)
    error = float(np.abs(ours.probabilities - theirs.probabilities).max()) if len(ours) else 0.0
    agree = (ours.unknown == theirs.unknown)
    if rule.threshold is not None:
        agree |= np.abs(ours.score - rule.threshold) <= error
    out.update(probabilities_max_abs_err=error, unknown_agree=int(agree.sum()))
    out["ok"] = error <= rtol and bool(agree.all())
    if not out["ok"]:
        out["problem"] = f"calibrated probabilities differ by {error:.2e} (tolerance {rtol:g}) or unknown answers flip"
    return out


def torch_logits(model: nn.Module, inputs: np.ndarray, batch: int = 16) -> np.ndarray:
    outputs = []
    with torch.inference_mode():
        for start in range(0, len(inputs), batch):
            outputs.append(main_logits(model(torch.from_numpy(inputs[start:start + batch]))).float().numpy())
    return np.concatenate(outputs) if outputs else np.zeros((0, 0), np.float32)


def parity_inputs(source: ModelSource, folders: list[Path] | None, count: int = PARITY_IMAGES) -> tuple[np.ndarray, bool]:
    """Normalised real images (sample pictures first, then the run's val data spread over classes)."""
    files = image_files(folders, source)
    sample_dir = sample_image_dir().resolve()
    sample = [f for f in files if f.resolve().parent == sample_dir]
    rest = [f for f in files if f.resolve().parent != sample_dir]
    chosen = sample[:count] + spread(rest, count - len(sample[:count]))
    images = load_images(chosen, source.spec)
    if len(images) == 0:
        return random_inputs(4, source.spec.input_shape), False
    return normalize(images, source.spec), True


def check_parity(source: ModelSource, model: bytes | Path, images: list[Path] | None,
                 dynamic_batch: bool = True) -> Parity:
    inputs, real = parity_inputs(source, images)
    reference = torch_logits(source.model, inputs)
    candidate = onnx_logits(model, inputs, batch=16 if dynamic_batch else 1)
    parity = compare_logits(reference, candidate, real)
    if source.spec.input_kind == "image":
        parity.decision = compare_decisions(reference, candidate, source.spec, stamped_spec(model))
        parity.ok = parity.ok and parity.decision["ok"]
    return parity
