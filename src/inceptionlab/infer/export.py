"""ONNX export, checked every time against PyTorch on real images (timm's onnx_export + check idea).

    source = load_source(run_dir=Path("runs/.../20261122-101500"))     # or model="inception_v3"
    result = export_onnx(source)            # RUN_DIR/exports/model.onnx + model.onnx.json

The exported graph is the model in eval mode with its auxiliary head removed (source.py), with one
input and one output (onnx_graph.py). The batch axis is dynamic unless asked otherwise. Nothing is
written until ONNX Runtime has run the new graph on real images and agreed with PyTorch
(parity.py); the file and its sidecar (sidecar.py) are then written atomically (temporary file +
rename), so a failed or interrupted export leaves the previous export in place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from inceptionlab.engine.task import main_logits
from inceptionlab.errors import ProgramError, UserError, summary_of
from inceptionlab.fileio import atomic_write_bytes, atomic_write_json
from inceptionlab.infer.onnx_graph import INPUT_NAME, OUTPUT_NAME, SPEC_KEY, check_onnx_file, import_onnx
from inceptionlab.infer.opsets import DEFAULT_OPSET, MIN_OPSET
from inceptionlab.infer.parity import Parity, check_parity
from inceptionlab.infer.sidecar import read_sidecar, sidecar_metadata, sidecar_path
from inceptionlab.infer.source import ModelSource
from inceptionlab.models.rule import WITHOUT_BANK


@dataclass
class ExportResult:
    path: Path
    sidecar: Path
    parity: Parity
    opset: int
    dynamic_batch: bool
    bytes: int
    seconds: float
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "sidecar": str(self.sidecar), "opset": self.opset,
                "dynamic_batch": self.dynamic_batch, "bytes": self.bytes, "seconds": round(self.seconds, 2),
                "parity": self.parity.to_dict()}


class _Logits(nn.Module):
    """The graph's one output: main logits (a tuple output, e.g. InceptionOutputs, keeps its first)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return main_logits(self.model(images))


def check_opset(opset: int) -> int:
    onnx = import_onnx()
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise UserError(f"--opset {opset}: the exporter writes opsets {MIN_OPSET}..{newest}; use e.g. {DEFAULT_OPSET}")
    return opset


def trace_to_onnx(model: nn.Module, input_shape: tuple[int, ...], opset: int, dynamic_batch: bool) -> Any:
    """torch.onnx (dynamo) export to an in-memory ModelProto; the exporter's chatter goes to stderr."""
    # Batch 2, not 1: torch.export specialises a size-1 dimension to a constant.
    example = torch.zeros(2 if dynamic_batch else 1, *input_shape)
    dynamic = ({0: torch.export.Dim("batch", min=1, max=4096)},) if dynamic_batch else None
    try:
        with contextlib.redirect_stdout(sys.stderr), torch.inference_mode(False), torch.no_grad():
            program = torch.onnx.export(_Logits(model).eval(), (example,), input_names=[INPUT_NAME],
                                        output_names=[OUTPUT_NAME], opset_version=opset,
                                        dynamic_shapes=dynamic, dynamo=True, verbose=False)
    except Exception as exc:  # the exporter's own failure (many types): its traceback is the report
        raise ProgramError(f"torch.onnx could not export this model ({summary_of(exc)})") from exc
    return program.model_proto


def _stamp(proto: Any, source: ModelSource) -> None:
    """Spec (with its decision rule: temperature, reject threshold) and weights checksum inside the ONNX
    file too: the graph describes itself anywhere, and the parity check reads the rule back from it."""
    without_bank = (("inceptionlab.knn_detector", WITHOUT_BANK),) if source.spec.rule.knn else ()
    for key, value in ((SPEC_KEY, json.dumps(source.spec.to_dict())),
                       ("inceptionlab.weights_sha256", source.weights_sha256), *without_bank):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value


def export_onnx(source: ModelSource, opset: int = DEFAULT_OPSET, dynamic_batch: bool = True,
                images: list[Path] | None = None, path: Path | None = None) -> ExportResult:
    """Export, check parity on real images, then write model.onnx + model.onnx.json atomically."""
    onnx = import_onnx()
    check_opset(opset)
    started = time.perf_counter()
    proto = trace_to_onnx(source.model, source.spec.input_shape, opset, dynamic_batch)
    _stamp(proto, source)
    try:
        onnx.checker.check_model(proto)
    except Exception as exc:  # a graph the exporter just wrote: the program's failure, not the user's
        raise ProgramError(f"the exported graph fails onnx.checker ({summary_of(exc)})") from exc
    data = proto.SerializeToString()
    parity = check_parity(source, data, images, dynamic_batch)
    if not parity.ok:
        raise UserError(f"export parity failed, nothing written: {parity.describe()}")
    path = Path(path) if path else source.onnx_file
    atomic_write_bytes(path, data)
    metadata = sidecar_metadata(source, path, data, opset, dynamic_batch, parity)
    sidecar = sidecar_path(path)
    atomic_write_json(sidecar, metadata)
    return ExportResult(path, sidecar, parity, opset, dynamic_batch, len(data), time.perf_counter() - started, metadata)


def current_export(source: ModelSource, path: Path | None = None, dynamic_batch: bool = False) -> Path | None:
    """The existing export when it is valid, was made from exactly these weights (and has a dynamic
    batch axis, when asked), else None."""
    path = Path(path) if path else source.onnx_file
    meta = read_sidecar(path)
    if not path.is_file() or meta is None:
        return None
    if meta.get("source", {}).get("weights_sha256") != source.weights_sha256:
        return None
    if meta.get("spec") != source.spec.to_dict():
        return None  # e.g. `evaluate` fitted a new temperature: the stamped rule is stale
    if dynamic_batch and not meta.get("dynamic_batch"):
        return None
    check_onnx_file(path, source.spec)
    if hashlib.sha256(path.read_bytes()).hexdigest() != meta.get("sha256"):
        return None  # edited or replaced since the export: export again
    return path


def ensure_export(source: ModelSource, images: list[Path] | None = None, log: Any = None) -> Path:
    """The source's ONNX file with a dynamic batch axis (one file for every batch size), exported
    with the parity check unless a current one exists."""
    found = current_export(source, dynamic_batch=True)
    if found is not None:
        return found
    if log:
        log(f"exporting {source.label} to {source.onnx_file} (no current dynamic-batch export of these weights)")
    result = export_onnx(source, images=images)
    if log:
        log(result.parity.describe())
    return result.path
