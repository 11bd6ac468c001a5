"""The exported graph's contract and how to read it: names, the optional imports, checks, a reference run.

An export is one input `images` (float32 NCHW, already resized, cropped and normalised as the spec
says) and one output `logits`. `check_onnx_file` says whether a file is such a classifier for a
spec; `onnx_logits` runs it on ONNX Runtime's CPU provider, the reference the parity check and
the int8 calibration compare against.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from inceptionlab.errors import UserError
from inceptionlab.models.spec import ModelSpec

INPUT_NAME = "images"
OUTPUT_NAME = "logits"
ONNX_EXTRA = "pip install 'inceptionlab[onnx]'"


def import_onnxruntime() -> Any:
    try:
        import onnxruntime  # optional extra (onnx): imported on use, not at start-up
    except ImportError:
        raise UserError(f"onnxruntime is not installed: {ONNX_EXTRA}") from None
    return onnxruntime


def import_onnx() -> Any:
    try:
        import onnx  # optional extra (onnx): imported on use, not at start-up
        import onnxscript  # noqa: F401  (torch.onnx's exporter needs it)
    except ImportError:
        raise UserError(f"onnx/onnxscript are not installed: {ONNX_EXTRA}") from None
    return onnx


def _dims(value_info: Any) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in value_info.type.tensor_type.shape.dim]


def check_onnx_file(path: Path, spec: ModelSpec) -> None:
    """A usable ONNX classifier for this spec, or a one-line error: missing, not ONNX, truncated,
    or a graph whose input/output shapes belong to another architecture or class count."""
    onnx = import_onnx()
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: ONNX file not found; run `inceptionlab export` first")
    try:
        proto = onnx.load(str(path), load_external_data=False)
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise UserError(f"{path}: not a readable ONNX model, or truncated ({type(exc).__name__}); "
                        "re-run `inceptionlab export`") from None
    graph = proto.graph
    if len(graph.input) != 1 or len(graph.output) != 1:
        raise UserError(f"{path}: expected one input and one output, found {len(graph.input)} and "
                        f"{len(graph.output)}; export it with `inceptionlab export`")
    inputs, outputs = _dims(graph.input[0]), _dims(graph.output[0])
    want_in = list(spec.input_shape)
    if inputs[1:] != want_in or outputs[1:] != [spec.num_classes]:
        raise UserError(f"{path}: graph takes {inputs} -> {outputs} but the model ({spec.arch}) takes "
                        f"[batch, {', '.join(map(str, want_in))}] -> [batch, {spec.num_classes}]: it is from "
                        "another model; re-run `inceptionlab export`")


SPEC_KEY = "inceptionlab.spec"  # metadata_props entry holding the model spec (classes, preprocessing, decision rule)


def stamped_spec(model: bytes | Path) -> ModelSpec | None:
    """The model spec stamped into an export's metadata (export._stamp), or None for a graph without one."""
    onnx = import_onnx()
    proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model), load_external_data=False)
    entry = next((p.value for p in proto.metadata_props if p.key == SPEC_KEY), None)
    return ModelSpec.from_dict(json.loads(entry)) if entry else None


def onnx_logits(model: bytes | Path, inputs: np.ndarray, batch: int | None = 16) -> np.ndarray:
    """Logits from ONNX Runtime's CPU provider (the reference runtime: always installed with the extra)."""
    ort = import_onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: the CPU provider's notes would drown the output
    session = ort.InferenceSession(model if isinstance(model, bytes) else str(model), options,
                                   providers=["CPUExecutionProvider"])
    fixed = session.get_inputs()[0].shape[0]
    step = fixed if isinstance(fixed, int) else (batch or len(inputs))
    outputs = [session.run([OUTPUT_NAME], {INPUT_NAME: inputs[start:start + step]})[0]
               for start in range(0, len(inputs), step)]
    return np.concatenate(outputs) if outputs else np.zeros((0, 0), np.float32)
