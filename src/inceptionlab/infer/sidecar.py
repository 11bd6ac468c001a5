"""`model.onnx.json`, the sidecar beside an export: what the graph is and where it came from.

It carries the model spec (classes, preprocessing), the opset, the checksum of the weights the graph
came from, the parity figures and the package versions. `bench` and `serve` reuse an export only
while that checksum matches the weights they would export now (export.current_export).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from inceptionlab.host import package_versions
from inceptionlab.infer.onnx_graph import INPUT_NAME, OUTPUT_NAME
from inceptionlab.infer.parity import Parity
from inceptionlab.infer.source import ModelSource
from inceptionlab.models.rule import WITHOUT_BANK


def sidecar_path(onnx_path: Path) -> Path:
    return Path(onnx_path).with_name(Path(onnx_path).name + ".json")


def sidecar_metadata(source: ModelSource, path: Path, data: bytes, opset: int, dynamic_batch: bool,
                     parity: Parity) -> dict[str, Any]:
    spec = source.spec
    batch: str | int = "batch" if dynamic_batch else 1
    return {
        "format": "onnx",
        "file": path.name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "opset": opset,
        "dynamic_batch": dynamic_batch,
        "input": {"name": INPUT_NAME, "shape": [batch, *spec.input_shape], "dtype": "float32", "layout": "NCHW"},
        "output": {"name": OUTPUT_NAME, "shape": [batch, spec.num_classes], "dtype": "float32"},
        "preprocessing": {
            "channels": spec.channels, "resize_shorter_side": spec.resize_size, "center_crop": spec.crop_size,
            "interpolation": spec.interpolation, "scale": "pixel / 255", "mean": spec.mean, "std": spec.std,
        },
        "classes": spec.labels,
        "spec": spec.to_dict(),
        # what a runtime of this file alone answers by: the softmax rule (a kNN bank needs the model's features)
        "decision_rule": {"applied_by_the_export": spec.rule.softmax_only().describe(),
                          **({"knn_detector": WITHOUT_BANK} if spec.rule.knn else {})},
        "source": {"label": source.label, "weights": source.weights, "weights_sha256": source.weights_sha256},
        "parity": parity.to_dict(),
        "versions": package_versions(),
        "exported": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def read_sidecar(onnx_path: Path) -> dict[str, Any] | None:
    path = sidecar_path(onnx_path)
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
