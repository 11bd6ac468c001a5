"""The model that export, bench, quantize and serve work on: a run directory's, or a pretrained one.

    source = load_source(run_dir=Path("runs/.../20261122-101500"))     # or model="inception_v3"

A `ModelSource` is the module in eval mode with its auxiliary head removed, its spec, and the
checksum of its weights (exports and caches are reused only while it matches), plus where its
exports and bench results live.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from inceptionlab.checkpoint import RunDir
from inceptionlab.errors import UserError
from inceptionlab.models.registry import RANDOM_WEIGHTS, build_model, drop_aux_heads, load_run_model, pretrained_spec
from inceptionlab.models.spec import ModelSpec


@dataclass
class ModelSource:
    """A model to export or benchmark: the module in eval mode, its spec and where it came from."""

    model: nn.Module
    spec: ModelSpec
    label: str  # run directory or model name, for messages and result rows
    weights: str  # "run:<file>", "imagenet", "random" or a state_dict path
    weights_sha256: str  # of the loaded tensors (names, shapes, bytes): names the exact weights
    home: Path  # exports/ and bench/ live here: the run directory, or --out/<name>
    run_dir: Path | None = None

    @property
    def exports(self) -> Path:
        return self.home / "exports" if self.run_dir is not None else self.home

    @property
    def onnx_file(self) -> Path:
        return self.exports / "model.onnx"

    @property
    def cache(self) -> Path:
        """Tuned and compiled artifacts (ORT optimized models, int8 models, engine caches)."""
        return self.exports / "cache"

    @property
    def bench_results(self) -> Path:
        return self.home / "bench" / "results.jsonl"


def state_checksum(model: nn.Module) -> str:
    """sha256 over the state_dict's names, dtypes, shapes and bytes (~0.1 s for Inception v3's 95 MB)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest.hexdigest()


def _drop_aux(model: nn.Module) -> nn.Module:
    """Eval mode already ignores Inception's aux head; removing it keeps its weights out of exports."""
    drop_aux_heads(model)
    return model.eval()


def load_source(run_dir: Path | None = None, model: str | None = None, weights: str | None = None,
                out: Path = Path("runs/exports")) -> ModelSource:
    """The model of a run directory (its model.pt, or `weights`), or a torchvision model with
    `weights` imagenet (default: the torch hub cache), random (seed 0) or a state_dict file."""
    if (run_dir is None) == (model is None):
        raise UserError("give either a run directory or --model NAME (not both)")
    if run_dir is not None:
        return _run_source(Path(run_dir), Path(weights) if weights else None)
    return _model_source(model, weights or "imagenet", Path(out))  # type: ignore[arg-type]


def _run_source(run_dir: Path, weights: Path | None) -> ModelSource:
    spec = ModelSpec.load(RunDir.open(run_dir).spec_file)
    if spec.input_kind != "image":
        raise UserError(f"{run_dir}: a {spec.arch} model takes {spec.input_kind}, not images: ONNX export and bench "
                        "take image classifiers; training already wrote this run's export, a torch.export package "
                        f"that classifies raw text: {Path(run_dir) / 'exports' / 'text'}/ (python classify.py \"some review\")")
    net, spec = load_run_model(run_dir, weights)
    path = weights or RunDir.open(run_dir).weights_for_inference()
    net = _drop_aux(net)
    return ModelSource(net, spec, str(run_dir), f"run:{path}", state_checksum(net), run_dir, run_dir)


def _model_source(name: str, weights: str, out: Path) -> ModelSource:
    spec = pretrained_spec(name)
    built = build_model(name, spec.num_classes, weights)
    if weights == RANDOM_WEIGHTS:
        spec.arch_kwargs = dict(built.arch_kwargs)  # as built: no pretrained-only arguments (transform_input)
    net = _drop_aux(built.model)
    return ModelSource(net, spec, name, weights, state_checksum(net), out / name)
